#include "kv_cache/block_table.h"

namespace attn {

int64_t BlockTable::BlocksNeeded(int64_t new_length) const {
  const int64_t need = BlocksFor(new_length, page_tokens_) - num_blocks();
  return need > 0 ? need : 0;
}

void BlockTable::AddPages(const int32_t *pages, int64_t n) {
  pages_.insert(pages_.end(), pages, pages + n);
}

std::vector<int32_t> BlockTable::Truncate(int64_t new_length) {
  if (new_length < 0) new_length = 0;
  if (new_length >= length_) return {};
  length_ = new_length;
  const int64_t keep = BlocksFor(length_, page_tokens_);
  std::vector<int32_t> dropped(pages_.begin() + keep, pages_.end());
  pages_.resize(static_cast<size_t>(keep));
  return dropped;
}

}  // namespace attn
