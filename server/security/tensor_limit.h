// The per-request tensor element limit (--max-tensor-elements): the sum, over
// every attention.v1.Tensor in a request message (q, k, v of Attend and Extend;
// every step of ExtendBatch), of the product of its shape. Counted from the
// declared shapes before any validation or decoding, so an oversized request
// costs nothing but this walk. Stateless; thread-safe.
#pragma once

#include <cstdint>

#include <google/protobuf/message.h>

#include "attn/common/status.h"

namespace attn::security {

/// Elements declared by every Tensor inside `message` (recursively), saturating
/// at INT64_MAX; a negative dimension counts as 0 (validation rejects it later).
int64_t CountTensorElements(const google::protobuf::Message& message);

/// Ok when `limit` is 0 (unlimited) or the request's elements are within it;
/// else RESOURCE_EXHAUSTED naming the limit and the elements requested.
Status CheckTensorElements(const google::protobuf::Message& message, int64_t limit);

}  // namespace attn::security
