// A 4-block model small enough for bit-for-bit comparisons, and a batch of token ids for it
// (every fifth or seventh target ignored), shared by the model tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/rng.h"
#include "strata/model/param_spec.h"

namespace strata::test {

inline ModelConfig tiny(const std::string& family) {
  ModelConfig m;
  m.family = family;
  m.layers = 4, m.hidden = 32, m.heads = 4, m.vocab = 96, m.seq_len = 16;
  m.kv_heads = family == "gpt2" ? 4 : 2;
  m.ffn_hidden = family == "gpt2" ? 128 : 64;
  m.tied_embeddings = family == "gpt2";
  return m;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

// B sequences of m.seq_len tokens drawn under (seed, stream); targets at i % skip == skip_at
// are ignored (-1).
inline Batch batch(const ModelConfig& m, int B, uint64_t seed, const char* stream, int skip,
                   int skip_at) {
  Batch b;
  const uint64_t key = rng_key(seed, stream);
  for (int i = 0; i < B * m.seq_len; ++i) {
    b.inputs.push_back(int32_t(rng_uniform(key, uint64_t(2 * i)) * float(m.vocab)) % m.vocab);
    b.targets.push_back(i % skip == skip_at
                            ? -1
                            : int32_t(rng_uniform(key, uint64_t(2 * i + 1)) * float(m.vocab)) %
                                  m.vocab);
  }
  return b;
}

}  // namespace strata::test
