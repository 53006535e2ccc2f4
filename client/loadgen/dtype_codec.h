// Element encodings used on the wire (attention.v1 Tensor): IEEE binary16, bfloat16, binary32.
// Written for the load generator independently of the server's code. Pure functions,
// thread-safe. Narrowing rounds to nearest, ties to even; NaN stays NaN; overflow goes to ±inf.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"

namespace attn::loadgen {

/// float -> IEEE binary16 bits (round to nearest even, subnormals kept, overflow -> ±inf).
uint16_t EncodeFp16(float value);
/// IEEE binary16 bits -> float (exact).
float DecodeFp16(uint16_t bits);
/// float -> bfloat16 bits (round to nearest even; NaN stays a quiet NaN).
uint16_t EncodeBf16(float value);
/// bfloat16 bits -> float (exact).
float DecodeBf16(uint16_t bits);

/// Bytes per element of `dtype` (FLOAT32 4, FLOAT16/BFLOAT16 2, FLOAT8_E4M3 1), 0 if unknown.
int DTypeSize(attention::v1::DType dtype);

/// Parses "fp32"/"float32", "fp16"/"float16", "bf16"/"bfloat16". Returns false if unknown.
bool ParseDType(const std::string& name, attention::v1::DType* dtype);

/// Short name: "fp32", "fp16", "bf16", "fp8_e4m3" or "unspecified".
std::string DTypeName(attention::v1::DType dtype);

/// Appends `values` encoded as `dtype` (FLOAT32, FLOAT16 or BFLOAT16), little-endian, to `out`.
void EncodeValues(const float* values, int64_t count, attention::v1::DType dtype, std::string* out);

/// Decodes `bytes` of `dtype` (FLOAT32, FLOAT16 or BFLOAT16) into doubles (exact).
/// Returns false if the dtype is not one of those or the size is not a whole number of elements.
bool DecodeValues(const std::string& bytes, attention::v1::DType dtype, std::vector<double>* out);

}  // namespace attn::loadgen
