// The two golden cases shared by the fixture generator (init/golden_init.cc) and the test: a tiny
// GPT-2 and a tiny Llama, a fixed batch, and AdamW with clipping.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/core/rng.h"

namespace strata::golden {

constexpr int kBatch = 2;
constexpr int kSteps = 10;

inline nlohmann::json config(const std::string& preset, bool bf16) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kBatch},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 0},
      {"optimizer",
       {{"type", "AdamW"},
        {"params", {{"lr", 1e-2}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
      {"model", {{"preset", preset}}},
      {"train", {{"seed", 1234}}}};
  if (bf16) j["bf16"] = {{"enabled", true}};
  return j;
}

// tokens (kBatch, T+1): inputs are [:, :-1], targets [:, 1:].
inline std::vector<int32_t> tokens(int T, int vocab) {
  std::vector<int32_t> t(size_t(kBatch) * (T + 1));
  const uint64_t key = rng_key(1234, "golden.tokens");
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = int32_t(rng_uniform(key, i) * float(vocab)) % vocab;
  }
  return t;
}

inline void split(const std::vector<int32_t>& tok, int T, std::vector<int32_t>& inputs,
                  std::vector<int32_t>& targets) {
  inputs.clear(), targets.clear();
  for (int b = 0; b < kBatch; ++b) {
    for (int t = 0; t < T; ++t) {
      inputs.push_back(tok[size_t(b * (T + 1) + t)]);
      targets.push_back(tok[size_t(b * (T + 1) + t + 1)]);
    }
  }
}

}  // namespace strata::golden
