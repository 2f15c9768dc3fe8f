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
    {"gemma2", R::PostAttnNormW, {"model.layers.{i}.post_attention_layernorm.weight"}, false},
    {"gemma2", R::Norm2W, {"model.layers.{i}.pre_feedforward_layernorm.weight"}, false},
    {"gemma2", R::PostMlpNormW, {"model.layers.{i}.post_feedforward_layernorm.weight"}, false},
    // The mixtures of experts: "{e}" stands for the expert, each expert's rows a part of their
    // own (gate, up; down), one expert after another.
    {"mixtral", R::RouterW, {"model.layers.{i}.block_sparse_moe.gate.weight"}, false},
    {"mixtral",
     R::ExpertGateUpW,
     {"model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
      "model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight"},
     false},
    {"mixtral", R::ExpertDownW, {"model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight"}, false},
    {"qwen_moe", R::RouterW, {"model.layers.{i}.mlp.gate.weight"}, false},
    {"qwen_moe",
     R::ExpertGateUpW,
     {"model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
      "model.layers.{i}.mlp.experts.{e}.up_proj.weight"},
     false},
    {"qwen_moe", R::ExpertDownW, {"model.layers.{i}.mlp.experts.{e}.down_proj.weight"}, false},
    {"qwen_moe",
     R::SharedFcW,
     {"model.layers.{i}.mlp.shared_expert.gate_proj.weight",
      "model.layers.{i}.mlp.shared_expert.up_proj.weight"},
     false},
    {"qwen_moe", R::SharedFc2W, {"model.layers.{i}.mlp.shared_expert.down_proj.weight"}, false},
    {"qwen_moe", R::SharedGateW, {"model.layers.{i}.mlp.shared_expert_gate.weight"}, false},
    // OLMo 2's norms follow each sublayer.
    {"olmo2", R::PostAttnNormW, {"model.layers.{i}.post_attention_layernorm.weight"}, false},
    {"olmo2", R::PostMlpNormW, {"model.layers.{i}.post_feedforward_layernorm.weight"}, false},
};

// The rules' naming a family's checkpoints use: GPT-2's; Phi-3's, Gemma 3's and OLMo 2's (each
// Llama's but a few); or Llama's (every other RoPE family).
std::string_view naming(const std::string& family) {
  for (const char* own : {"gpt2", "phi3", "gemma2", "gemma3", "olmo2", "mixtral"}) {
    if (family == own) return own;
  }
  if (family == "qwen2_moe" || family == "qwen3_moe") return "qwen_moe";
  return "llama";
}

// The prefix of the base model's tensors, which checkpoints saved from the base model lack.
std::string_view base_prefix(const std::string& family) {
  return family == "gpt2" ? "transformer." : "model.";
}

std::string with_layer(std::string_view pattern, int layer, int expert = -1) {
  std::string s(pattern);
  const size_t at = s.find("{i}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  const size_t e = s.find("{e}");
  if (e != std::string::npos) s.replace(e, 3, std::to_string(expert));
  return s;
}

// The experts a rule's parts repeat for ("{e}" in its names): the model's, else one.
int64_t experts_of(const Rule& rule, const ModelConfig& m) {
  return rule.parts[0].find("{e}") != std::string_view::npos ? m.moe.experts : 1;
}

// Rows of p's canonical tensor in each Hugging Face part of `rule` (of one expert's rows where
// the parts are per expert).
std::vector<int64_t> part_rows(const ParamSpec& p, const Rule& rule, int64_t experts) {
  const size_t n = size_t(std::count_if(rule.parts.begin(), rule.parts.end(),
                                        [](std::string_view s) { return !s.empty(); }));
  if (n == 1) return {p.global_shape[0] / experts};
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
    const int64_t experts = experts_of(*rule, spec.config);
    const std::vector<int64_t> rows = part_rows(p, *rule, experts);
    const int64_t cols = cols_of(p);
    int64_t begin = 0;
    for (size_t j = 0; j < rows.size() * size_t(experts); ++j) {
      const size_t k = j % rows.size();
      HfTensor t;
      t.name = with_layer(rule->parts[k], p.layer, int(j / rows.size()));
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
  // First: a model transformers cannot hold is refused before anything is written.
  const std::string config = hf_config_json(spec.config, dtype).dump(2) + "\n";
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
  atomic_write((fs::path(dir) / "config.json").string(), config, IoError::input);
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

}  // namespace strata::ckpt
