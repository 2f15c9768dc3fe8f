// Counter-based random numbers (Philox4x32-10). A stream is keyed by (seed, name); element i of
// that stream depends on nothing else, so any shard of a tensor can generate exactly its slice.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace strata {

// Philox4x32 with 10 rounds: 128-bit counter, 64-bit key -> four 32-bit outputs.
std::array<uint32_t, 4> philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key);

// A 64-bit key from a seed and a name (FNV-1a of the name, mixed with the seed by splitmix64).
uint64_t rng_key(uint64_t seed, std::string_view name);

// Element `index` of the stream `key`: uniform in (0, 1) and standard normal.
float rng_uniform(uint64_t key, uint64_t index);
float rng_normal(uint64_t key, uint64_t index);

// Fills out[i] = mean + std * normal(key, offset + i) for i in [0, n).
void rng_fill_normal(float* out, uint64_t key, uint64_t offset, uint64_t n, float mean, float std);

}  // namespace strata
