// The shape of a decoder-only Transformer: the `model` block of the config. A family is a
// description of its block (config/model.cc sets each family's defaults; every field below can
// also be written in the model block), never a branch through the layers: the model, the
// parameter layout and the checkpoint mapping read these fields.
#pragma once

#include <cmath>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace strata {

// RoPE's frequency scaling (transformers' rope_scaling / rope_parameters): none, linear
// (positions divided by factor), llama3 (Llama 3.1's banded interpolation) or yarn.
struct RopeScaling {
  std::string type = "none";  // "none" | "linear" | "llama3" | "yarn"
  float factor = 1.0f;
  // llama3: the wavelength bands; llama3 and yarn: the context length trained before scaling.
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
  int original_max_positions = 0;
  // yarn: the ramp's bounds in rotations, and the factor on cos and sin (0: 0.1·ln(factor) + 1).
  float beta_fast = 32.0f, beta_slow = 1.0f;
  float attention_factor = 0.0f;
  bool operator==(const RopeScaling&) const = default;
};

// A mixture of experts in the MLP of some layers (the `moe` object of the model block): each
// token's router logits (fp32, Linear(hidden → experts) without bias) pick top_k of `experts`
// SwiGLU experts of ffn_hidden units each; the MLP's output is their outputs weighted by the
// router's probabilities (softmax over every expert, the top_k renormalised to sum 1 where
// norm_topk_prob: Mixtral; as they are otherwise: Qwen2/3-MoE), plus an optional shared expert
// every token passes through, scaled by a sigmoid gate (Qwen2-MoE). Dropless: every expert takes
// every token routed to it.
//
// Balancing (../shared/reference/moe.md §1, §4), added to the loss with router_aux_loss_coef, over
// each sequence's tokens and averaged over the global batch's sequences, so that neither the
// micro-batch split nor the layout changes it: "pooled" is transformers' load_balancing_loss_func
// (every MoE layer's rows pooled: E·Σ_e f_e·P_e, balanced value top_k), "per_layer" Megatron's
// aux_loss (each layer's E/k·Σ_e f_e·P_e, balanced value 1, summed over the layers). z_loss_coef:
// Megatron's router z-loss, coef·mean over tokens of logsumexp(logits)², summed over the layers.
struct MoeConfig {
  int experts = 0;  // 0: every MLP is dense
  int top_k = 0;
  int ffn_hidden = 0;         // each expert's hidden units (transformers' moe_intermediate_size)
  int shared_ffn_hidden = 0;  // the shared expert's (0: none)
  bool shared_gate = false;   // the shared expert's output times sigmoid(x·w_gate)
  bool norm_topk_prob = true;
  // "softmax" (Mixtral, Qwen-MoE: the top_k of softmax(logits)), or "sigmoid" (DeepSeek-V3: each
  // expert's score sigmoid(logit); the choice by score + a per-expert bias, among the topk_group
  // of n_group expert groups with the highest sum of their two best; gates the chosen scores,
  // renormalised with norm_topk_prob, times routed_scaling_factor). The bias is not trained: with
  // expert_bias_update_rate > 0 it moves once per global batch by that rate towards balance
  // (the auxiliary-loss-free balancing: + rate where an expert took fewer than the mean of its
  // layer's tokens, - rate where more).
  std::string router = "softmax";
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  float expert_bias_update_rate = 0.0f;
  // The MoE layers: every decoder_sparse_step-th ((layer + 1) % step == 0), but mlp_only_layers.
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // Token dropping: 0 (dropless), or each expert takes at most ceil(rows·top_k/experts ·
  // capacity_factor) of the choices of a group of rows — each sequence ("sequence": the layout
  // never changes which), or the micro-batch's rows a rank routes ("micro_batch", Megatron's
  // per-rank capacity before dispatch: it changes with the micro-batch size and context
  // parallelism). drop_policy: keep the most probable choices ("probs") or the first ("position").
  float capacity_factor = 0.0f;
  std::string capacity_scope = "sequence";
  std::string drop_policy = "probs";
  std::string aux_loss = "pooled";  // "pooled" | "per_layer"
  float router_aux_loss_coef = 0.0f;
  float z_loss_coef = 0.0f;
  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  std::string preset;  // "" when given by fields; else the preset's name
  // "gpt2" | "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "smollm3" | "gemma2" | "gemma3" |
  // "olmo2" | "mixtral" | "qwen2_moe" | "qwen3_moe":
  // the defaults of the
  // fields below, and the Hugging Face model_type an export writes.
  std::string family = "gpt2";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, vocab = 0, seq_len = 0;
  // Each attention head's width; 0: hidden / heads (Qwen3 and Gemma set it apart).
  int head_dim = 0;
  bool tied_embeddings = true;  // gpt2 default true, the others false
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // the RoPE families
  float init_std = 0.02f;

  // --- the block, as data ---
  // GPT-2: LayerNorm with biases, biases on every projection, GELU MLP, learned positions.
  // Otherwise: RMSNorm, no biases but qkv_bias, SwiGLU, RoPE.
  bool gpt2_block() const { return family == "gpt2"; }
  bool qkv_bias = false;  // biases on the q, k and v projections only (Qwen2)
  // q/k RMSNorm before RoPE: "none"; "head" (each head over its head_dim values, one gain shared
  // by the query heads and one by the key heads: Qwen3, Gemma 3); or "whole" (all of a token's
  // query values together, and all its key values: OLMo 2).
  std::string qk_norm = "none";
  // Where the norms sit: "pre" (before each sublayer, Llama); "sandwich" (before and after each
  // sublayer, Gemma); "post" (after each sublayer only, OLMo 2).
  std::string norm_placement = "pre";
  float norm_offset = 0.0f;      // every RMSNorm's gain is (norm_offset + w): Gemma's is 1
  std::string mlp_act = "silu";  // the gated MLP's activation: "silu" (SwiGLU), "gelu_tanh"
  bool embed_scale = false;      // the embeddings times sqrt(hidden) (Gemma)
  // The attention scores are scaled by 1/sqrt(query_pre_attn_scalar) (transformers' name and
  // Gemma's setting); 0: by 1/sqrt(head_dim).
  float query_pre_attn_scalar = 0.0f;
  float attn_scale() const {
    // In double, rounded once, as transformers' Python float multiplies the scores.
    return query_pre_attn_scalar > 0 ? float(1.0 / std::sqrt(double(query_pre_attn_scalar))) : 0.0f;
  }
  float rope_local_theta = 0.0f;  // Gemma 3: the sliding layers' RoPE base; 0: rope_theta
  // Gemma 2's soft-caps, cap·tanh(x/cap), of the attention scores and of the final logits; 0: none.
  float attn_logit_softcapping = 0.0f;
  float final_logit_softcapping = 0.0f;
  // Attention over the last `sliding_window` positions (the query's own included) on the layers
  // layer_sliding marks (empty: every layer); 0: full causal attention.
  int sliding_window = 0;
  std::vector<char> layer_sliding;
  // Layers that apply RoPE (empty: every layer; SmolLM3 leaves it out on every fourth).
  std::vector<char> layer_rope;
  RopeScaling rope_scaling;
  MoeConfig moe;

  bool moe_layer(int layer) const {
    if (moe.experts == 0 || (layer + 1) % moe.decoder_sparse_step != 0) return false;
    for (int l : moe.mlp_only_layers) {
      if (l == layer) return false;
    }
    return true;
  }
  int moe_layers() const {
    int n = 0;
    for (int l = 0; l < layers; ++l) n += moe_layer(l);
    return n;
  }
  int hd() const { return head_dim > 0 ? head_dim : heads > 0 ? hidden / heads : 0; }
  bool pre_norm() const { return norm_placement != "post"; }
  bool post_norm() const { return norm_placement != "pre"; }
  bool sliding(int layer) const {
    return sliding_window > 0 && (layer_sliding.empty() || layer_sliding.at(size_t(layer)) != 0);
  }
  bool rope(int layer) const {
    return !gpt2_block() && (layer_rope.empty() || layer_rope.at(size_t(layer)) != 0);
  }
};

// The families, model_config.h's `family`.
const std::vector<std::string>& model_families();

// The model block that describes m (config/model.cc reads it back): the shape, and of the
// block's description the fields that differ from m.family's defaults would need — all of them,
// so that a block read back gives m whatever the defaults become. Checkpoint manifests keep it.
nlohmann::json model_block_json(const ModelConfig& m);

}  // namespace strata
