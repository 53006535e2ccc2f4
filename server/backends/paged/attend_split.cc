#include "backends/paged/attend_split.h"

#include <algorithm>

namespace attn {

AttendSplit SplitAttendSteps(const int64_t *tokens, const int64_t *kv_lens, int64_t count,
                             bool prefill_ok, int64_t max_decode_q) {
  AttendSplit s;
  s.items.resize(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i) {
    AttendSplit::Item &it = s.items[i];
    it.prefill = prefill_ok && tokens[i] > max_decode_q;
    if (it.prefill) {
      it.q_row = s.prefill_rows;  // shifted past the decode rows below
      it.entry = s.prefill_entries++;
      it.entries = 1;
      s.prefill_rows += tokens[i];
      s.prefill_max_q = std::max(s.prefill_max_q, tokens[i]);
      s.prefill_max_kv = std::max(s.prefill_max_kv, kv_lens[i]);
    } else {
      it.q_row = s.decode_rows;
      it.entry = s.decode_entries;
      it.entries = (tokens[i] + max_decode_q - 1) / max_decode_q;
      s.decode_entries += it.entries;
      s.decode_rows += tokens[i];
      s.decode_max_q = std::max(s.decode_max_q, std::min(tokens[i], max_decode_q));
      s.decode_max_kv = std::max(s.decode_max_kv, kv_lens[i]);
    }
  }
  for (AttendSplit::Item &it : s.items) {
    if (it.prefill) it.q_row += s.decode_rows;
  }
  return s;
}

}  // namespace attn
