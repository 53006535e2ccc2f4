// How GpuPagedAttention::AttendMany lays one call's sequence steps over its (at most two)
// launches: decode-sized steps (T <= max_decode_q query tokens), and prefill steps when the
// fused paged kernel can take them, each group in one launch, sharing one upload and one
// download. Pure host logic, unit-tested without a device.
//
// Packed q/o rows: the decode launch's items first (in call order), then the prefill launch's
// (in call order), so each launch reads and writes one contiguous range with offsets from 0.
// Decode items with more than max_decode_q tokens (when prefill is not possible, e.g. FP8
// pages) are cut into chunks of at most max_decode_q rows, one decode batch entry per chunk:
// chunk [r0, r1) of a T-token step over S keys attends the first S - T + r1 keys with
// bottom-right alignment, which is exactly those rows' bottom-right causal mask.
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <vector>

namespace attn {

struct AttendSplit {
  struct Item {
    bool prefill = false;  ///< runs in the fused prefill launch (else the decode launch)
    int64_t q_row = 0;     ///< first packed q/o row (over both launches: decode rows first)
    int64_t entry = 0;     ///< first batch entry in its launch (decode: first chunk)
    int64_t entries = 0;   ///< batch entries in its launch (decode: chunks; prefill: 1)
  };
  std::vector<Item> items;     ///< one per step, in call order
  int64_t decode_rows = 0;     ///< packed rows of the decode launch: [0, decode_rows)
  int64_t prefill_rows = 0;    ///< packed rows of the prefill launch: after the decode rows
  int64_t decode_entries = 0;  ///< batch entries (chunks) of the decode launch; 0: no launch
  int64_t prefill_entries = 0; ///< sequences of the prefill launch; 0: no launch
  int64_t decode_max_q = 0;    ///< largest chunk (<= max_decode_q)
  int64_t decode_max_kv = 0;   ///< largest key count of a decode item
  int64_t prefill_max_q = 0;   ///< largest T of a prefill item
  int64_t prefill_max_kv = 0;  ///< largest key count of a prefill item
};

/// Steps i < count have tokens[i] >= 1 query tokens over kv_lens[i] keys. A step goes to the
/// prefill launch when `prefill_ok` and tokens[i] > max_decode_q (>= 1); otherwise to the
/// decode launch, in ceil(tokens[i] / max_decode_q) chunks.
AttendSplit SplitAttendSteps(const int64_t *tokens, const int64_t *kv_lens, int64_t count,
                             bool prefill_ok, int64_t max_decode_q);

}  // namespace attn
