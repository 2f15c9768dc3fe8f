// Helpers of the MPI tests: deterministic per-rank inputs (so every rank can compute the exact
// reference itself), buffers of any dtype, and the tolerance of a sum in a wire dtype.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/core/dtype.h"

namespace strata::comm::testing {

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's element i, in [-1, 1), rounded to dtype t (what a buffer of t holds).
inline float input(int r, size_t i, DType t, uint64_t salt = 0) {
  const float v =
      float(mix(i * 1315423911ull + uint64_t(r) * 2654435761ull + salt) >> 40) / float(1 << 23) -
      1.0f;
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (t == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// n elements of dtype t, as raw bytes.
struct TypedBuffer {
  DType t;
  std::vector<char> bytes;
  TypedBuffer(DType type, size_t n) : t(type), bytes(n * dtype_size(type)) {}
  void* data() { return bytes.data(); }
  size_t size() const { return bytes.size() / dtype_size(t); }
  void set(size_t i, float v) {
    if (t == DType::F32) {
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(v).bits : f32_to_f16(v).bits;
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  float get(size_t i) const {
    if (t == DType::F32) {
      float v;
      std::memcpy(&v, &bytes[i * 4], 4);
      return v;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return t == DType::BF16 ? bf16_to_f32(bf16{h}) : f16_to_f32(f16{h});
  }
};

// Unit roundoff of a dtype.
inline double unit_roundoff(DType t) {
  return t == DType::F32    ? std::ldexp(1.0, -24)
         : t == DType::BF16 ? std::ldexp(1.0, -8)
                            : std::ldexp(1.0, -11);
}

// Bound on |computed - exact| for a sum of P terms whose absolute values add up to abs_sum,
// converted into wire, summed there in any order, and stored back in dtype.
inline double sum_tolerance(int P, double abs_sum, DType dtype, DType wire) {
  const double u = std::max(unit_roundoff(dtype), unit_roundoff(wire));
  return (P + 2) * u * abs_sum * 1.01 + (P + 2) * std::ldexp(1.0, -24);
}

// Whether every rank of MPI_COMM_WORLD holds the same bytes.
inline bool same_on_all_ranks(const void* p, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
  uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

}  // namespace strata::comm::testing
