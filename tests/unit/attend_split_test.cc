// SplitAttendSteps (server/backends/paged/attend_split.h): how one GPU AttendMany call lays its steps
// over the decode launch and the fused paged prefill launch. No device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/paged/attend_split.h"

namespace attn {
namespace {

constexpr int64_t kMaxDecodeQ = 64;

/// Invariants of any split: rows are packed decode-first and cover [0, total) exactly once,
/// entries of each launch are consecutive, maxima are the maxima of the items in that launch.
void ExpectConsistent(const std::vector<int64_t> &t, const std::vector<int64_t> &kv,
                      const AttendSplit &s) {
  ASSERT_EQ(s.items.size(), t.size());
  int64_t total = 0, dec_row = 0, pre_row = 0, dec_entry = 0, pre_entry = 0;
  int64_t dmq = 0, dmk = 0, pmq = 0, pmk = 0;
  for (size_t i = 0; i < t.size(); ++i) total += t[i];
  EXPECT_EQ(s.decode_rows + s.prefill_rows, total);
  for (size_t i = 0; i < t.size(); ++i) {
    const AttendSplit::Item &it = s.items[i];
    if (it.prefill) {
      EXPECT_EQ(it.q_row, s.decode_rows + pre_row) << i;
      EXPECT_EQ(it.entry, pre_entry) << i;
      EXPECT_EQ(it.entries, 1) << i;
      pre_row += t[i];
      pre_entry += 1;
      pmq = std::max(pmq, t[i]);
      pmk = std::max(pmk, kv[i]);
    } else {
      EXPECT_EQ(it.q_row, dec_row) << i;
      EXPECT_EQ(it.entry, dec_entry) << i;
      EXPECT_EQ(it.entries, (t[i] + kMaxDecodeQ - 1) / kMaxDecodeQ) << i;
      dec_row += t[i];
      dec_entry += it.entries;
      dmq = std::max(dmq, std::min(t[i], kMaxDecodeQ));
      dmk = std::max(dmk, kv[i]);
    }
  }
  EXPECT_EQ(s.decode_rows, dec_row);
  EXPECT_EQ(s.prefill_rows, pre_row);
  EXPECT_EQ(s.decode_entries, dec_entry);
  EXPECT_EQ(s.prefill_entries, pre_entry);
  EXPECT_EQ(s.decode_max_q, dmq);
  EXPECT_EQ(s.decode_max_kv, dmk);
  EXPECT_EQ(s.prefill_max_q, pmq);
  EXPECT_EQ(s.prefill_max_kv, pmk);
}

TEST(AttendSplit, PrefillStepsGoToTheFusedLaunchDecodeFirst) {
  // Decode (T=1), a speculative step (T=5), exactly the decode limit (64: decode), prefills of
  // 65 and 1000 tokens over cached prefixes, interleaved in call order.
  const std::vector<int64_t> t = {1, 1000, 5, 65, 64, 1};
  const std::vector<int64_t> kv = {500, 1200, 70, 65, 4096, 3};
  const AttendSplit s = SplitAttendSteps(t.data(), kv.data(), 6, true, kMaxDecodeQ);
  ExpectConsistent(t, kv, s);
  EXPECT_FALSE(s.items[0].prefill);
  EXPECT_TRUE(s.items[1].prefill);
  EXPECT_FALSE(s.items[2].prefill);
  EXPECT_TRUE(s.items[3].prefill);
  EXPECT_FALSE(s.items[4].prefill);
  EXPECT_EQ(s.decode_rows, 1 + 5 + 64 + 1);
  EXPECT_EQ(s.decode_entries, 4);  // one chunk each
  EXPECT_EQ(s.prefill_entries, 2);
  EXPECT_EQ(s.items[1].q_row, 71);         // first prefill row follows the decode rows
  EXPECT_EQ(s.items[3].q_row, 71 + 1000);
  EXPECT_EQ(s.items[5].q_row, 70);
  EXPECT_EQ(s.prefill_max_q, 1000);
  EXPECT_EQ(s.prefill_max_kv, 1200);
  EXPECT_EQ(s.decode_max_q, 64);
  EXPECT_EQ(s.decode_max_kv, 4096);
}

TEST(AttendSplit, WithoutPrefillLongStepsAreChunked) {
  // FP8 pages (prefill_ok false): the old layout, one decode launch of 64-row chunks.
  const std::vector<int64_t> t = {100, 1, 128, 129};
  const std::vector<int64_t> kv = {100, 9, 300, 129};
  const AttendSplit s = SplitAttendSteps(t.data(), kv.data(), 4, false, kMaxDecodeQ);
  ExpectConsistent(t, kv, s);
  EXPECT_EQ(s.prefill_entries, 0);
  EXPECT_EQ(s.prefill_rows, 0);
  EXPECT_EQ(s.decode_entries, 2 + 1 + 2 + 3);
  EXPECT_EQ(s.items[3].entry, 5);
  EXPECT_EQ(s.items[2].q_row, 101);
}

TEST(AttendSplit, OnlyPrefillOrOnlyDecode) {
  const std::vector<int64_t> t = {300, 4096};
  const std::vector<int64_t> kv = {300, 5000};
  AttendSplit s = SplitAttendSteps(t.data(), kv.data(), 2, true, kMaxDecodeQ);
  ExpectConsistent(t, kv, s);
  EXPECT_EQ(s.decode_entries, 0);
  EXPECT_EQ(s.decode_rows, 0);
  EXPECT_EQ(s.items[0].q_row, 0);
  EXPECT_EQ(s.items[1].q_row, 300);
  const std::vector<int64_t> d = {1, 1, 1};
  const std::vector<int64_t> dkv = {10, 20, 30};
  s = SplitAttendSteps(d.data(), dkv.data(), 3, true, kMaxDecodeQ);
  ExpectConsistent(d, dkv, s);
  EXPECT_EQ(s.prefill_entries, 0);
  EXPECT_EQ(s.decode_entries, 3);
  s = SplitAttendSteps(nullptr, nullptr, 0, true, kMaxDecodeQ);
  EXPECT_TRUE(s.items.empty());
  EXPECT_EQ(s.decode_entries + s.prefill_entries, 0);
}

}  // namespace
}  // namespace attn
