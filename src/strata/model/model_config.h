// The shape of a decoder-only Transformer: the `model` block of the config.
#pragma once

#include <string>

namespace strata {

struct ModelConfig {
  std::string preset;           // "" when given by fields; else the preset's name
  std::string family = "gpt2";  // "gpt2" | "llama"
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, vocab = 0, seq_len = 0;
  bool tied_embeddings = true;  // gpt2 default true, llama default false
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // llama only
  float init_std = 0.02f;
};

}  // namespace strata
