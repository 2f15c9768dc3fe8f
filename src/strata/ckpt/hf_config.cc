// config.json of a Hugging Face model: each family's keys read into the block's description
// (model/model_config.h) and written back, as transformers saves them.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "strata/ckpt/hf.h"
#include "strata/core/check.h"

namespace strata::ckpt {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The float closest to f's shortest decimal spelling, so that config.json reads 1e-05, not
// 9.999999747378752e-06, and reads back as the same float.
double decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::stod(std::string(buf, r.ptr));
}

const char* torch_dtype(DType t) {
  return t == DType::F32 ? "float32" : t == DType::BF16 ? "bfloat16" : "float16";
}

// The transformers class and model_type of each RoPE family.
struct HfFamily {
  const char* family;
  const char* model_type;
  const char* architecture;
};
constexpr HfFamily kHfFamilies[] = {
    {"llama", "llama", "LlamaForCausalLM"},
    {"mistral", "mistral", "MistralForCausalLM"},
    {"qwen2", "qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "qwen3", "Qwen3ForCausalLM"},
    {"phi3", "phi3", "Phi3ForCausalLM"},
    {"smollm3", "smollm3", "SmolLM3ForCausalLM"},
    {"gemma2", "gemma2", "Gemma2ForCausalLM"},
    {"gemma3", "gemma3_text", "Gemma3ForCausalLM"},
    {"olmo2", "olmo2", "Olmo2ForCausalLM"},
    {"mixtral", "mixtral", "MixtralForCausalLM"},
    {"qwen2_moe", "qwen2_moe", "Qwen2MoeForCausalLM"},
    {"qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM"},
};

// The family that a config.json's model_type names: its own name but Gemma 3's text model.
std::string family_of_model_type(const std::string& type) {
  return type == "gemma3_text" ? "gemma3" : type;
}

const HfFamily& hf_family(const std::string& family) {
  for (const HfFamily& f : kHfFamilies) {
    if (family == f.family) return f;
  }
  STRATA_INPUT_FAIL("a Hugging Face export of family ", family, " is not supported");
}

json rope_scaling_json(const RopeScaling& r) {
  if (r.type == "none") return nullptr;
  json j = {{"rope_type", r.type}, {"type", r.type}, {"factor", decimal(r.factor)}};
  if (r.original_max_positions > 0) {
    j["original_max_position_embeddings"] = r.original_max_positions;
  }
  if (r.type == "llama3") {
    j["low_freq_factor"] = decimal(r.low_freq_factor);
    j["high_freq_factor"] = decimal(r.high_freq_factor);
  } else if (r.type == "yarn") {
    j["beta_fast"] = decimal(r.beta_fast);
    j["beta_slow"] = decimal(r.beta_slow);
    if (r.attention_factor > 0) j["attention_factor"] = decimal(r.attention_factor);
  }
  return j;
}

// A mixture of experts' fields, as transformers names them for the family. transformers adds
// its balancing loss (pooled over the layers) only with output_router_logits, which an export sets
// when the model trains with one.
void moe_config(const ModelConfig& m, json& j) {
  const MoeConfig& e = m.moe;
  // What each transformers class can hold: Mixtral renormalised experts on every layer, Qwen3-MoE
  // no shared expert, Qwen2-MoE a gated one always; the other families no experts at all.
  const bool mixtral = m.family == "mixtral";
  const char* cannot =
      e.router != "softmax"
          ? "their routers are softmax ones (DeepSeek-V3, whose router is the sigmoid one, has an "
            "attention strata does not compute)"
      : mixtral && (!e.norm_topk_prob || e.shared_ffn_hidden > 0 || m.moe_layers() != m.layers)
          ? "Mixtral has renormalised experts on every layer and no shared expert"
      : m.family == "qwen3_moe" && e.shared_ffn_hidden > 0 ? "Qwen3-MoE has no shared expert"
      : m.family == "qwen2_moe" && !(e.shared_ffn_hidden > 0 && e.shared_gate)
          ? "Qwen2-MoE always has a shared expert behind a sigmoid gate"
      : !mixtral && m.family != "qwen2_moe" && m.family != "qwen3_moe"
          ? "only Mixtral, Qwen2-MoE and Qwen3-MoE have experts in transformers"
          : nullptr;
  STRATA_INPUT_CHECK(cannot == nullptr, "a Hugging Face export of this ", m.family,
                     " model with model.moe is not possible: ", cannot,
                     "; the strata checkpoint keeps it as it is");
  j["num_experts_per_tok"] = e.top_k;
  const bool aux = e.aux_loss == "pooled" && e.router_aux_loss_coef > 0;
  j["output_router_logits"] = aux;
  j["router_aux_loss_coef"] = decimal(aux ? e.router_aux_loss_coef : 0.0f);
  if (m.family == "mixtral") {
    j["num_local_experts"] = e.experts;
    j["intermediate_size"] = e.ffn_hidden;  // Mixtral's experts are its MLPs
    j["router_jitter_noise"] = 0.0;
    return;
  }
  j["num_experts"] = e.experts;
  j["moe_intermediate_size"] = e.ffn_hidden;
  j["norm_topk_prob"] = e.norm_topk_prob;
  j["decoder_sparse_step"] = e.decoder_sparse_step;
  j["mlp_only_layers"] = e.mlp_only_layers;
  if (m.family == "qwen2_moe") j["shared_expert_intermediate_size"] = e.shared_ffn_hidden;
}

// The RoPE families' config.json fields (Llama's, and what each family adds).
void rope_family_config(const ModelConfig& m, json& j) {
  const HfFamily& f = hf_family(m.family);
  j["architectures"] = json::array({f.architecture});
  j["model_type"] = f.model_type;
  j["vocab_size"] = m.vocab;
  j["max_position_embeddings"] = m.seq_len;
  j["hidden_size"] = m.hidden;
  j["intermediate_size"] = m.ffn_hidden;
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_heads;
  j["head_dim"] = m.hd();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = decimal(m.norm_eps);
  // transformers 4 reads rope_theta and rope_scaling, 5 rope_parameters.
  j["rope_theta"] = decimal(m.rope_theta);
  j["rope_scaling"] = rope_scaling_json(m.rope_scaling);
  json params = m.rope_scaling.type == "none" ? json{{"rope_type", "default"}}
                                              : rope_scaling_json(m.rope_scaling);
  params.erase("type");
  params["rope_theta"] = decimal(m.rope_theta);
  j["rope_parameters"] = params;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (m.family == "llama") j["pretraining_tp"] = 1;
  if (m.family == "mistral" || m.family == "phi3") {
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json();
  }
  const bool qwen_moe = m.family == "qwen2_moe" || m.family == "qwen3_moe";
  if (m.family == "mixtral") {
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json();
  }
  if (m.family == "qwen2" || m.family == "qwen3" || qwen_moe) {
    j.erase("attention_bias");
    if (m.family == "qwen3" || m.family == "qwen3_moe") j["attention_bias"] = false;
    if (m.family == "qwen2_moe") j["qkv_bias"] = m.qkv_bias;
    j["use_sliding_window"] = m.sliding_window > 0;
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json();
    j["max_window_layers"] = m.layers;
    if (m.sliding_window > 0) {
      json types = json::array();
      for (int l = 0; l < m.layers; ++l) {
        types.push_back(m.sliding(l) ? "sliding_attention" : "full_attention");
      }
      j["layer_types"] = types;
      int first = m.layers;  // transformers derives the kinds from max_window_layers
      while (first > 0 && m.sliding(first - 1)) --first;
      j["max_window_layers"] = first;
    }
  }
  if (m.moe.experts > 0) moe_config(m, j);
  if (m.family == "phi3") {
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["original_max_position_embeddings"] = m.seq_len;
    j["partial_rotary_factor"] = 1.0;
  }
  if (m.family == "gemma2" || m.family == "gemma3") {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j.erase("hidden_act");
    j["query_pre_attn_scalar"] =
        m.query_pre_attn_scalar > 0 ? json(decimal(m.query_pre_attn_scalar)) : json(m.hd());
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(m.seq_len);
    json types = json::array();
    for (int l = 0; l < m.layers; ++l) {
      types.push_back(m.sliding(l) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
    if (m.family == "gemma3") {
      j["rope_local_base_freq"] =
          decimal(m.rope_local_theta > 0 ? m.rope_local_theta : m.rope_theta);
    }
    auto cap = [](float c) { return c > 0 ? json(decimal(c)) : json(); };
    j["attn_logit_softcapping"] = cap(m.attn_logit_softcapping);
    j["final_logit_softcapping"] = cap(m.final_logit_softcapping);
    j.erase("rope_parameters");  // transformers 4's Gemma reads rope_theta and rope_scaling
  }
  if (m.family == "smollm3") {
    json layers = json::array();
    for (int l = 0; l < m.layers; ++l) layers.push_back(m.rope(l) ? 1 : 0);
    j["no_rope_layers"] = layers;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
}

// config.json of m's transformers model. Dropouts are 0 and the token ids null: strata trains
// without dropout and knows no tokenizer.
}  // namespace

json hf_config_json(const ModelConfig& m, DType dtype) {
  json j = json::object();
  if (m.family == "gpt2") {
    j["architectures"] = json::array({"GPT2LMHeadModel"});
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab;
    j["n_positions"] = m.seq_len;
    j["n_embd"] = m.hidden;
    j["n_layer"] = m.layers;
    j["n_head"] = m.heads;
    j["n_inner"] = m.ffn_hidden;
    j["activation_function"] = "gelu_new";  // the tanh approximation, strata's GELU
    j["layer_norm_epsilon"] = decimal(m.norm_eps);
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
  } else {
    rope_family_config(m, j);
  }
  j["tie_word_embeddings"] = m.tied_embeddings;
  j["initializer_range"] = decimal(m.init_std);
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["pad_token_id"] = nullptr;  // some classes' defaults (Phi-3's 32000) lie past a small vocab
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype(dtype);
  return j;
}

namespace {

// j[key] as T; `fallback` when absent or null (required when there is none). InputError naming
// the file and the key on a wrong type.
template <typename T>
T field(const json& j, const std::string& path, const char* key,
        std::optional<T> fallback = std::nullopt) {
  if (!j.contains(key) || j[key].is_null()) {
    STRATA_INPUT_CHECK(fallback.has_value(), path, " has no \"", key, "\"");
    return *fallback;
  }
  const json& v = j[key];
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = v.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = v.is_number();
  } else {
    ok = v.is_string();
  }
  STRATA_INPUT_CHECK(ok, path, ": \"", key, "\" is ", v.dump(), ", which is not ",
                     std::is_same_v<T, bool>       ? "true or false"
                     : std::is_integral_v<T>       ? "a non-negative integer"
                     : std::is_floating_point_v<T> ? "a number"
                                                   : "a string");
  return v.get<T>();
}

// Fails unless j[key] (or its default) is `want`: strata computes only that.
template <typename T>
void require(const json& j, const std::string& path, const char* key, T fallback, T want,
             const char* why) {
  const T got = field<T>(j, path, key, fallback);
  STRATA_INPUT_CHECK(got == want, path, ": \"", key, "\" is ", json(got).dump(),
                     ", which strata does not support: ", why);
}

// RoPE's scaling from transformers 4's "rope_scaling" or 5's "rope_parameters" (whose
// "rope_theta" it also reads); types strata does not compute are refused, naming them.
void read_rope(const json& j, const std::string& path, ModelConfig& m) {
  double theta = field<double>(j, path, "rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& r = j[key];
    const std::string where = path + " (" + key + ")";
    STRATA_INPUT_CHECK(r.is_object(), path, ": \"", key, "\" is not an object");
    STRATA_INPUT_CHECK(!r.contains("full_attention") && !r.contains("sliding_attention"), where,
                       ": RoPE settings per layer type (Gemma 3's) are not supported");
    if (std::string(key) == "rope_parameters") theta = field<double>(r, where, "rope_theta", theta);
    const std::string type =
        field<std::string>(r, where, r.contains("rope_type") ? "rope_type" : "type", "default");
    if (type == "default") continue;
    STRATA_INPUT_CHECK(type == "linear" || type == "llama3" || type == "yarn", where,
                       ": RoPE scaling \"", type,
                       "\" is not supported; strata computes \"default\", \"linear\", "
                       "\"llama3\" and \"yarn\"",
                       type == "longrope" || type == "su"
                           ? " (Phi-3's long-context longrope is not: use a 4k-context Phi-3)"
                           : "");
    RopeScaling& s = m.rope_scaling;
    s.type = type;
    s.factor = float(field<double>(r, where, "factor", std::nullopt));
    // Required by llama3; yarn's defaults to the model's context; linear has none.
    s.original_max_positions = field<int>(
        r, where, "original_max_position_embeddings",
        type == "yarn"     ? std::optional<int>(field<int>(j, path, "max_position_embeddings", 0))
        : type == "linear" ? std::optional<int>(0)
                           : std::nullopt);
    if (type == "llama3") {
      s.low_freq_factor = float(field<double>(r, where, "low_freq_factor", std::nullopt));
      s.high_freq_factor = float(field<double>(r, where, "high_freq_factor", std::nullopt));
    } else if (type == "yarn") {
      s.beta_fast = float(field<double>(r, where, "beta_fast", 32.0));
      s.beta_slow = float(field<double>(r, where, "beta_slow", 1.0));
      s.attention_factor = float(field<double>(r, where, "attention_factor", 0.0));
      STRATA_INPUT_CHECK(!r.contains("mscale") && !r.contains("mscale_all_dim"), where,
                         ": yarn's mscale and mscale_all_dim are not supported");
    }
  }
  m.rope_theta = float(theta);
}

// The attention kinds of each layer: an explicit "layer_types" list (newer transformers), else
// the family's rule (Mistral and Phi-3: every layer slides when sliding_window is set; Qwen2/3:
// the layers from max_window_layers on, when use_sliding_window).
void read_sliding(const json& j, const std::string& path, const std::string& type, ModelConfig& m) {
  const bool qwen =
      type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe";
  const bool used = qwen ? field<bool>(j, path, "use_sliding_window", false)
                         : type == "mistral" || type == "mixtral" || type == "phi3" ||
                               type == "gemma2" || type == "gemma3";
  const int window = field<int>(j, path, "sliding_window", 0);
  if (!used || window == 0) return;
  m.sliding_window = window;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& t = j["layer_types"];
    STRATA_INPUT_CHECK(t.is_array() && int(t.size()) == m.layers, path,
                       ": \"layer_types\" must list one kind per layer (", m.layers, ")");
    for (const json& k : t) {
      STRATA_INPUT_CHECK(k == "sliding_attention" || k == "full_attention", path,
                         ": \"layer_types\" holds ", k.dump(),
                         "; strata reads \"sliding_attention\" and \"full_attention\"");
      m.layer_sliding.push_back(k == "sliding_attention");
    }
  } else if (qwen) {
    const int first = field<int>(j, path, "max_window_layers", m.layers);
    for (int l = 0; l < m.layers; ++l) m.layer_sliding.push_back(l >= first);
  } else if (type == "gemma2" || type == "gemma3") {
    // Every sliding_window_pattern-th layer attends in full (Gemma 2: every second).
    const int every = field<int>(j, path, "sliding_window_pattern", type == "gemma2" ? 2 : 6);
    STRATA_INPUT_CHECK(every > 0, path, ": \"sliding_window_pattern\" must be > 0");
    for (int l = 0; l < m.layers; ++l) m.layer_sliding.push_back((l + 1) % every != 0);
  }
  // One description per model: no sliding layer is no window; all of them, no per-layer list.
  const auto sliding = std::count(m.layer_sliding.begin(), m.layer_sliding.end(), char(1));
  if (!m.layer_sliding.empty() && sliding == 0) m.sliding_window = 0;
  if (sliding == 0 || sliding == int64_t(m.layer_sliding.size())) m.layer_sliding.clear();
}

// Mixtral's, Qwen2-MoE's and Qwen3-MoE's experts (model_config.h MoeConfig). The balancing loss
// is the one transformers adds: with output_router_logits, router_aux_loss_coef; else none.
void read_moe(const json& j, const std::string& path, const std::string& type, ModelConfig& m) {
  MoeConfig& e = m.moe;
  const bool mixtral = type == "mixtral";
  e.experts = field<int>(j, path, mixtral ? "num_local_experts" : "num_experts");
  e.top_k = field<int>(j, path, "num_experts_per_tok");
  e.ffn_hidden = mixtral ? m.ffn_hidden : field<int>(j, path, "moe_intermediate_size");
  e.norm_topk_prob = mixtral || field<bool>(j, path, "norm_topk_prob", false);
  STRATA_INPUT_CHECK(e.experts > 0 && e.top_k > 0 && e.top_k <= e.experts && e.ffn_hidden > 0, path,
                     ": ", e.experts, " experts of ", e.ffn_hidden, " units, ", e.top_k,
                     " per token: each must be > 0, and num_experts_per_tok at most the experts");
  if (type == "qwen2_moe") {
    e.shared_ffn_hidden = field<int>(j, path, "shared_expert_intermediate_size");
    e.shared_gate = true;
    STRATA_INPUT_CHECK(e.shared_ffn_hidden > 0, path,
                       ": \"shared_expert_intermediate_size\" must be > 0");
  }
  if (!mixtral) {
    e.decoder_sparse_step = field<int>(j, path, "decoder_sparse_step", 1);
    STRATA_INPUT_CHECK(e.decoder_sparse_step > 0, path, ": \"decoder_sparse_step\" must be > 0");
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      const json& v = j["mlp_only_layers"];
      STRATA_INPUT_CHECK(v.is_array(), path, ": \"mlp_only_layers\" must be a list of layers");
      for (const json& l : v) {
        STRATA_INPUT_CHECK(
            l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < m.layers, path,
            ": \"mlp_only_layers\" holds ", l.dump(), "; layers are 0 to ", m.layers - 1);
        e.mlp_only_layers.push_back(l.get<int>());
      }
    }
  }
  if (mixtral) {
    require(j, path, "router_jitter_noise", 0.0, 0.0,
            "strata routes without jitter (router_jitter_noise 0)");
  }
  const bool aux = field<bool>(j, path, "output_router_logits", false);
  e.router_aux_loss_coef =
      aux ? float(field<double>(j, path, "router_aux_loss_coef", 0.001)) : 0.0f;
  STRATA_INPUT_CHECK(std::isfinite(e.router_aux_loss_coef) && e.router_aux_loss_coef >= 0, path,
                     ": \"router_aux_loss_coef\" must be a finite number >= 0");
}

ModelConfig gpt2_config(const json& j, const std::string& path) {
  ModelConfig m;
  m.family = "gpt2";
  m.layers = field<int>(j, path, "n_layer");
  m.hidden = field<int>(j, path, "n_embd");
  m.heads = m.kv_heads = field<int>(j, path, "n_head");
  m.ffn_hidden = field<int>(j, path, "n_inner", 4 * m.hidden);
  m.vocab = field<int>(j, path, "vocab_size");
  m.seq_len = field<int>(j, path, j.contains("n_positions") ? "n_positions" : "n_ctx");
  m.norm_eps = float(field<double>(j, path, "layer_norm_epsilon", 1e-5));
  m.tied_embeddings = field<bool>(j, path, "tie_word_embeddings", true);
  const std::string act = field<std::string>(j, path, "activation_function", "gelu_new");
  STRATA_INPUT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", path,
                     ": \"activation_function\" is \"", act,
                     "\", which strata does not support: its GPT-2 computes GELU's tanh "
                     "approximation (\"gelu_new\" or \"gelu_pytorch_tanh\")");
  require(j, path, "scale_attn_weights", true, true, "attention scores are scaled by 1/sqrt(hd)");
  require(j, path, "scale_attn_by_inverse_layer_idx", false, false,
          "attention scores are not scaled by the layer index");
  require(j, path, "add_cross_attention", false, false, "strata's model is decoder-only");
  return m;
}

// Llama and the families built on it: Mistral, Qwen2/2.5, Qwen3, Phi-3, SmolLM2 (a "llama")
// and SmolLM3.
ModelConfig rope_family_model(const json& j, const std::string& path, const std::string& type) {
  ModelConfig m;
  m.family = type;
  m.layers = field<int>(j, path, "num_hidden_layers");
  m.hidden = field<int>(j, path, "hidden_size");
  m.heads = field<int>(j, path, "num_attention_heads");
  m.kv_heads = field<int>(j, path, "num_key_value_heads", m.heads);
  m.ffn_hidden = field<int>(j, path, "intermediate_size");
  m.vocab = field<int>(j, path, "vocab_size");
  m.seq_len = field<int>(j, path, "max_position_embeddings");
  m.norm_eps = float(field<double>(j, path, "rms_norm_eps", 1e-6));
  const bool gemma = type == "gemma2" || type == "gemma3";
  // Absent: the transformers class's default, which only SmolLM3's and Gemma's tie.
  m.tied_embeddings = field<bool>(j, path, "tie_word_embeddings", type == "smollm3" || gemma);
  m.qkv_bias = type == "qwen2" || (type == "qwen2_moe" && field<bool>(j, path, "qkv_bias", true));
  m.qk_norm = type == "qwen3" || type == "qwen3_moe" || type == "gemma3" ? "head"
              : type == "olmo2"                                          ? "whole"
                                                                         : "none";
  if (type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe") read_moe(j, path, type, m);
  m.norm_placement = gemma ? "sandwich" : type == "olmo2" ? "post" : "pre";
  if (gemma) {  // (1 + w) norms, GeGLU, scaled embeddings and scores; soft-caps (2), RoPE bases (3)
    m.norm_offset = 1.0f;
    m.mlp_act = "gelu_tanh";
    m.embed_scale = true;
    const double scalar = field<double>(j, path, "query_pre_attn_scalar", 256.0);
    STRATA_INPUT_CHECK(scalar > 0, path, ": \"query_pre_attn_scalar\" must be > 0");
    m.query_pre_attn_scalar = float(scalar);
    if (type == "gemma3") {
      m.rope_local_theta = float(field<double>(j, path, "rope_local_base_freq", 10000.0));
    }
    require<std::string>(j, path, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh",
                         "Gemma's MLP is GeGLU with the tanh GELU");
    // Absent: the class's defaults (Gemma 2's 50 and 30); null: none.
    const bool two = type == "gemma2";
    for (auto [key, out, fallback] :
         {std::tuple{"attn_logit_softcapping", &m.attn_logit_softcapping, two ? 50.0 : 0.0},
          std::tuple{"final_logit_softcapping", &m.final_logit_softcapping, two ? 30.0 : 0.0}}) {
      const bool null = j.contains(key) && j[key].is_null();
      *out = null ? 0.0f : float(field<double>(j, path, key, fallback));
      STRATA_INPUT_CHECK(*out >= 0, path, ": \"", key, "\" must be >= 0");
    }
    require(j, path, "use_bidirectional_attention", false, false,
            "strata trains causal decoders (EmbeddingGemma's bidirectional attention is not "
            "supported)");
  }
  if (m.heads > 0) {
    const int hd = field<int>(j, path, "head_dim", m.hidden / m.heads);
    if (hd != m.hidden / m.heads || m.hidden % m.heads != 0) m.head_dim = hd;
  }
  read_rope(j, path, m);
  read_sliding(j, path, type, m);
  if (!gemma) {
    require<std::string>(j, path, "hidden_act", "silu", "silu",
                         "its MLP is SwiGLU (silu); a GELU-gated MLP is Gemma's");
  }
  if (type != "qwen2" && type != "qwen2_moe") {
    require(j, path, "attention_bias", false, false,
            "its attention projections have no biases (Qwen2's q/k/v biases come with "
            "model_type qwen2)");
  }
  require(j, path, "mlp_bias", false, false, "its MLP projections have no biases");
  require(j, path, "partial_rotary_factor", 1.0, 1.0,
          "RoPE rotates every dimension of a head (partial rotary is not supported)");
  if (type == "smollm3") {
    if (j.contains("no_rope_layers") && !j["no_rope_layers"].is_null()) {
      const json& v = j["no_rope_layers"];
      STRATA_INPUT_CHECK(v.is_array() && int(v.size()) == m.layers, path,
                         ": \"no_rope_layers\" must hold one 0 or 1 per layer (", m.layers, ")");
      for (const json& x : v) {
        STRATA_INPUT_CHECK(x == 0 || x == 1, path, ": \"no_rope_layers\" holds ", x.dump(),
                           "; each entry is 1 (the layer applies RoPE) or 0");
        m.layer_rope.push_back(x == 1);
      }
    } else {
      const int every = field<int>(j, path, "no_rope_layer_interval", 4);
      STRATA_INPUT_CHECK(every > 0, path, ": \"no_rope_layer_interval\" must be > 0");
      for (int l = 0; l < m.layers; ++l) m.layer_rope.push_back((l + 1) % every != 0);
    }
  }
  return m;
}

}  // namespace

ModelConfig model_config_from_hf(const std::string& config_json_path) {
  const std::string path = fs::is_directory(config_json_path)
                               ? (fs::path(config_json_path) / "config.json").string()
                               : config_json_path;
  std::ifstream in(path);
  STRATA_INPUT_CHECK(in.good(), "cannot open the Hugging Face config ", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    STRATA_INPUT_FAIL(path, " is not valid JSON: ", e.what());
  }
  STRATA_INPUT_CHECK(j.is_object(), path, " is not a JSON object");
  const std::string type = field<std::string>(j, path, "model_type");
  const std::vector<std::string>& families = model_families();
  STRATA_INPUT_CHECK(
      std::find(families.begin(), families.end(), family_of_model_type(type)) != families.end(),
      path, ": \"model_type\" is \"", type, "\"; strata reads ",
      [&] {
        std::string names;
        for (const std::string& f : families) {
          names += (names.empty() ? "\"" : ", \"") + f + "\"";
        }
        return names;
      }(),
      " models",
      type == "gemma"    ? " (Gemma 1 is not supported; Gemma 2 and 3 are, the latter as "
                           "model_type gemma3_text)"
      : type == "gemma3" ? " (import the text model, model_type gemma3_text: "
                           "the vision tower is not supported)"
                         : "");
  for (const char* key : {"vision_config", "audio_config", "text_config"}) {
    STRATA_INPUT_CHECK(!j.contains(key), path, ": the model has a \"", key,
                       "\"; strata trains text-only decoder models (import the text model's "
                       "own checkpoint)");
  }
  ModelConfig m = type == "gpt2" ? gpt2_config(j, path)
                                 : rope_family_model(j, path, family_of_model_type(type));
  m.init_std = float(field<double>(j, path, "initializer_range", 0.02));
  const std::pair<const char*, int> positive[] = {
      {"layers", m.layers},     {"hidden", m.hidden},         {"heads", m.heads},
      {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden}, {"vocab", m.vocab},
      {"seq_len", m.seq_len}};
  for (const auto& [key, v] : positive) {
    STRATA_INPUT_CHECK(v > 0, path, " gives model.", key, " = ", v, "; it must be > 0");
  }
  STRATA_INPUT_CHECK((m.head_dim > 0 || m.hidden % m.heads == 0) && m.heads % m.kv_heads == 0, path,
                     ": the hidden size ", m.hidden, ", ", m.heads, " attention heads and ",
                     m.kv_heads,
                     " key/value heads do not divide evenly (and no \"head_dim\" is given)");
  STRATA_INPUT_CHECK(m.family == "gpt2" || (m.hd() % 2 == 0 && m.hd() <= 512), path,
                     ": RoPE needs an even head dimension of at most 512, got ", m.hd());
  STRATA_INPUT_CHECK(std::isfinite(m.norm_eps) && m.norm_eps > 0 && std::isfinite(m.rope_theta) &&
                         m.rope_theta > 0,
                     path, ": the norm epsilon ", m.norm_eps, " and RoPE theta ", m.rope_theta,
                     " must be finite numbers > 0");
  return m;
}

}  // namespace strata::ckpt
