#include "loadgen/session_requests.h"

#include <utility>
#include <vector>

#include "loadgen/dtype_codec.h"
#include "loadgen/random_normal.h"

namespace attn::loadgen {

namespace av1 = attention::v1;

namespace {

void SetTensor(av1::Tensor* t, av1::DType dtype, std::vector<int64_t> shape, std::string bytes) {
  t->set_dtype(dtype);
  for (int64_t e : shape) t->add_shape(e);
  t->set_data(std::move(bytes));
}

}  // namespace

std::string TokenBytes(const TokenKeyFn& key, int layer, int which, int64_t first, int64_t count,
                       int64_t width, av1::DType dtype) {
  std::string bytes;
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t p = first; p < first + count; ++p) {
    NormalGenerator g(SplitMix64(key(p) ^ (static_cast<uint64_t>(layer) * 3 + which + 1) *
                                              0x9E3779B97F4A7C15ull));
    g.Fill(row.data(), width);
    EncodeValues(row.data(), width, dtype, &bytes);
  }
  return bytes;
}

void BuildExtend(const SessionShape& s, const std::string& id, int layer, int64_t position,
                 int64_t t, const TokenKeyFn& key, av1::ExtendRequest* r) {
  r->Clear();
  r->set_sequence_id(id);
  r->set_layer(layer);
  r->set_position(position);
  SetTensor(r->mutable_q(), s.dtype, {t, s.n, s.h},
            TokenBytes(key, layer, 0, position, t, s.n * s.h, s.dtype));
  SetTensor(r->mutable_k(), s.dtype, {t, s.k, s.h},
            TokenBytes(key, layer, 1, position, t, s.k * s.h, s.dtype));
  SetTensor(r->mutable_v(), s.dtype, {t, s.k, s.h},
            TokenBytes(key, layer, 2, position, t, s.k * s.h, s.dtype));
}

}  // namespace attn::loadgen
