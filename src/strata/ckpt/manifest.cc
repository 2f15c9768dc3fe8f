#include "strata/ckpt/manifest.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/check.h"

namespace strata::ckpt {

using nlohmann::json;

bool known_kind(const std::string& kind) {
  return kind == kMaster || kind == kExpAvg || kind == kExpAvgSq || kind == kMomentum;
}

namespace {

json model_json(const ModelConfig& m) {
  return model_block_json(m);
}

// Typed, bounded access to a parsed manifest: every failure names the file and the field.
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    STRATA_INPUT_FAIL(what_, ": ", field, " ", why,
                      "; the checkpoint is damaged or not one strata wrote");
  }
  const json& at(const json& o, const char* key, const std::string& field) const {
    if (!o.is_object()) fail(field, "is not an object");
    const auto it = o.find(key);
    if (it == o.end()) fail(field + "." + key, "is missing");
    return *it;
  }
  int64_t integer(const json& o, const char* key, const std::string& field, int64_t lo,
                  int64_t hi) const {
    const json& v = at(o, key, field);
    if (!v.is_number_integer()) fail(field + "." + key, "is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) {
      fail(field + "." + key, "is out of range");
    }
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(field + "." + key, "= " + std::to_string(x) + " is outside [" + std::to_string(lo) +
                                  ", " + std::to_string(hi) + "]");
    }
    return x;
  }
  std::string string(const json& o, const char* key, const std::string& field) const {
    const json& v = at(o, key, field);
    if (!v.is_string()) fail(field + "." + key, "is not a string");
    return v.get<std::string>();
  }
  double number(const json& o, const char* key, const std::string& field) const {
    const json& v = at(o, key, field);
    if (!v.is_number()) fail(field + "." + key, "is not a number");
    return v.get<double>();
  }
  bool boolean(const json& o, const char* key, const std::string& field) const {
    const json& v = at(o, key, field);
    if (!v.is_boolean()) fail(field + "." + key, "is not a boolean");
    return v.get<bool>();
  }
  const json& array(const json& o, const char* key, const std::string& field) const {
    const json& v = at(o, key, field);
    if (!v.is_array()) fail(field + "." + key, "is not an array");
    return v;
  }

 private:
  std::string what_;
};

constexpr int64_t kMaxInt = int64_t(1) << 40;  // element counts, offsets, dims: far past real ones

ModelConfig parse_model(const Reader& r, const json& o) {
  ModelConfig m;
  const std::string f = "model";
  m.family = r.string(o, "family", f);
  const std::vector<std::string>& families = model_families();
  if (std::find(families.begin(), families.end(), m.family) == families.end()) {
    r.fail(f + ".family", "is not a model family strata knows");
  }
  m.layers = int(r.integer(o, "layers", f, 0, 1 << 20));
  m.hidden = int(r.integer(o, "hidden", f, 1, 1 << 24));
  m.heads = int(r.integer(o, "heads", f, 1, 1 << 20));
  m.kv_heads = int(r.integer(o, "kv_heads", f, 0, 1 << 20));
  m.ffn_hidden = int(r.integer(o, "ffn_hidden", f, 0, 1 << 28));
  m.vocab = int(r.integer(o, "vocab", f, 1, 1 << 30));
  m.seq_len = int(r.integer(o, "seq_len", f, 1, 1 << 30));
  m.tied_embeddings = r.boolean(o, "tied_embeddings", f);
  // As floats, finite: to_json writes infinity as null, which would not parse back.
  auto finite = [&](const char* key) {
    const float v = float(r.number(o, key, f));
    if (!std::isfinite(v)) r.fail(f + "." + key, "is not a finite number");
    return v;
  };
  auto finite_in = [&](const json& in, const char* key, const std::string& field) {
    const float v = float(r.number(in, key, field));
    if (!std::isfinite(v) || v < 0) r.fail(field + "." + key, "is not a finite number >= 0");
    return v;
  };
  m.norm_eps = finite("norm_eps");
  if (o.contains("rope_theta")) m.rope_theta = finite("rope_theta");
  m.init_std = finite("init_std");
  // The block's description (model_block_json): absent in manifests written before it.
  if (o.contains("head_dim")) m.head_dim = int(r.integer(o, "head_dim", f, 1, 1 << 16));
  if (o.contains("qkv_bias")) m.qkv_bias = r.boolean(o, "qkv_bias", f);
  if (o.contains("qk_norm")) {
    m.qk_norm = r.string(o, "qk_norm", f);
    if (m.qk_norm != "none" && m.qk_norm != "head" && m.qk_norm != "whole") {
      r.fail(f + ".qk_norm", "is not none, head or whole");
    }
  }
  if (o.contains("norm_placement")) {
    m.norm_placement = r.string(o, "norm_placement", f);
    if (m.norm_placement != "pre" && m.norm_placement != "sandwich" && m.norm_placement != "post") {
      r.fail(f + ".norm_placement", "is not pre, sandwich or post");
    }
  }
  if (o.contains("mlp_act")) {
    m.mlp_act = r.string(o, "mlp_act", f);
    if (m.mlp_act != "silu" && m.mlp_act != "gelu_tanh") {
      r.fail(f + ".mlp_act", "is not silu or gelu_tanh");
    }
  }
  if (o.contains("embed_scale")) m.embed_scale = r.boolean(o, "embed_scale", f);
  for (auto [key, out] : {std::pair<const char*, float*>{"norm_offset", &m.norm_offset},
                          {"query_pre_attn_scalar", &m.query_pre_attn_scalar},
                          {"rope_local_theta", &m.rope_local_theta},
                          {"attn_logit_softcapping", &m.attn_logit_softcapping},
                          {"final_logit_softcapping", &m.final_logit_softcapping}}) {
    if (o.contains(key)) *out = finite(key);
  }
  if (o.contains("sliding_window")) {
    m.sliding_window = int(r.integer(o, "sliding_window", f, 0, 1 << 30));
  }
  if (o.contains("layer_types")) {
    for (const json& t : r.array(o, "layer_types", f)) {
      if (t != "sliding_attention" && t != "full_attention") {
        r.fail(f + ".layer_types",
               "holds something other than sliding_attention or full_attention");
      }
      m.layer_sliding.push_back(t == "sliding_attention");
    }
  }
  if (o.contains("rope_layers")) {
    for (const json& t : r.array(o, "rope_layers", f)) {
      if (t != 0 && t != 1) r.fail(f + ".rope_layers", "holds something other than 0 or 1");
      m.layer_rope.push_back(t == 1);
    }
  }
  if (o.contains("rope_scaling")) {
    const json& rs = o["rope_scaling"];
    const std::string g = f + ".rope_scaling";
    RopeScaling& s = m.rope_scaling;
    s.type = r.string(rs, "type", g);
    if (s.type != "linear" && s.type != "llama3" && s.type != "yarn") {
      r.fail(g + ".type", "is not linear, llama3 or yarn");
    }
    s.factor = float(r.number(rs, "factor", g));
    s.low_freq_factor = float(r.number(rs, "low_freq_factor", g));
    s.high_freq_factor = float(r.number(rs, "high_freq_factor", g));
    if (rs.contains("original_max_position_embeddings")) {
      s.original_max_positions =
          int(r.integer(rs, "original_max_position_embeddings", g, 1, 1 << 30));
    }
    s.beta_fast = float(r.number(rs, "beta_fast", g));
    s.beta_slow = float(r.number(rs, "beta_slow", g));
    s.attention_factor = float(r.number(rs, "attention_factor", g));
  }
  if (o.contains("moe")) {  // a mixture of experts (model_config.h MoeConfig)
    const json& e = o["moe"];
    const std::string g = f + ".moe";
    MoeConfig& x = m.moe;
    x.experts = int(r.integer(e, "experts", g, 1, 1 << 20));
    x.top_k = int(r.integer(e, "top_k", g, 1, x.experts));
    x.ffn_hidden = int(r.integer(e, "ffn_hidden", g, 1, 1 << 28));
    x.shared_ffn_hidden = int(r.integer(e, "shared_ffn_hidden", g, 0, 1 << 28));
    x.shared_gate = r.boolean(e, "shared_gate", g);
    x.norm_topk_prob = r.boolean(e, "norm_topk_prob", g);
    x.router = r.string(e, "router", g);
    if (x.router != "softmax" && x.router != "sigmoid") {
      r.fail(g + ".router", "is not softmax or sigmoid");
    }
    if (x.router == "sigmoid") {  // DeepSeek-V3's: its groups, scaling and bias rate
      x.n_group = int(r.integer(e, "n_group", g, 1, 64));
      x.topk_group = int(r.integer(e, "topk_group", g, 1, x.n_group));
      if (x.experts % x.n_group != 0 || x.experts / x.n_group < 2 ||
          x.top_k > x.topk_group * (x.experts / x.n_group)) {
        r.fail(g + ".n_group", "does not split the experts into groups the router can choose from");
      }
      x.routed_scaling_factor = finite_in(e, "routed_scaling_factor", g);
      x.expert_bias_update_rate = finite_in(e, "expert_bias_update_rate", g);
      if (!(x.routed_scaling_factor > 0)) r.fail(g + ".routed_scaling_factor", "is not positive");
    }
    x.decoder_sparse_step = int(r.integer(e, "decoder_sparse_step", g, 1, 1 << 20));
    for (const json& l : r.array(e, "mlp_only_layers", g)) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= m.layers) {
        r.fail(g + ".mlp_only_layers", "holds something other than a layer index");
      }
      x.mlp_only_layers.push_back(l.get<int>());
    }
    if (e.contains("capacity_factor")) {
      x.capacity_factor = finite_in(e, "capacity_factor", g);
      x.capacity_scope = r.string(e, "capacity_scope", g);
      x.drop_policy = r.string(e, "drop_policy", g);
      if (x.capacity_scope != "sequence" && x.capacity_scope != "micro_batch") {
        r.fail(g + ".capacity_scope", "is not sequence or micro_batch");
      }
      if (x.drop_policy != "probs" && x.drop_policy != "position") {
        r.fail(g + ".drop_policy", "is not probs or position");
      }
    }
    x.aux_loss = r.string(e, "aux_loss", g);
    if (x.aux_loss != "pooled" && x.aux_loss != "per_layer") {
      r.fail(g + ".aux_loss", "is not pooled or per_layer");
    }
    x.router_aux_loss_coef = finite_in(e, "router_aux_loss_coef", g);
    x.z_loss_coef = finite_in(e, "z_loss_coef", g);
  }
  return m;
}

}  // namespace

std::string to_json(const Manifest& m) {
  json j;
  j["format"] = m.format;
  j["model"] = model_json(m.model);
  j["optimizer"] = m.optimizer;
  j["step"] = m.step;
  j["optimizer_steps"] = m.optimizer_steps;
  j["consumed_samples"] = m.consumed_samples;
  j["seed"] = m.seed;
  j["scaler"] = {{"scale", m.scaler.scale},
                 {"iter", m.scaler.iter},
                 {"last_overflow_iter", m.scaler.last_overflow_iter},
                 {"hysteresis_left", m.scaler.hysteresis_left}};
  j["layout"] = m.layout;
  if (!m.expert_bias.empty()) {
    json bias = json::object();  // each float's shortest decimal that reads back to it
    for (const auto& [layer, b] : m.expert_bias) bias[std::to_string(layer)] = b;
    j["expert_bias"] = bias;
  }
  json tensors = json::object();
  for (const auto& [name, shape] : m.tensors) tensors[name] = shape;
  j["tensors"] = tensors;
  json files = json::array();
  for (const Manifest::File& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = files;
  json chunks = json::array();
  for (const Chunk& c : m.chunks) {
    json runs = json::array();
    for (const Run& r : c.runs) runs.push_back({r.global, r.len, r.count, r.stride});
    chunks.push_back({{"kind", c.kind},
                      {"tensor", c.tensor},
                      {"file", c.file},
                      {"offset", c.offset},
                      {"numel", c.numel},
                      {"crc32c", c.crc32c},
                      {"runs", runs}});
  }
  j["chunks"] = chunks;
  return j.dump(1);
}

Manifest parse_manifest(const std::string& text, const std::string& what) {
  const Reader r(what);
  // Nesting is bounded before parsing (nlohmann recurses per level).
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') in_string = true;
    if (ch == '[' || ch == '{') {
      if (++depth > 8) r.fail("the JSON", "is nested deeper than a manifest is");
    }
    if (ch == ']' || ch == '}') --depth;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    r.fail("the JSON", std::string("does not parse (") + e.what() + ")");
  }
  Manifest m;
  m.format = int(r.integer(j, "format", "manifest", 0, 1 << 20));
  if (m.format != kFormatVersion) {
    r.fail("format", "is " + std::to_string(m.format) + "; this strata reads format " +
                         std::to_string(kFormatVersion));
  }
  m.model = parse_model(r, r.at(j, "model", "manifest"));
  m.optimizer = r.string(j, "optimizer", "manifest");
  m.step = r.integer(j, "step", "manifest", 0, kMaxInt);
  m.optimizer_steps = r.integer(j, "optimizer_steps", "manifest", 0, m.step);
  m.consumed_samples = r.integer(j, "consumed_samples", "manifest", 0, kMaxInt);
  {
    const json& v = r.at(j, "seed", "manifest");
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      r.fail("seed", "is not a non-negative integer");
    }
    m.seed = v.get<uint64_t>();
  }
  const json& s = r.at(j, "scaler", "manifest");
  m.scaler.scale = float(r.number(s, "scale", "scaler"));
  if (!(m.scaler.scale > 0.0f) || !std::isfinite(m.scaler.scale)) {
    r.fail("scaler.scale", "is not a positive finite number");
  }
  m.scaler.iter = r.integer(s, "iter", "scaler", 0, kMaxInt);
  m.scaler.last_overflow_iter = r.integer(s, "last_overflow_iter", "scaler", -1, kMaxInt);
  m.scaler.hysteresis_left = int(r.integer(s, "hysteresis_left", "scaler", 0, 1 << 20));
  m.layout = r.string(j, "layout", "manifest");
  if (j.contains("expert_bias")) {
    const json& bias = j.at("expert_bias");
    if (!bias.is_object()) r.fail("expert_bias", "is not an object of MoE layers");
    for (const auto& [layer, values] : bias.items()) {
      const bool layer_ok = !layer.empty() && layer.size() <= 7 &&
                            layer.find_first_not_of("0123456789") == std::string::npos;
      const int l = layer_ok ? std::stoi(layer) : -1;
      if (!layer_ok || l >= m.model.layers || !m.model.moe_layer(l)) {
        r.fail("expert_bias." + layer, "is not a MoE layer of the model");
      }
      if (!values.is_array() || int64_t(values.size()) != m.model.moe.experts) {
        r.fail("expert_bias." + layer,
               "is not a list of the " + std::to_string(m.model.moe.experts) + " experts' biases");
      }
      std::vector<float>& out = m.expert_bias[l];
      for (const json& v : values) {
        if (!v.is_number() || !std::isfinite(v.get<double>())) {
          r.fail("expert_bias." + layer, "holds something that is not a finite number");
        }
        out.push_back(v.get<float>());
      }
    }
  }

  const json& tensors = r.at(j, "tensors", "manifest");
  if (!tensors.is_object()) r.fail("tensors", "is not an object");
  std::map<std::string, int64_t> numel;
  for (const auto& [name, shape] : tensors.items()) {
    if (!shape.is_array() || shape.empty() || shape.size() > 2) {
      r.fail("tensors." + name, "is not a shape of 1 or 2 dimensions");
    }
    std::vector<int64_t> dims;
    int64_t n = 1;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > kMaxInt) {
        r.fail("tensors." + name, "has a dimension that is not a positive integer");
      }
      dims.push_back(d.get<int64_t>());
      // Checked before multiplying: two dimensions of up to kMaxInt overflow int64.
      if (dims.back() > kMaxInt / n) r.fail("tensors." + name, "has more elements than any model");
      n *= dims.back();
    }
    m.tensors[name] = dims;
    numel[name] = n;
  }

  for (const json& f : r.array(j, "files", "manifest")) {
    Manifest::File file;
    file.name = r.string(f, "name", "files[]");
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name[0] == '.') {
      r.fail("files[].name", "\"" + file.name + "\" is not a plain file name");
    }
    file.bytes = r.integer(f, "bytes", "files[]", 0, kMaxInt * 8);
    m.files.push_back(file);
  }
  const json& chunks = r.array(j, "chunks", "manifest");
  m.chunks.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& c = chunks[i];
    const std::string f = "chunks[" + std::to_string(i) + "]";
    Chunk k;
    k.kind = r.string(c, "kind", f);
    if (!known_kind(k.kind)) r.fail(f + ".kind", "\"" + k.kind + "\" is not a stored kind");
    k.tensor = r.string(c, "tensor", f);
    const auto t = numel.find(k.tensor);
    if (t == numel.end()) r.fail(f + ".tensor", "\"" + k.tensor + "\" is not in tensors");
    k.file = int(r.integer(c, "file", f, 0, int64_t(m.files.size()) - 1));
    k.numel = r.integer(c, "numel", f, 0, t->second);
    k.offset = r.integer(c, "offset", f, 0, m.files[size_t(k.file)].bytes);
    if (k.offset + 4 * k.numel > m.files[size_t(k.file)].bytes) {
      r.fail(f, "reaches past the end of " + m.files[size_t(k.file)].name);
    }
    k.crc32c = uint32_t(r.integer(c, "crc32c", f, 0, UINT32_MAX));
    int64_t total = 0;
    for (const json& run : r.array(c, "runs", f)) {
      if (!run.is_array() || run.size() != 4) r.fail(f + ".runs", "has an entry not of 4 integers");
      int64_t v[4];
      for (int q = 0; q < 4; ++q) {
        if (!run[size_t(q)].is_number_integer()) r.fail(f + ".runs", "has a non-integer entry");
        v[q] = run[size_t(q)].get<int64_t>();
      }
      const Run x{v[0], v[1], v[2], v[3]};
      const int64_t n = t->second;
      // Within the tensor, without overflow: the last segment ends by n.
      bool ok = x.global >= 0 && x.len >= 1 && x.len <= n && x.global <= n - x.len &&
                x.count >= 1 && x.stride >= 0;
      if (ok && x.count > 1) {
        ok = x.stride >= x.len && x.count - 1 <= (n - x.len - x.global) / x.stride;
      }
      if (!ok) r.fail(f + ".runs", "has a run outside " + k.tensor);
      total += x.len * x.count;
      if (total > k.numel) r.fail(f + ".runs", "cover more elements than the chunk holds");
      k.runs.push_back(x);
    }
    if (total != k.numel) r.fail(f + ".runs", "cover fewer elements than the chunk holds");
    m.chunks.push_back(std::move(k));
  }
  return m;
}

std::string model_difference(const ModelConfig& saved, const ModelConfig& here) {
  auto diff = [](const char* what, const auto& a, const auto& b) -> std::string {
    std::ostringstream o;
    if (a == b) return "";
    o << what << " " << a << " in the checkpoint, " << b << " here";
    return o.str();
  };
  for (const std::string& d :
       {diff("family", saved.family, here.family),
        diff("layers", saved.layers, here.layers),
        diff("hidden", saved.hidden, here.hidden),
        diff("heads", saved.heads, here.heads),
        diff("kv_heads", saved.kv_heads, here.kv_heads),
        diff("ffn_hidden", saved.ffn_hidden, here.ffn_hidden),
        diff("vocab", saved.vocab, here.vocab),
        diff("seq_len", saved.seq_len, here.seq_len),
        diff("tied_embeddings", saved.tied_embeddings, here.tied_embeddings),
        diff("norm_eps", saved.norm_eps, here.norm_eps),
        diff("rope_theta", saved.rope_theta, here.rope_theta),
        diff("head_dim", saved.hd(), here.hd()),
        diff("qkv_bias", saved.qkv_bias, here.qkv_bias),
        diff("qk_norm", saved.qk_norm, here.qk_norm),
        diff("norm_placement", saved.norm_placement, here.norm_placement),
        diff("norm_offset", saved.norm_offset, here.norm_offset),
        diff("mlp_act", saved.mlp_act, here.mlp_act),
        diff("embed_scale", saved.embed_scale, here.embed_scale),
        diff("query_pre_attn_scalar", saved.query_pre_attn_scalar, here.query_pre_attn_scalar),
        diff("rope_local_theta", saved.rope_local_theta, here.rope_local_theta),
        diff("attn_logit_softcapping", saved.attn_logit_softcapping, here.attn_logit_softcapping),
        diff("final_logit_softcapping", saved.final_logit_softcapping,
             here.final_logit_softcapping),
        diff("sliding_window", saved.sliding_window, here.sliding_window),
        diff("layer_types", model_block_json(saved).value("layer_types", json()).dump(),
             model_block_json(here).value("layer_types", json()).dump()),
        diff("rope_layers", model_block_json(saved).value("rope_layers", json()).dump(),
             model_block_json(here).value("rope_layers", json()).dump()),
        diff("rope_scaling", model_block_json(saved).value("rope_scaling", json()).dump(),
             model_block_json(here).value("rope_scaling", json()).dump()),
        diff("moe", model_block_json(saved).value("moe", json()).dump(),
             model_block_json(here).value("moe", json()).dump())}) {
    if (!d.empty()) return d;
  }
  return "";
}

}  // namespace strata::ckpt
