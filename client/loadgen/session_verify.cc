#include "loadgen/session_verify.h"

#include <cmath>
#include <vector>

#include "loadgen/dtype_codec.h"
#include "loadgen/oracle.h"

namespace attn::loadgen {

namespace av1 = attention::v1;

Comparison VerifyExtend(const SessionShape& s, int layer, int64_t position, int64_t t,
                        const TokenKeyFn& key, const av1::ExtendResponse& response,
                        double tolerance) {
  const int64_t len = position + t;
  std::vector<double> q, k, v, o, ref, lse;
  DecodeValues(TokenBytes(key, layer, 0, position, t, s.n * s.h, s.dtype), s.dtype, &q);
  DecodeValues(TokenBytes(key, layer, 1, 0, len, s.k * s.h, s.dtype), s.dtype, &k);
  DecodeValues(TokenBytes(key, layer, 2, 0, len, s.k * s.h, s.dtype), s.dtype, &v);
  Comparison c;
  if (response.o().dtype() != s.dtype || !DecodeValues(response.o().data(), s.dtype, &o) ||
      o.size() != q.size()) {
    c.pass = false;
    c.rel_error = INFINITY;
    c.detail = "o has the wrong dtype or size";
    return c;
  }
  if (response.length() != len) {
    c.pass = false;
    c.detail = "length " + std::to_string(response.length()) + ", expected " + std::to_string(len);
    return c;
  }
  OracleProblem p;
  p.q_len = t;
  p.kv_len = len;
  p.heads = s.n;
  p.kv_heads = s.k;
  p.head_dim = s.h;
  p.causal = Causal::kBottomRight;
  ReferenceAttention(p, q, k, v, &ref, &lse);
  return CompareOutputs(o, ref, s.h, ResolveTolerance(tolerance, s.dtype));
}

}  // namespace attn::loadgen
