// Element types: fp32, bf16, fp16 (and int32 for token ids in typed views, never converted).
// Conversions round to nearest even and keep NaN a NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata {

enum class DType : uint8_t { F32, BF16, F16, I32 };

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

constexpr size_t dtype_size(DType t) {
  return t == DType::F32 || t == DType::I32 ? 4 : 2;
}
const char* dtype_name(DType t);  // "fp32" | "bf16" | "fp16" | "int32"
// Accepts DeepSpeed's spellings: fp32/float32/float, bf16/bfloat16, fp16/float16/half.
// Throws InputError naming `what` (the key being parsed) otherwise.
DType parse_dtype(std::string_view s, std::string_view what);

inline float bf16_to_f32(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

float f16_to_f32(f16 h);
f16 f32_to_f16(float f);

// Converts n elements between any two dtypes (same dtype is a copy). OpenMP-parallel.
void convert(void* dst, DType dst_type, const void* src, DType src_type, size_t n);

template <typename T>
inline float to_f32(T v);
template <>
inline float to_f32(float v) {
  return v;
}
template <>
inline float to_f32(bf16 v) {
  return bf16_to_f32(v);
}
template <>
inline float to_f32(f16 v) {
  return f16_to_f32(v);
}

template <typename T>
inline T from_f32(float v);
template <>
inline float from_f32(float v) {
  return v;
}
template <>
inline bf16 from_f32(float v) {
  return f32_to_bf16(v);
}
template <>
inline f16 from_f32(float v) {
  return f32_to_f16(v);
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}

}  // namespace strata
