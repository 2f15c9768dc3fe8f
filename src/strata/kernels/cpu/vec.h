// Scalar helpers written so that GCC vectorises the loops that call them (no branches, no
// library calls): loads/stores between the storage types and fp32, exp and sigmoid.
// Conversions are bit-identical to core/dtype.h (round to nearest even, NaN stays NaN);
// tests/kernels/vec_test.cc checks that.
#pragma once

#include <bit>
#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// All-ones when c, else zero: a select the vectoriser turns into a blend.
inline uint32_t select_u32(bool c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}

// Float select through integer masks: GCC will not if-convert float ternaries here.
inline float select_f32(bool c, float a, float b) {
  return std::bit_cast<float>(
      select_u32(c, std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)));
}

inline float load(float v) {
  return v;
}
inline float load(bf16 v) {
  return std::bit_cast<float>(uint32_t(v.bits) << 16);
}
// Exact for every half, subnormals included: the 15 magnitude bits placed as a float's
// exponent/mantissa and rebiased by 2^112; Inf/NaN then get an all-ones exponent.
inline float load(f16 v) {
  float f = std::bit_cast<float>(uint32_t(v.bits & 0x7fffu) << 13) * 0x1p112f;
  uint32_t u = std::bit_cast<uint32_t>(f) | select_u32(f >= 65536.0f, 0x7f800000u, 0u);
  return std::bit_cast<float>(u | (uint32_t(v.bits & 0x8000u) << 16));
}

template <typename S>
inline S store(float x);
template <>
inline float store<float>(float x) {
  return x;
}
template <>
inline bf16 store<bf16>(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return bf16{uint16_t(select_u32((u & 0x7fffffffu) > 0x7f800000u, (u >> 16) | 0x40u, rounded))};
}
// Subnormal results: adding 0.5 aligns the 2^-24 unit to the float's last mantissa bit, so the
// FPU's own round-to-nearest-even does the rounding. Normal results: integer rounding on bit 13
// (a carry into the exponent gives Inf exactly at 65520).
template <>
inline f16 store<f16>(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  uint32_t r = select_u32(a < 0x38800000u, sub, normal);
  r = select_u32(a >= 0x47800000u, select_u32(a > 0x7f800000u, 0x7e00u, 0x7c00u), r);
  return f16{uint16_t(r | sign)};
}

// e^x with relative error below 2e-7 (Cephes expf polynomial on x - n·ln2, |x - n·ln2| ≤ ln2/2).
// Returns 0 below -87.3 (no subnormals), the largest float above 88.37, NaN for NaN.
inline float exp_approx(float x) {
  float xc = select_f32(x > 88.37f, 88.37f, x);  // comparisons with NaN are false: NaN stays
  xc = select_f32(xc < -87.3f, -87.3f, xc);
  // Round to nearest through the 1.5·2^23 trick (vectorises where nearbyint may not); the low
  // bits of t then hold n as an integer, which also avoids a float-to-int conversion of NaN.
  float t = xc * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4b400000u + 127u) << 23);
  float y = p * scale;
  return select_f32(x < -87.3f, 0.0f, y);
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + exp_approx(-x));
}

}  // namespace strata::kernels
