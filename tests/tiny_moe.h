// Tiny mixture-of-experts model descriptions. A Qwen2-MoE one for tests that size or allocate a
// mixture of experts: four routed experts (top 2) with a gated shared expert, one dense layer
// among the MoE ones, Megatron's per-layer balancing loss and the z-loss.
#pragma once

#include <nlohmann/json.hpp>

namespace strata::test {

// `layers` blocks, block `dense` with a dense MLP.
inline nlohmann::json tiny_qwen2_moe(int layers, int dense) {
  return {{"family", "qwen2_moe"},
          {"layers", layers},
          {"hidden", 32},
          {"heads", 4},
          {"kv_heads", 2},
          {"ffn_hidden", 64},
          {"vocab", 64},
          {"seq_len", 16},
          {"moe",
           {{"experts", 4},
            {"top_k", 2},
            {"ffn_hidden", 16},
            {"shared_ffn_hidden", 32},
            {"mlp_only_layers", {dense}},
            {"aux_loss", "per_layer"},
            {"router_aux_loss_coef", 0.01},
            {"z_loss_coef", 0.001}}}};
}

// A tiny Mixtral of `experts` experts (top 2), two blocks: for configs that only place experts.
inline nlohmann::json tiny_mixtral(int experts) {
  return {{"family", "mixtral"},
          {"layers", 2},
          {"hidden", 32},
          {"heads", 4},
          {"vocab", 64},
          {"seq_len", 16},
          {"moe", {{"experts", experts}, {"top_k", 2}}}};
}

}  // namespace strata::test
