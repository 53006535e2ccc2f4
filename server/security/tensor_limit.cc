#include "security/tensor_limit.h"

#include <google/protobuf/descriptor.h>

#include <limits>
#include <string>
#include <vector>

namespace attn::security {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr char kTensorType[] = "attention.v1.Tensor";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t SaturatingAdd(int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; }

int64_t TensorElements(const Message& t) {
  const FieldDescriptor* shape = t.GetDescriptor()->FindFieldByName("shape");
  if (shape == nullptr) return 0;
  const Reflection* r = t.GetReflection();
  const int rank = r->FieldSize(t, shape);
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = r->GetRepeatedInt64(t, shape, i);
    if (d <= 0) return 0;
    n = n > kMax / d ? kMax : n * d;
  }
  return n;
}

int64_t Count(const Message& m, int depth) {
  if (m.GetDescriptor()->full_name() == kTensorType) return TensorElements(m);
  if (depth > 32) return 0;  // our messages nest a few levels; protobuf caps parsing at 100
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);  // only fields that are set
  int64_t total = 0;
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      const int size = r->FieldSize(m, f);
      for (int i = 0; i < size; ++i) {
        total = SaturatingAdd(total, Count(r->GetRepeatedMessage(m, f, i), depth + 1));
      }
    } else {
      total = SaturatingAdd(total, Count(r->GetMessage(m, f), depth + 1));
    }
  }
  return total;
}

}  // namespace

int64_t CountTensorElements(const Message& message) { return Count(message, 0); }

Status CheckTensorElements(const Message& message, int64_t limit) {
  if (limit <= 0) return Status::Ok();
  const int64_t n = CountTensorElements(message);
  if (n <= limit) return Status::Ok();
  return ResourceExhausted("request declares " + std::to_string(n) +
                           " tensor elements (sum over its tensors' shapes), over the limit of " +
                           std::to_string(limit) + " per request (--max-tensor-elements)");
}

}  // namespace attn::security
