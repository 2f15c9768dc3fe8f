#include "strata/model/model_config.h"

#include <nlohmann/json.hpp>

namespace strata {

const std::vector<std::string>& model_families() {
  static const std::vector<std::string> f = {"gpt2",    "llama",     "mistral",  "qwen2",  "qwen3",
                                             "phi3",    "smollm3",   "gemma2",   "gemma3", "olmo2",
                                             "mixtral", "qwen2_moe", "qwen3_moe"};
  return f;
}

nlohmann::json model_block_json(const ModelConfig& m) {
  nlohmann::json j = {
      {"family", m.family},     {"layers", m.layers},     {"hidden", m.hidden},
      {"heads", m.heads},       {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden},
      {"vocab", m.vocab},       {"seq_len", m.seq_len},   {"tied_embeddings", m.tied_embeddings},
      {"norm_eps", m.norm_eps}, {"init_std", m.init_std}};
  if (m.gpt2_block()) return j;
  j["rope_theta"] = m.rope_theta;
  if (m.head_dim > 0) j["head_dim"] = m.head_dim;
  j["qkv_bias"] = m.qkv_bias;
  j["qk_norm"] = m.qk_norm;
  j["norm_placement"] = m.norm_placement;
  j["norm_offset"] = m.norm_offset;
  j["mlp_act"] = m.mlp_act;
  j["embed_scale"] = m.embed_scale;
  j["query_pre_attn_scalar"] = m.query_pre_attn_scalar;
  j["rope_local_theta"] = m.rope_local_theta;
  j["attn_logit_softcapping"] = m.attn_logit_softcapping;
  j["final_logit_softcapping"] = m.final_logit_softcapping;
  j["sliding_window"] = m.sliding_window;
  if (!m.layer_sliding.empty()) {
    nlohmann::json types = nlohmann::json::array();
    for (char c : m.layer_sliding) types.push_back(c ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (!m.layer_rope.empty()) {
    nlohmann::json rope = nlohmann::json::array();
    for (char c : m.layer_rope) rope.push_back(c ? 1 : 0);
    j["rope_layers"] = rope;
  }
  const MoeConfig& e = m.moe;
  if (e.experts > 0) {
    j["moe"] = {{"experts", e.experts},
                {"top_k", e.top_k},
                {"ffn_hidden", e.ffn_hidden},
                {"shared_ffn_hidden", e.shared_ffn_hidden},
                {"shared_gate", e.shared_gate},
                {"norm_topk_prob", e.norm_topk_prob},
                {"router", e.router},
                {"decoder_sparse_step", e.decoder_sparse_step},
                {"mlp_only_layers", e.mlp_only_layers},
                {"aux_loss", e.aux_loss},
                {"router_aux_loss_coef", e.router_aux_loss_coef},
                {"z_loss_coef", e.z_loss_coef}};
    if (e.router == "sigmoid") {  // absent: the softmax router, which has none of them
      j["moe"]["n_group"] = e.n_group;
      j["moe"]["topk_group"] = e.topk_group;
      j["moe"]["routed_scaling_factor"] = e.routed_scaling_factor;
      j["moe"]["expert_bias_update_rate"] = e.expert_bias_update_rate;
    }
    if (e.capacity_factor > 0) {  // absent: dropless
      j["moe"]["capacity_factor"] = e.capacity_factor;
      j["moe"]["capacity_scope"] = e.capacity_scope;
      j["moe"]["drop_policy"] = e.drop_policy;
    }
  }
  const RopeScaling& r = m.rope_scaling;
  if (r.type != "none") {
    j["rope_scaling"] = {{"type", r.type},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_positions},
                         {"beta_fast", r.beta_fast},
                         {"beta_slow", r.beta_slow},
                         {"attention_factor", r.attention_factor}};
    if (r.original_max_positions == 0) j["rope_scaling"].erase("original_max_position_embeddings");
  }
  return j;
}

}  // namespace strata
