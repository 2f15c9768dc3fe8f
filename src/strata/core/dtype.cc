#include "strata/core/dtype.h"

#include <string>

#include "strata/core/check.h"

namespace strata {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::I32:
      return "int32";
  }
  return "?";
}

DType parse_dtype(std::string_view s, std::string_view what) {
  if (s == "fp32" || s == "float32" || s == "float" || s == "fp") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "float16" || s == "half") return DType::F16;
  STRATA_INPUT_FAIL(what, ": unknown data type \"", std::string(s),
                    "\"; allowed: \"fp32\", \"bf16\", \"fp16\"");
}

float f16_to_f32(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | uint32_t(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};   // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to inf (>= 65520)
  if (a < 0x38800000u) {                                       // below smallest normal 2^-14
    if (a < 0x33000000u) return f16{sign};                     // below half the smallest subnormal
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(a >> 23);  // 14 + (113 - exp) ... value = man * 2^(exp-150)
    // result units of 2^-24: man * 2^(exp-150+24) = man >> (126 - exp)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16{uint16_t(sign | q)};
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even on bit 13
  return f16{uint16_t(sign | ((r - 0x38000000u) >> 13))};
}

namespace {
template <typename D, typename S>
void convert_typed(D* dst, const S* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = from_f32<D>(to_f32(src[i]));
}
template <typename D>
void convert_from(D* dst, const void* src, DType st, size_t n) {
  switch (st) {
    case DType::F32:
      return convert_typed(dst, static_cast<const float*>(src), n);
    case DType::BF16:
      return convert_typed(dst, static_cast<const bf16*>(src), n);
    case DType::F16:
      return convert_typed(dst, static_cast<const f16*>(src), n);
    case DType::I32:
      break;
  }
  STRATA_FAIL("int32 elements are not converted to floating point");
}
}  // namespace

void convert(void* dst, DType dt, const void* src, DType st, size_t n) {
  if (dt == st) {
    std::memcpy(dst, src, n * dtype_size(dt));
    return;
  }
  switch (dt) {
    case DType::F32:
      return convert_from(static_cast<float*>(dst), src, st, n);
    case DType::BF16:
      return convert_from(static_cast<bf16*>(dst), src, st, n);
    case DType::F16:
      return convert_from(static_cast<f16*>(dst), src, st, n);
    case DType::I32:
      break;
  }
  STRATA_FAIL("floating-point elements are not converted to int32");
}

}  // namespace strata
