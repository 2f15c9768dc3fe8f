#include "strata/ckpt/hf.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/core/safetensors.h"

namespace strata::ckpt {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A strata parameter's Hugging Face tensors: one name, or the parts a fused weight is split into
// by canonical rows (q, k, v or gate, up). "{i}" stands for the layer. conv1d: GPT-2's Conv1D,
// stored transposed.
struct Rule {
  std::string_view family;
  ParamRole role;
  std::array<std::string_view, 3> parts;
  bool conv1d;
};

using R = ParamRole;
constexpr Rule kRules[] = {
    {"gpt2", R::TokenEmbedding, {"transformer.wte.weight"}, false},
    {"gpt2", R::PositionEmbedding, {"transformer.wpe.weight"}, false},
    {"gpt2", R::Norm1W, {"transformer.h.{i}.ln_1.weight"}, false},
    {"gpt2", R::Norm1B, {"transformer.h.{i}.ln_1.bias"}, false},
    {"gpt2", R::QkvW, {"transformer.h.{i}.attn.c_attn.weight"}, true},
    {"gpt2", R::QkvB, {"transformer.h.{i}.attn.c_attn.bias"}, false},
    {"gpt2", R::ProjW, {"transformer.h.{i}.attn.c_proj.weight"}, true},
    {"gpt2", R::ProjB, {"transformer.h.{i}.attn.c_proj.bias"}, false},
    {"gpt2", R::Norm2W, {"transformer.h.{i}.ln_2.weight"}, false},
    {"gpt2", R::Norm2B, {"transformer.h.{i}.ln_2.bias"}, false},
    {"gpt2", R::FcW, {"transformer.h.{i}.mlp.c_fc.weight"}, true},
    {"gpt2", R::FcB, {"transformer.h.{i}.mlp.c_fc.bias"}, false},
    {"gpt2", R::Fc2W, {"transformer.h.{i}.mlp.c_proj.weight"}, true},
    {"gpt2", R::Fc2B, {"transformer.h.{i}.mlp.c_proj.bias"}, false},
    {"gpt2", R::FinalNormW, {"transformer.ln_f.weight"}, false},
    {"gpt2", R::FinalNormB, {"transformer.ln_f.bias"}, false},
    {"gpt2", R::OutputW, {"lm_head.weight"}, false},
    {"llama", R::TokenEmbedding, {"model.embed_tokens.weight"}, false},
    {"llama", R::Norm1W, {"model.layers.{i}.input_layernorm.weight"}, false},
    {"llama",
     R::QkvW,
     {"model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
      "model.layers.{i}.self_attn.v_proj.weight"},
     false},
    {"llama", R::ProjW, {"model.layers.{i}.self_attn.o_proj.weight"}, false},
    {"llama", R::Norm2W, {"model.layers.{i}.post_attention_layernorm.weight"}, false},
    {"llama",
     R::FcW,
     {"model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"},
     false},
    {"llama", R::Fc2W, {"model.layers.{i}.mlp.down_proj.weight"}, false},
    {"llama", R::FinalNormW, {"model.norm.weight"}, false},
    {"llama", R::OutputW, {"lm_head.weight"}, false},
    {"llama",
     R::QkvB,
     {"model.layers.{i}.self_attn.q_proj.bias", "model.layers.{i}.self_attn.k_proj.bias",
      "model.layers.{i}.self_attn.v_proj.bias"},
     false},
    {"llama", R::QNormW, {"model.layers.{i}.self_attn.q_norm.weight"}, false},
    {"llama", R::KNormW, {"model.layers.{i}.self_attn.k_norm.weight"}, false},
    // Phi-3 stores q|k|v and gate|up fused, in the canonical row order; the rest as Llama.
    {"phi3", R::QkvW, {"model.layers.{i}.self_attn.qkv_proj.weight"}, false},
    {"phi3", R::FcW, {"model.layers.{i}.mlp.gate_up_proj.weight"}, false},
    // Gemma's sandwich norms: its post_attention_layernorm is the attention output's norm.
    {"gemma3", R::PostAttnNormW, {"model.layers.{i}.post_attention_layernorm.weight"}, false},
    {"gemma3", R::Norm2W, {"model.layers.{i}.pre_feedforward_layernorm.weight"}, false},
    {"gemma3", R::PostMlpNormW, {"model.layers.{i}.post_feedforward_layernorm.weight"}, false},
    // OLMo 2's norms follow each sublayer.
    {"olmo2", R::PostAttnNormW, {"model.layers.{i}.post_attention_layernorm.weight"}, false},
    {"olmo2", R::PostMlpNormW, {"model.layers.{i}.post_feedforward_layernorm.weight"}, false},
};

// The rules' naming a family's checkpoints use: GPT-2's; Phi-3's, Gemma 3's and OLMo 2's (each
// Llama's but a few); or Llama's (every other RoPE family).
std::string_view naming(const std::string& family) {
  for (const char* own : {"gpt2", "phi3", "gemma3", "olmo2"}) {
    if (family == own) return own;
  }
  return "llama";
}

// The prefix of the base model's tensors, which checkpoints saved from the base model lack.
std::string_view base_prefix(const std::string& family) {
  return family == "gpt2" ? "transformer." : "model.";
}

std::string with_layer(std::string_view pattern, int layer) {
  std::string s(pattern);
  const size_t at = s.find("{i}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  return s;
}

// Rows of p's canonical tensor in each Hugging Face part of `rule`.
std::vector<int64_t> part_rows(const ParamSpec& p, const Rule& rule) {
  const size_t n = size_t(std::count_if(rule.parts.begin(), rule.parts.end(),
                                        [](std::string_view s) { return !s.empty(); }));
  if (n == 1) return {p.global_shape[0]};
  if (p.fused == Fused::Qkv && n == 3) {
    const int64_t heads = p.fused_dims[0], kvh = p.fused_dims[1], hd = p.fused_dims[2];
    return {heads * hd, kvh * hd, kvh * hd};
  }
  STRATA_CHECK(p.fused == Fused::GateUp && n == 2, "no split of ", p.name, " into ", n, " parts");
  return {p.fused_dims[0], p.fused_dims[0]};
}

int64_t cols_of(const ParamSpec& p) {
  return p.global_shape.size() > 1 ? p.global_shape[1] : 1;
}

int64_t global_numel(const ParamSpec& p) {
  return p.global_shape[0] * cols_of(p);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      break;
  }
  STRATA_INPUT_FAIL("a Hugging Face export is written in fp32, bf16 or fp16, not ", dtype_name(t));
}

// out (HF shape) = t's rows of canonical (rows, cols), transposed for Conv1D.
void gather(float* out, const HfTensor& t, const float* canonical, int64_t cols) {
  const float* src = canonical + t.row_begin * cols;
  if (!t.transposed) {
    std::copy(src, src + t.rows * cols, out);
    return;
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * t.rows + r] = src[r * cols + c];
  }
}

// The inverse of gather: t's rows of canonical (rows, cols) from in (HF shape).
void scatter(float* canonical, const HfTensor& t, const float* in, int64_t cols) {
  float* dst = canonical + t.row_begin * cols;
  if (!t.transposed) {
    std::copy(in, in + t.rows * cols, dst);
    return;
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = in[c * t.rows + r];
  }
}

// The inverse of to_canonical: out (strata rows) from in (canonical rows).
void from_canonical(const ParamSpec& p, const float* in, float* out) {
  const int64_t rows = p.global_shape[0], cols = cols_of(p);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = in + canonical_row(p, r) * cols;
    std::copy(src, src + cols, out + r * cols);
  }
}

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
    {"gemma3", "gemma3_text", "Gemma3ForCausalLM"},
    {"olmo2", "olmo2", "Olmo2ForCausalLM"},
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
  if (m.family == "qwen2" || m.family == "qwen3") {
    j.erase("attention_bias");
    if (m.family == "qwen3") j["attention_bias"] = false;
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
  if (m.family == "phi3") {
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["original_max_position_embeddings"] = m.seq_len;
    j["partial_rotary_factor"] = 1.0;
  }
  if (m.family == "gemma3") {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j.erase("hidden_act");
    j["query_pre_attn_scalar"] =
        m.attn_scale > 0 ? json(decimal(1.0f / (m.attn_scale * m.attn_scale))) : json(m.hd());
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(m.seq_len);
    json types = json::array();
    for (int l = 0; l < m.layers; ++l) {
      types.push_back(m.sliding(l) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
    j["rope_local_base_freq"] = decimal(m.rope_local_theta > 0 ? m.rope_local_theta : m.rope_theta);
    j["attn_logit_softcapping"] = nullptr;
    j["final_logit_softcapping"] = nullptr;
    j.erase("rope_parameters");  // transformers 4's Gemma 3 reads rope_theta and rope_scaling
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
json hf_config(const ModelConfig& m, DType dtype) {
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

// The safetensors files of a checkpoint and which one holds each tensor.
class HfFiles {
 public:
  explicit HfFiles(const std::string& path) : label_(path) {
    if (!fs::is_directory(path)) {
      open(path);
      return;
    }
    const fs::path dir(path), single = dir / "model.safetensors",
                              index = dir / "model.safetensors.index.json";
    if (fs::exists(single)) {
      open(single.string());
      return;
    }
    STRATA_INPUT_CHECK(fs::exists(index), path,
                       " holds neither model.safetensors nor model.safetensors.index.json; give "
                       "a Hugging Face checkpoint directory or a .safetensors file");
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      STRATA_INPUT_FAIL(index.string(), " is not valid JSON: ", e.what());
    }
    STRATA_INPUT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
                       " has no \"weight_map\" object naming each tensor's file");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      STRATA_INPUT_CHECK(file.is_string(), index.string(), ": the file of tensor '", name,
                         "' is not a string");
      if (shards.insert(file.get<std::string>()).second)
        open((dir / file.get<std::string>()).string());
    }
  }

  // The tensor `name`, also looked up without the base model's `prefix`; nullopt if absent.
  std::optional<SafetensorView> find(const std::string& name, std::string_view prefix) const {
    auto it = where_.find(name);
    if (it == where_.end() && name.starts_with(prefix)) {
      it = where_.find(name.substr(prefix.size()));
    }
    if (it == where_.end()) return std::nullopt;
    return files_[size_t(it->second)]->get(it->first);
  }
  const std::string& label() const { return label_; }

 private:
  void open(const std::string& path) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const std::string& n : files_.back()->names()) where_[n] = int(files_.size()) - 1;
  }
  std::string label_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, int> where_;  // tensor name -> index into files_
};

// v's elements in fp32 (v.numel() of them into out).
void read_f32(float* out, const SafetensorView& v, const std::string& label,
              const std::string& name) {
  const size_t n = size_t(v.numel());
  if (v.dtype == "F32") {
    std::memcpy(out, v.data, n * 4);
  } else if (v.dtype == "BF16") {
    convert(out, DType::F32, v.data, DType::BF16, n);
  } else if (v.dtype == "F16") {
    convert(out, DType::F32, v.data, DType::F16, n);
  } else {
    STRATA_INPUT_FAIL(label, ": tensor '", name, "' is ", v.dtype,
                      "; a Hugging Face import reads F32, BF16 or F16 weights");
  }
}

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
  const bool qwen = type == "qwen2" || type == "qwen3";
  const bool used = qwen ? field<bool>(j, path, "use_sliding_window", false)
                         : type == "mistral" || type == "phi3" || type == "gemma3";
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
  } else if (type == "gemma3") {  // every sliding_window_pattern-th layer attends in full
    const int every = field<int>(j, path, "sliding_window_pattern", 6);
    STRATA_INPUT_CHECK(every > 0, path, ": \"sliding_window_pattern\" must be > 0");
    for (int l = 0; l < m.layers; ++l) m.layer_sliding.push_back((l + 1) % every != 0);
  }
  // A window as long as the sequence changes nothing; keep it for the export all the same.
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
  const bool gemma = type == "gemma3";
  // Absent: the transformers class's default, which only SmolLM3's and Gemma's tie.
  m.tied_embeddings = field<bool>(j, path, "tie_word_embeddings", type == "smollm3" || gemma);
  m.qkv_bias = type == "qwen2";
  m.qk_norm = type == "qwen3" || gemma ? "head" : type == "olmo2" ? "whole" : "none";
  m.norm_placement = gemma ? "sandwich" : type == "olmo2" ? "post" : "pre";
  if (gemma) {  // Gemma 3: (1 + w) norms, GeGLU, scaled embeddings and scores, local RoPE base
    m.norm_offset = 1.0f;
    m.mlp_act = "gelu_tanh";
    m.embed_scale = true;
    const double scalar = field<double>(j, path, "query_pre_attn_scalar", 256.0);
    STRATA_INPUT_CHECK(scalar > 0, path, ": \"query_pre_attn_scalar\" must be > 0");
    m.attn_scale = float(1.0 / std::sqrt(scalar));
    m.rope_local_theta = float(field<double>(j, path, "rope_local_base_freq", 10000.0));
    require<std::string>(j, path, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh",
                         "Gemma's MLP is GeGLU with the tanh GELU");
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      STRATA_INPUT_CHECK(!j.contains(key) || j[key].is_null(), path, ": \"", key,
                         "\" is set; soft-capping (Gemma 2's) is not supported");
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
  if (type != "qwen2") {
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

std::vector<HfTensor> hf_tensors(const ModelSpec& spec) {
  const std::string& family = spec.config.family;
  std::vector<HfTensor> out;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    // A family's own rule, else the Llama one it shares (Phi-3).
    const Rule* rule = nullptr;
    for (const Rule& r : kRules) {
      if (r.role == p.role &&
          (r.family == naming(family) || (!rule && r.family == "llama" && family != "gpt2"))) {
        rule = &r;
      }
    }
    STRATA_CHECK(rule != nullptr, "parameter ", p.name, " of a ", family,
                 " model has no Hugging Face counterpart");
    const std::vector<int64_t> rows = part_rows(p, *rule);
    const int64_t cols = cols_of(p);
    int64_t begin = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      HfTensor t;
      t.name = with_layer(rule->parts[k], p.layer);
      t.param = int(i);
      t.row_begin = begin, t.rows = rows[k];
      t.transposed = rule->conv1d && p.global_shape.size() == 2;
      if (p.global_shape.size() == 1) {
        t.shape = {rows[k]};
      } else {
        t.shape = t.transposed ? std::vector<int64_t>{cols, rows[k]}
                               : std::vector<int64_t>{rows[k], cols};
      }
      begin += rows[k];
      out.push_back(std::move(t));
    }
    STRATA_CHECK(begin == p.global_shape[0], "the Hugging Face parts of ", p.name, " hold ", begin,
                 " of its ", p.global_shape[0], " rows");
  }
  return out;
}

void export_hf(const ModelSpec& spec, const GlobalTensorFn& get, DType dtype,
               const std::string& dir) {
  STRATA_CHECK(spec.tp.size == 1, "export_hf takes a tp = 1 spec, got tp = ", spec.tp.size);
  const char* st_dtype = safetensors_dtype(dtype);
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  std::vector<float> canonical, part;
  std::vector<char> bytes;
  int loaded = -1;
  const std::vector<HfTensor> tensors = hf_tensors(spec);
  const ProgressTask progress("export to Hugging Face (tensors)", tensors.size(),
                              ProgressTask::Unit::Items);
  for (const HfTensor& t : tensors) {
    progress_advance(1);
    const ParamSpec& p = spec.params[size_t(t.param)];
    if (t.param != loaded) {
      const std::vector<float> global = get(p);
      STRATA_CHECK(int64_t(global.size()) == global_numel(p), "the tensor given for ", p.name,
                   " has ", global.size(), " elements, its global shape ",
                   shape_str(p.global_shape), " holds ", global_numel(p));
      canonical.resize(global.size());
      to_canonical(p, global.data(), canonical.data());
      loaded = t.param;
    }
    const int64_t cols = cols_of(p), n = t.rows * cols;
    part.resize(size_t(n));
    gather(part.data(), t, canonical.data(), cols);
    bytes.resize(size_t(n) * dtype_size(dtype));
    convert(bytes.data(), dtype, part.data(), DType::F32, size_t(n));
    writer.add(t.name, st_dtype, t.shape, bytes.data(), bytes.size());
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create the export directory ", dir, ": ", ec.message());
  writer.write((fs::path(dir) / "model.safetensors").string());
  atomic_write((fs::path(dir) / "config.json").string(),
               hf_config(spec.config, dtype).dump(2) + "\n", IoError::input);
}

std::map<std::string, std::vector<float>> import_hf(const std::string& path,
                                                    const ModelSpec& spec) {
  STRATA_CHECK(spec.tp.size == 1, "import_hf takes a tp = 1 spec, got tp = ", spec.tp.size);
  const HfFiles files(path);
  const std::string_view prefix = base_prefix(spec.config.family);
  std::vector<std::vector<float>> canonical(spec.params.size());
  for (size_t i = 0; i < spec.params.size(); ++i) {
    canonical[i].resize(size_t(global_numel(spec.params[i])));
  }
  std::vector<float> part;
  int embedding = -1;
  const std::vector<HfTensor> tensors = hf_tensors(spec);
  const ProgressTask progress("import from Hugging Face (tensors)", tensors.size(),
                              ProgressTask::Unit::Items);
  for (const HfTensor& t : tensors) {
    progress_advance(1);
    const ParamSpec& p = spec.params[size_t(t.param)];
    if (p.role == ParamRole::TokenEmbedding) embedding = t.param;
    const std::optional<SafetensorView> v = files.find(t.name, prefix);
    STRATA_INPUT_CHECK(v.has_value(), files.label(), " has no tensor '", t.name, "' (shape ",
                       shape_str(t.shape), ") that the model needs",
                       p.role == ParamRole::OutputW
                           ? "; a checkpoint that ties lm_head to the token embedding needs "
                             "model.tied_embeddings true"
                           : "");
    STRATA_INPUT_CHECK(v->shape == t.shape, files.label(), ": tensor '", t.name, "' has shape ",
                       shape_str(v->shape), ", the model needs ", shape_str(t.shape));
    part.resize(size_t(v->numel()));
    read_f32(part.data(), *v, files.label(), t.name);
    scatter(canonical[size_t(t.param)].data(), t, part.data(), cols_of(p));
  }
  const std::optional<SafetensorView> head = files.find("lm_head.weight", prefix);
  if (spec.config.tied_embeddings && head.has_value() && embedding >= 0) {
    const std::vector<float>& wte = canonical[size_t(embedding)];
    bool same = head->shape == spec.params[size_t(embedding)].global_shape;
    if (same) {
      part.resize(wte.size());
      read_f32(part.data(), *head, files.label(), "lm_head.weight");
      same = std::memcmp(part.data(), wte.data(), wte.size() * sizeof(float)) == 0;
    }
    STRATA_INPUT_CHECK(same, files.label(),
                       ": lm_head.weight differs from the token embedding, "
                       "but the model ties them (model.tied_embeddings true); import with "
                       "model.tied_embeddings false to keep both");
  }
  std::map<std::string, std::vector<float>> out;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    std::vector<float>& w = out[p.name];
    w.resize(canonical[i].size());
    from_canonical(p, canonical[i].data(), w.data());
  }
  return out;
}

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
      type == "gemma" || type == "gemma2"
          ? " (Gemma 1 and 2 are not supported: Gemma 2's final-logit soft-cap "
            "is not computed; Gemma 3 is, as model_type gemma3_text)"
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
