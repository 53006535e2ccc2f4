// The block table of one (sequence, layer) (DESIGN.md §7): logical block i,
// tokens [i*page_tokens, (i+1)*page_tokens), lives in page pages()[i] of the
// layer's sub-pool. The table holds exactly ceil(length / page_tokens) pages,
// so a layer wastes at most one partial page. Pure bookkeeping: it never
// touches page memory or reference counts. Thread-safety: none; the owning
// sequence's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attn {

class BlockTable {
 public:
  explicit BlockTable(int32_t page_tokens = 16) : page_tokens_(page_tokens) {}

  /// Pages needed to hold `tokens` tokens.
  static int64_t BlocksFor(int64_t tokens, int32_t page_tokens) {
    return tokens <= 0 ? 0 : (tokens + page_tokens - 1) / page_tokens;
  }

  int64_t length() const { return length_; }
  int64_t num_blocks() const { return static_cast<int64_t>(pages_.size()); }
  const std::vector<int32_t> &pages() const { return pages_; }
  int32_t page_tokens() const { return page_tokens_; }
  /// Pages to add before the table can hold `new_length` tokens (0 when it
  /// already can).
  int64_t BlocksNeeded(int64_t new_length) const;
  /// True when the last page is partly filled (an append writes into it).
  bool LastPagePartial() const { return length_ % page_tokens_ != 0; }
  /// Tokens in the last page (0 when the table is empty or the last page is
  /// full).
  int64_t LastPageTokens() const { return length_ % page_tokens_; }

  /// Appends page ids (blocks num_blocks() .. num_blocks()+n-1).
  void AddPages(const int32_t *pages, int64_t n);
  /// Replaces the last page (after a copy-on-write of a shared partial page).
  void ReplaceLast(int32_t page) { pages_.back() = page; }
  /// Sets the length; the table must already hold BlocksFor(length) pages.
  void SetLength(int64_t length) { length_ = length; }
  /// Cuts the layer back to min(length, new_length) tokens and returns the
  /// pages no longer needed (in block order) for the caller to release.
  std::vector<int32_t> Truncate(int64_t new_length);

 private:
  int32_t page_tokens_;
  int64_t length_ = 0;
  std::vector<int32_t> pages_;
};

}  // namespace attn
