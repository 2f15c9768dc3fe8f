#include "strata/core/rng.h"

#include <cmath>

namespace strata {

std::array<uint32_t, 4> philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = uint32_t(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0, k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in (0, 1): 24 random bits, offset by half a step so 0 never occurs.
float to_unit(uint32_t u) {
  return (float(u >> 8) + 0.5f) * (1.0f / 16777216.0f);
}
}  // namespace

uint64_t rng_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return splitmix64(h ^ splitmix64(seed));
}

float rng_uniform(uint64_t key, uint64_t index) {
  return to_unit(philox4x32(index, 0, key)[0]);
}

// Elements 2k and 2k+1 are the two Box-Muller outputs (r·cos θ, r·sin θ) of counter k, so a
// pair costs one Philox call, one log and one sincos.
float rng_normal(uint64_t key, uint64_t index) {
  auto r = philox4x32(index / 2, 1, key);  // counter_hi=1: a stream separate from rng_uniform
  float radius = std::sqrt(-2.0f * std::log(to_unit(r[0])));
  float theta = 6.2831853071795864f * to_unit(r[1]);
  return radius * (index % 2 == 0 ? std::cos(theta) : std::sin(theta));
}

void rng_fill_normal(float* out, uint64_t key, uint64_t offset, uint64_t n, float mean, float std) {
  if (n == 0) return;
  // A ragged first element (odd offset) and last element; full pairs in between.
  uint64_t i = 0;
  if (offset % 2 == 1) out[i++] = mean + std * rng_normal(key, offset);
  const uint64_t pairs = (n - i) / 2;
#pragma omp parallel for schedule(static) if (pairs > 8192)
  for (uint64_t k = 0; k < pairs; ++k) {
    const uint64_t idx = offset + i + 2 * k;  // even
    auto r = philox4x32(idx / 2, 1, key);
    float radius = std::sqrt(-2.0f * std::log(to_unit(r[0])));
    float theta = 6.2831853071795864f * to_unit(r[1]);
    const float z0 = radius * std::cos(theta), z1 = radius * std::sin(theta);
    out[i + 2 * k] = mean + std * z0;
    out[i + 2 * k + 1] = mean + std * z1;
  }
  i += 2 * pairs;
  if (i < n) out[i] = mean + std * rng_normal(key, offset + i);
}

}  // namespace strata
