// strata's own blocks: model (presets and derived fields), parallelism, data, train.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/config/internal.h"
#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata {

namespace {

struct Preset {
  const char* name;
  ModelConfig m;  // kv_heads / ffn_hidden 0 where finalize_model derives them
};

ModelConfig preset_model(const char* family, int layers, int hidden, int heads, int kv_heads,
                         int ffn_hidden, int vocab, int seq_len, bool tied,
                         float rope_theta = 10000.0f) {
  ModelConfig m;
  m.family = family;
  m.layers = layers, m.hidden = hidden, m.heads = heads, m.kv_heads = kv_heads;
  m.ffn_hidden = ffn_hidden, m.vocab = vocab, m.seq_len = seq_len;
  m.tied_embeddings = tied;
  m.rope_theta = rope_theta;
  return m;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"gpt2-tiny", preset_model("gpt2", 2, 32, 4, 0, 0, 64, 16, true)},
      {"llama-tiny", preset_model("llama", 2, 32, 4, 2, 64, 64, 16, false)},
      // The byte-level demo: 256 bytes + end-of-text.
      {"demo", preset_model("gpt2", 4, 128, 4, 0, 0, 257, 128, true)},
      {"llama-demo", preset_model("llama", 4, 128, 4, 2, 352, 257, 128, false)},
      {"bench-23M", preset_model("gpt2", 6, 512, 8, 0, 0, 8192, 256, true)},
      {"gpt2-124M", preset_model("gpt2", 12, 768, 12, 0, 0, 50304, 1024, true)},
      {"gpt2-350M", preset_model("gpt2", 24, 1024, 16, 0, 0, 50304, 1024, true)},
      {"llama-1B", preset_model("llama", 16, 2048, 32, 8, 8192, 128256, 2048, false, 500000.0f)},
  };
  return p;
}

// The preset before finalize_model; `what` names the key in errors.
ModelConfig raw_preset(const std::string& name, std::string_view what) {
  for (const Preset& p : presets()) {
    if (name == p.name) {
      ModelConfig m = p.m;
      m.preset = name;
      return m;
    }
  }
  const std::vector<std::string> names = model_preset_names();
  STRATA_INPUT_FAIL(what, " \"", name, "\" is not a preset; did you mean \"",
                    config_detail::nearest(name, names),
                    "\"? presets: ", config_detail::list(names, false));
}

// Why tensor-parallel size t cannot split model m (its query heads, KV heads and MLP) or, with
// sequence parallelism, a micro-batch of `micro_batch` sequences (0: unknown, not checked); ""
// when it can. The vocabulary needs no rule: it is padded to a multiple of t.
std::string tensor_split_error(const ModelConfig& m, int t, bool sequence_parallel,
                               int64_t micro_batch, int context = 1) {
  using detail::concat;
  if (m.heads % t != 0) {
    return concat("model.heads=", m.heads, " is not divisible by parallelism.tensor=", t,
                  ": each tensor-parallel rank computes whole attention heads");
  }
  if (m.kv_heads >= t && m.kv_heads % t != 0) {
    return concat("model.kv_heads=", m.kv_heads, " is not divisible by parallelism.tensor=", t,
                  ": each tensor-parallel rank holds whole KV heads (with fewer KV heads than "
                  "ranks, kv_heads must divide the tensor size instead)");
  }
  if (m.kv_heads < t && t % m.kv_heads != 0) {
    return concat("parallelism.tensor=", t, " is not a multiple of model.kv_heads=", m.kv_heads,
                  ": with fewer KV heads than tensor-parallel ranks each KV head is replicated on "
                  "tensor/kv_heads ranks, which must be a whole number");
  }
  if (m.qk_norm == "whole" && m.kv_heads < t) {
    return concat(
        "model.qk_norm \"whole\" (OLMo 2) normalises all of a token's key heads "
        "together, which needs whole key heads on every tensor-parallel rank: "
        "parallelism.tensor=",
        t, " exceeds model.kv_heads=", m.kv_heads);
  }
  if (m.ffn_hidden % t != 0) {
    return concat("model.ffn_hidden=", m.ffn_hidden, " is not divisible by parallelism.tensor=", t,
                  ": the MLP's hidden units are split across the tensor-parallel ranks");
  }
  const std::pair<const char*, int> expert_sizes[] = {
      {"model.moe.ffn_hidden", m.moe.experts > 0 ? m.moe.ffn_hidden : 0},
      {"model.moe.shared_ffn_hidden", m.moe.shared_ffn_hidden}};
  for (const auto& [key, n] : expert_sizes) {
    if (n % t != 0) {
      return concat(key, "=", n, " is not divisible by parallelism.tensor=", t,
                    ": each expert's hidden units are split across the tensor-parallel ranks");
    }
  }
  // (B·T) % t without forming B·T, which a huge micro batch would overflow; T is this rank's
  // part of each sequence under context parallelism.
  const int T = m.seq_len % context == 0 ? m.seq_len / context : m.seq_len;
  if (sequence_parallel && micro_batch > 0 && (micro_batch % t) * (T % t) % t != 0) {
    int64_t rows = 0;
    const bool fits = !__builtin_mul_overflow(micro_batch, int64_t(T), &rows);
    return concat(
        "train_micro_batch_size_per_gpu=", micro_batch, " x ",
        context > 1 ? concat("model.seq_len/parallelism.context=", T) : concat("model.seq_len=", T),
        fits ? concat(" = ", rows) : std::string(),
        " token rows is not divisible by parallelism.tensor=", t,
        ": parallelism.sequence_parallel splits each micro-batch's rows across the "
        "tensor-parallel ranks; make train_micro_batch_size_per_gpu a multiple of ",
        t / std::gcd(t, T), " or set parallelism.sequence_parallel to false");
  }
  return "";
}

bool moe_family(const std::string& family) {
  return family == "mixtral" || family == "qwen2_moe" || family == "qwen3_moe";
}

// The moe block's rules (model_config.h MoeConfig); the routed experts' ffn_hidden defaults to
// the dense MLP's (Mixtral has one size for both).
void finalize_moe(ModelConfig& m) {
  MoeConfig& e = m.moe;
  if (e.experts == 0) {
    STRATA_INPUT_CHECK(!moe_family(m.family), "model.family \"", m.family,
                       "\" is a mixture of experts: give model.moe.experts (the routed experts "
                       "per MoE layer) and model.moe.top_k (the experts each token goes to)");
    return;
  }
  STRATA_INPUT_CHECK(!m.gpt2_block(),
                     "model.moe describes SwiGLU experts, which family gpt2 (a GELU MLP with "
                     "biases) does not have: use a RoPE family such as \"mixtral\" or "
                     "\"qwen3_moe\"");
  STRATA_INPUT_CHECK(e.top_k >= 1 && e.top_k <= e.experts, "model.moe.top_k=", e.top_k,
                     " must be between 1 and model.moe.experts=", e.experts,
                     ": each token goes to top_k distinct experts");
  STRATA_INPUT_CHECK(m.mlp_act == "silu", "model.moe's experts are SwiGLU MLPs; model.mlp_act \"",
                     m.mlp_act, "\" is not supported with them: remove model.mlp_act");
  STRATA_INPUT_CHECK(m.norm_placement == "pre",
                     "model.moe follows pre norms only; "
                     "model.norm_placement \"",
                     m.norm_placement, "\" is not supported with it");
  if (e.ffn_hidden == 0) e.ffn_hidden = m.ffn_hidden;
  // Qwen2-MoE's gate (the family's default) gates a shared expert where the model has one.
  if (e.shared_ffn_hidden == 0) e.shared_gate = false;
  for (int l : e.mlp_only_layers) {
    STRATA_INPUT_CHECK(l >= 0 && l < m.layers, "model.moe.mlp_only_layers names layer ", l,
                       ", but the model has layers 0 to ", m.layers - 1);
  }
  if (e.router == "sigmoid") {
    STRATA_INPUT_CHECK(e.n_group >= 1 && e.n_group <= 64 && e.experts % e.n_group == 0 &&
                           e.experts / e.n_group >= 2,
                       "model.moe.n_group=", e.n_group,
                       " must divide model.moe.experts=", e.experts,
                       " into at most 64 groups of at least 2 experts (a group's "
                       "score is the sum of its two best)");
    STRATA_INPUT_CHECK(e.topk_group >= 1 && e.topk_group <= e.n_group,
                       "model.moe.topk_group=", e.topk_group,
                       " must be between 1 and model.moe.n_group=", e.n_group);
    STRATA_INPUT_CHECK(e.top_k <= e.topk_group * (e.experts / e.n_group),
                       "model.moe.top_k=", e.top_k, " exceeds the ",
                       e.topk_group * (e.experts / e.n_group),
                       " experts of the topk_group=", e.topk_group, " groups a token chooses from");
    STRATA_INPUT_CHECK(e.z_loss_coef == 0,
                       "model.moe.router \"sigmoid\" has no router z-loss (its scores are not a "
                       "softmax): set model.moe.z_loss_coef to 0");
    STRATA_INPUT_CHECK(e.router_aux_loss_coef == 0 || e.aux_loss == "per_layer",
                       "model.moe.router \"sigmoid\" balances each layer's sequences "
                       "(DeepSeek-V3's sequence-wise loss): set model.moe.aux_loss \"per_layer\"");
  }
  STRATA_INPUT_CHECK(m.moe_layers() > 0,
                     "model.moe makes no layer a mixture of experts: "
                     "decoder_sparse_step=",
                     e.decoder_sparse_step,
                     " and mlp_only_layers leave "
                     "every one of the ",
                     m.layers, " layers dense; remove model.moe or lower them");
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig m = raw_preset(name, "model preset");
  finalize_model(m);
  return m;
}

void family_defaults(ModelConfig& m) {
  const bool gemma = m.family == "gemma2" || m.family == "gemma3";
  m.tied_embeddings = m.family == "gpt2" || gemma;
  m.qkv_bias = m.family == "qwen2" || m.family == "qwen2_moe";
  // The MoE families' experts: Mixtral renormalises the top-k probabilities, Qwen does not
  // (transformers' defaults); Qwen2-MoE gates its shared expert. Their sizes are the moe block's.
  m.moe.norm_topk_prob = m.family == "mixtral";
  m.moe.shared_gate = m.family == "qwen2_moe";
  m.qk_norm = m.family == "qwen3" || m.family == "qwen3_moe" || m.family == "gemma3" ? "head"
              : m.family == "olmo2"                                                  ? "whole"
                                                                                     : "none";
  m.norm_placement = gemma ? "sandwich" : m.family == "olmo2" ? "post" : "pre";
  m.norm_offset = gemma ? 1.0f : 0.0f;
  m.mlp_act = gemma ? "gelu_tanh" : "silu";
  m.embed_scale = gemma;
  m.layer_rope.clear();
}

void finalize_model(ModelConfig& m) {
  const std::vector<std::string>& families = model_families();
  if (std::find(families.begin(), families.end(), m.family) == families.end()) {
    STRATA_INPUT_FAIL("model.family must be one of ", config_detail::list(families, false),
                      ", got \"", m.family, "\"");
  }
  const std::pair<const char*, int> positive[] = {{"layers", m.layers},
                                                  {"hidden", m.hidden},
                                                  {"heads", m.heads},
                                                  {"vocab", m.vocab},
                                                  {"seq_len", m.seq_len}};
  for (const auto& [key, v] : positive) {
    STRATA_INPUT_CHECK(v > 0, "model.", key, " must be > 0, got ", v);
  }
  STRATA_INPUT_CHECK(m.kv_heads >= 0, "model.kv_heads must be > 0, got ", m.kv_heads);
  STRATA_INPUT_CHECK(m.ffn_hidden >= 0, "model.ffn_hidden must be > 0, got ", m.ffn_hidden);
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.ffn_hidden == 0) {
    if (m.family == "gpt2") {
      m.ffn_hidden = 4 * m.hidden;
    } else {  // Llama: 2/3 of 4·hidden, rounded up to a multiple of 256
      const int64_t h = 2 * (4 * int64_t(m.hidden)) / 3;
      m.ffn_hidden = int(256 * ((h + 255) / 256));
    }
  }
  STRATA_INPUT_CHECK(m.head_dim > 0 || m.hidden % m.heads == 0, "model.hidden=", m.hidden,
                     " is not divisible by model.heads=", m.heads,
                     "; the head dimension is hidden/heads unless model.head_dim is given: "
                     "choose heads that divide hidden, or set head_dim");
  STRATA_INPUT_CHECK(m.heads % m.kv_heads == 0, "model.heads=", m.heads,
                     " is not divisible by model.kv_heads=", m.kv_heads,
                     "; each KV head serves heads/kv_heads query heads: choose kv_heads that "
                     "divides heads");
  if (m.family == "gpt2") {
    STRATA_INPUT_CHECK(m.kv_heads == m.heads, "model.kv_heads=", m.kv_heads,
                       " differs from model.heads=", m.heads,
                       ", but family gpt2 has no grouped-query attention; remove model.kv_heads "
                       "or use family \"llama\"");
    const bool plain = m.head_dim == 0 && !m.qkv_bias && m.qk_norm == "none" &&
                       m.sliding_window == 0 && m.layer_sliding.empty() && m.layer_rope.empty() &&
                       m.rope_scaling.type == "none" && m.norm_placement == "pre" &&
                       m.norm_offset == 0.0f && m.mlp_act == "silu" && !m.embed_scale &&
                       m.query_pre_attn_scalar == 0.0f && m.rope_local_theta == 0.0f &&
                       m.attn_logit_softcapping == 0.0f && m.final_logit_softcapping == 0.0f;
    STRATA_INPUT_CHECK(plain,
                       "model.head_dim, qkv_bias, qk_norm, norm_placement, norm_offset, mlp_act, "
                       "embed_scale, query_pre_attn_scalar, the soft-caps, sliding_window, "
                       "layer_types, rope_layers, "
                       "rope_scaling and rope_local_theta describe the RoPE families' blocks; "
                       "family gpt2 has its own (biases everywhere, learned positions): remove "
                       "them");
  } else {
    STRATA_INPUT_CHECK(m.hd() % 2 == 0 && m.hd() <= 2 * ops::Rope::kMaxHalf, "the head dimension ",
                       m.hd(), m.head_dim > 0 ? " (model.head_dim)" : " (model.hidden/model.heads)",
                       " must be even and at most ", 2 * ops::Rope::kMaxHalf, ": RoPE (family ",
                       m.family, ") rotates pairs of dimensions; choose an even head dimension");
    if (m.family == "smollm3" && m.layer_rope.empty()) {
      // SmolLM3 leaves RoPE out on every fourth layer (transformers' no_rope_layer_interval 4).
      for (int l = 0; l < m.layers; ++l) m.layer_rope.push_back((l + 1) % 4 != 0);
    }
    const std::pair<const char*, const std::vector<char>*> per_layer[] = {
        {"layer_types", &m.layer_sliding}, {"rope_layers", &m.layer_rope}};
    for (const auto& [key, v] : per_layer) {
      STRATA_INPUT_CHECK(v->empty() || int(v->size()) == m.layers, "model.", key, " lists ",
                         v->size(), " layers, but model.layers=", m.layers,
                         ": give one entry per layer");
    }
    STRATA_INPUT_CHECK(m.layer_sliding.empty() || m.sliding_window > 0,
                       "model.layer_types marks sliding-attention layers, but "
                       "model.sliding_window is not given: set the window's length");
    const RopeScaling& r = m.rope_scaling;
    STRATA_INPUT_CHECK(std::isfinite(r.factor) && r.factor > 0,
                       "model.rope_scaling.factor must be a finite number > 0, got ", r.factor);
    if (r.type == "llama3" || r.type == "yarn") {
      STRATA_INPUT_CHECK(r.original_max_positions > 0, "model.rope_scaling type \"", r.type,
                         "\" needs original_max_position_embeddings (the context length "
                         "trained before scaling)");
    }
    if (r.type == "llama3") {
      STRATA_INPUT_CHECK(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
                         "model.rope_scaling (llama3) needs 0 < low_freq_factor < "
                         "high_freq_factor, got ",
                         r.low_freq_factor, " and ", r.high_freq_factor);
    }
    if (r.type == "yarn") {
      STRATA_INPUT_CHECK(r.beta_fast > r.beta_slow && r.beta_slow > 0 &&
                             std::isfinite(r.attention_factor) && r.attention_factor >= 0,
                         "model.rope_scaling (yarn) needs beta_fast > beta_slow > 0 and an "
                         "attention_factor >= 0 (0: 0.1 ln(factor) + 1)");
    }
  }
  finalize_moe(m);
  STRATA_INPUT_CHECK(std::isfinite(m.norm_eps) && m.norm_eps > 0,
                     "model.norm_eps must be a finite number > 0, got ", m.norm_eps);
  STRATA_INPUT_CHECK(std::isfinite(m.rope_theta) && m.rope_theta > 0,
                     "model.rope_theta must be a finite number > 0, got ", m.rope_theta);
  STRATA_INPUT_CHECK(std::isfinite(m.init_std) && m.init_std > 0,
                     "model.init_std must be a finite number > 0, got ", m.init_std);
}

}  // namespace strata

namespace strata::config_detail {

std::string context_split_error(const ModelConfig& m, int tp, int cp, const std::string& impl) {
  using detail::concat;
  if (cp == 1) return "";
  if (impl == "ring") {
    if (m.seq_len % (2 * cp) != 0) {
      return concat("model.seq_len=", m.seq_len,
                    " is not divisible by 2 x parallelism.context=", 2 * cp,
                    ": ring attention gives each context-parallel rank two zig-zag chunks of "
                    "every sequence (balancing the causal work); choose a seq_len that is a "
                    "multiple of ",
                    2 * cp);
    }
    return "";
  }
  if (m.seq_len % cp != 0) {
    return concat("model.seq_len=", m.seq_len, " is not divisible by parallelism.context=", cp,
                  ": each context-parallel rank holds an equal part of every sequence");
  }
  // Ulysses gives each context-parallel rank whole key/value groups of this tensor rank's.
  const int groups = m.kv_heads >= tp ? m.kv_heads / tp : 1;
  if (groups % cp != 0) {
    return concat(
        "parallelism.context_impl \"ulysses\" with parallelism.context=", cp,
        " needs this tensor-parallel rank's ", groups,
        " key/value head group(s) (model.kv_heads=", m.kv_heads, " / parallelism.tensor=", tp,
        ") to divide among the context-parallel ranks: the all-to-all hands each rank whole "
        "groups; use parallelism.context_impl \"ring\", a context size dividing ",
        groups, ", or fewer tensor-parallel ranks");
  }
  return "";
}

void check_tensor_split(const Config& c, int64_t micro_batch) {
  const ParallelismConfig& p = c.parallelism;
  const std::string context_error =
      context_split_error(c.model, p.tensor, p.context, p.context_impl);
  if (!context_error.empty()) STRATA_INPUT_FAIL(context_error);
  const MoeConfig& e = c.model.moe;
  if (e.experts > 0 && e.capacity_factor > 0 && e.capacity_scope == "sequence" &&
      p.whole_experts() && micro_batch > 0 && micro_batch % p.tensor != 0) {
    STRATA_INPUT_FAIL(
        "model.moe.capacity_scope \"sequence\" ranks each sequence's tokens for an expert's "
        "capacity, but with parallelism.expert_tensor=1 each of the ",
        p.tensor,
        " tensor-parallel ranks routes its own block of a micro-batch's rows, which holds whole "
        "sequences only when train_micro_batch_size_per_gpu (",
        micro_batch, ") is a multiple of ", p.tensor,
        ": choose such a micro-batch, capacity_scope \"micro_batch\", or no capacity_factor");
  }
  const std::string error =
      tensor_split_error(c.model, p.tensor, p.sequence_parallel, micro_batch, p.context);
  if (error.empty()) return;
  // Sizes beyond 64 ranks are left out: a tensor-parallel group stays inside one host.
  std::string valid;
  for (int t = 1; t <= 64; ++t) {
    if (!tensor_split_error(c.model, t, p.sequence_parallel, micro_batch, p.context).empty()) {
      continue;
    }
    valid += (valid.empty() ? "" : ", ") + std::to_string(t);
  }
  STRATA_INPUT_FAIL(error, "; valid values of parallelism.tensor: ", valid);
}

// parallelism.expert > 1: what the model allows (the world's sizes are checked where they are
// known, check_expert_grid).
void check_expert_split(const Config& c) {
  const ParallelismConfig& p = c.parallelism;
  const MoeConfig& e = c.model.moe;
  if (c.model.layers == 0) return;  // the model block's own errors are listed already
  STRATA_INPUT_CHECK(e.experts > 0, "parallelism.expert=", p.expert,
                     " places a mixture of experts' experts over ranks, but the model has none "
                     "(model.moe): remove parallelism.expert or give the model a moe block");
  STRATA_INPUT_CHECK(e.experts % p.expert == 0, "parallelism.expert=", p.expert,
                     " does not divide model.moe.experts=", e.experts,
                     ": each expert-parallel rank holds an equal share of the experts; choose a "
                     "divisor of ",
                     e.experts);
}

// model.moe (model_config.h MoeConfig).
void parse_moe(const Block& b, ModelConfig& m) {
  Block e = b.child("moe", {"experts", "top_k", "ffn_hidden", "shared_ffn_hidden", "shared_gate",
                            "norm_topk_prob", "router", "decoder_sparse_step", "mlp_only_layers",
                            "capacity_factor", "capacity_scope", "drop_policy", "aux_loss",
                            "router_aux_loss_coef", "z_loss_coef", "n_group", "topk_group",
                            "routed_scaling_factor", "expert_bias_update_rate"});
  if (!e.present()) return;
  MoeConfig& o = m.moe;
  if (!e.get_int("experts", o.experts, 1)) {
    if (!e.has("experts")) b.fail("moe", "an object with \"experts\" (the routed experts)");
  }
  if (!e.get_int("top_k", o.top_k, 1) && !e.has("top_k")) {
    b.fail("moe", "an object with \"top_k\" (the experts each token goes to)");
  }
  e.get_int("ffn_hidden", o.ffn_hidden, 1);
  e.get_int("shared_ffn_hidden", o.shared_ffn_hidden, 0);
  if (e.get_bool("shared_gate", o.shared_gate) && o.shared_gate && o.shared_ffn_hidden == 0) {
    STRATA_INPUT_FAIL(
        "model.moe.shared_gate gates the shared expert, but "
        "model.moe.shared_ffn_hidden is 0 (none): give its size, or remove "
        "shared_gate");
  }
  e.get_bool("norm_topk_prob", o.norm_topk_prob);
  e.get_choice("router", o.router, {"softmax", "sigmoid"});
  const bool grouped = e.get_int("n_group", o.n_group, 1);
  if (!e.get_int("topk_group", o.topk_group, 1)) o.topk_group = o.n_group;
  e.get_number("routed_scaling_factor", o.routed_scaling_factor, 0.0, HUGE_VAL, true);
  e.get_number("expert_bias_update_rate", o.expert_bias_update_rate, 0.0, HUGE_VAL, false);
  const bool sigmoid_keys = grouped || e.has("topk_group") || e.has("routed_scaling_factor") ||
                            e.has("expert_bias_update_rate");
  if (sigmoid_keys && o.router != "sigmoid") {
    STRATA_INPUT_FAIL(
        "model.moe.n_group, topk_group, routed_scaling_factor and expert_bias_update_rate "
        "belong to the sigmoid router (DeepSeek-V3's); set model.moe.router \"sigmoid\" or "
        "remove them");
  }
  e.get_int("decoder_sparse_step", o.decoder_sparse_step, 1);
  if (e.has("mlp_only_layers")) {
    const json& v = e.at("mlp_only_layers");
    o.mlp_only_layers.clear();
    for (const json& l : v.is_array() ? v : json::array({nullptr})) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > 1000000) {
        e.fail("mlp_only_layers", "a list of layer indices whose MLP stays dense");
      }
      o.mlp_only_layers.push_back(l.get<int>());
    }
  }
  e.get_number("capacity_factor", o.capacity_factor, 0.0, HUGE_VAL, true);
  e.get_choice("capacity_scope", o.capacity_scope, {"sequence", "micro_batch"});
  e.get_choice("drop_policy", o.drop_policy, {"probs", "position"});
  if ((e.has("capacity_scope") || e.has("drop_policy")) && o.capacity_factor == 0) {
    STRATA_INPUT_FAIL(
        "model.moe.capacity_scope and drop_policy say how tokens are dropped by a "
        "capacity, and model.moe.capacity_factor gives none (dropless): give "
        "capacity_factor, or remove them");
  }
  e.get_choice("aux_loss", o.aux_loss, {"pooled", "per_layer"});
  e.get_number("router_aux_loss_coef", o.router_aux_loss_coef, 0.0, HUGE_VAL, false);
  e.get_number("z_loss_coef", o.z_loss_coef, 0.0, HUGE_VAL, false);
}

// The model block's description of the block beyond the shape (model_config.h).
void parse_block_description(const Block& b, ModelConfig& m) {
  b.get_bool("qkv_bias", m.qkv_bias);
  b.get_choice("qk_norm", m.qk_norm, {"none", "head", "whole"});
  b.get_choice("norm_placement", m.norm_placement, {"pre", "sandwich", "post"});
  b.get_number("norm_offset", m.norm_offset, -HUGE_VAL, HUGE_VAL, false);
  b.get_choice("mlp_act", m.mlp_act, {"silu", "gelu_tanh"});
  b.get_bool("embed_scale", m.embed_scale);
  b.get_number("query_pre_attn_scalar", m.query_pre_attn_scalar, 0.0, HUGE_VAL, false);
  b.get_number("rope_local_theta", m.rope_local_theta, 0.0, HUGE_VAL, false);
  b.get_number("attn_logit_softcapping", m.attn_logit_softcapping, 0.0, HUGE_VAL, false);
  b.get_number("final_logit_softcapping", m.final_logit_softcapping, 0.0, HUGE_VAL, false);
  b.get_int("sliding_window", m.sliding_window, 0);
  // Per layer: transformers' layer_types ("sliding_attention" | "full_attention"), and which
  // layers apply RoPE (1) or not (0; transformers' no_rope_layers).
  if (b.has("layer_types")) {
    const json& v = b.at("layer_types");
    m.layer_sliding.clear();
    for (const json& t : v.is_array() ? v : json::array({nullptr})) {
      if (!t.is_string() || (t != "sliding_attention" && t != "full_attention")) {
        b.fail("layer_types",
               "a list of \"sliding_attention\" or \"full_attention\", one per layer");
      }
      m.layer_sliding.push_back(t == "sliding_attention");
    }
  }
  if (b.has("rope_layers")) {
    const json& v = b.at("rope_layers");
    m.layer_rope.clear();
    for (const json& t : v.is_array() ? v : json::array({nullptr})) {
      if (!t.is_number_integer() || (t != 0 && t != 1)) {
        b.fail("rope_layers", "a list of 1 (the layer applies RoPE) or 0, one per layer");
      }
      m.layer_rope.push_back(t == 1);
    }
  }
  parse_moe(b, m);
  Block r = b.child("rope_scaling", {"type", "factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings", "beta_fast", "beta_slow",
                                     "attention_factor"});
  if (!r.present()) return;
  RopeScaling& s = m.rope_scaling;
  if (!r.get_choice("type", s.type, {"none", "linear", "llama3", "yarn"})) {
    b.fail("rope_scaling", "an object with \"type\": \"linear\", \"llama3\" or \"yarn\"");
  }
  r.get_number("factor", s.factor, 0.0, HUGE_VAL, true);
  r.get_number("low_freq_factor", s.low_freq_factor, 0.0, HUGE_VAL, true);
  r.get_number("high_freq_factor", s.high_freq_factor, 0.0, HUGE_VAL, true);
  r.get_int("original_max_position_embeddings", s.original_max_positions, 1);
  r.get_number("beta_fast", s.beta_fast, 0.0, HUGE_VAL, true);
  r.get_number("beta_slow", s.beta_slow, 0.0, HUGE_VAL, true);
  r.get_number("attention_factor", s.attention_factor, 0.0, HUGE_VAL, false);
}

void parse_model(const Block& top, Config& c) {
  Block b = top.child("model", keys_of("model"));
  if (!b.present()) {
    c.model = model_preset("demo");
    return;
  }
  c.given_model = true;
  ModelConfig m;
  std::string preset;
  const bool from_preset = b.get_string("preset", preset);
  if (from_preset) m = raw_preset(preset, "model.preset");
  const bool family_given = b.get_choice("family", m.family, model_families());
  if (!from_preset && !family_given) {
    STRATA_INPUT_FAIL("model.family is required when model.preset is not given: one of ",
                      list(model_families(), false),
                      " (or give a preset: ", list(model_preset_names(), false), ")");
  }
  // A preset whose family is overridden takes that family's description.
  if (family_given) family_defaults(m);
  const std::pair<const char*, int*> ints[] = {
      {"layers", &m.layers},         {"hidden", &m.hidden},    {"heads", &m.heads},
      {"vocab", &m.vocab},           {"seq_len", &m.seq_len},  {"kv_heads", &m.kv_heads},
      {"ffn_hidden", &m.ffn_hidden}, {"head_dim", &m.head_dim}};
  for (const auto& [key, out] : ints) {
    const bool given = b.get_int(key, *out, 1);
    const bool derived = std::string_view(key) == "kv_heads" ||
                         std::string_view(key) == "ffn_hidden" ||
                         std::string_view(key) == "head_dim";
    if (!given && !from_preset && !derived && !b.has(key)) {  // a bad value is listed already
      STRATA_INPUT_FAIL("model.", key, " is required when model.preset is not given");
    }
  }
  b.get_bool("tied_embeddings", m.tied_embeddings);
  b.get_number("norm_eps", m.norm_eps, 0.0, HUGE_VAL, true);
  if (b.get_number("rope_theta", m.rope_theta, 0.0, HUGE_VAL, true) && m.family == "gpt2") {
    STRATA_INPUT_FAIL(
        "model.rope_theta applies to the RoPE families only (gpt2 has learned position "
        "embeddings); remove it");
  }
  b.get_number("init_std", m.init_std, 0.0, HUGE_VAL, true);
  parse_block_description(b, m);
  finalize_model(m);
  c.model = m;
}

void parse_layout_blocks(const Block& top, Config& c) {
  Block pb = top.child("parallelism", keys_of("parallelism"));
  ParallelismConfig& p = c.parallelism;
  pb.get_int("tensor", p.tensor, 1);
  pb.get_int("pipeline", p.pipeline, 1);
  pb.get_int("virtual_stages", p.virtual_stages, 1);
  pb.get_choice("schedule", p.schedule, {"gpipe", "1f1b", "interleaved", "zero_bubble"});
  pb.get_bool("sequence_parallel", p.sequence_parallel);
  const bool context_given = pb.get_int("context", p.context, 1);
  pb.get_choice("context_impl", p.context_impl, {"ulysses", "ring"});
  if (const int ds = c.ds_sequence_parallel_size; ds > 0) {  // DeepSpeed-Ulysses' degree
    if (context_given && p.context != ds) {
      STRATA_INPUT_FAIL("sequence_parallel_size=", ds,
                        " (DeepSpeed-Ulysses) and parallelism.context=", p.context,
                        " disagree; they name the same split of each sequence: keep one");
    }
    p.context = ds;
  }
  pb.get_int("expert", p.expert, 1);
  if (pb.get_int("expert_tensor", p.expert_tensor, 1) && p.expert_tensor != 1 &&
      p.expert_tensor != p.tensor) {
    pb.fail("expert_tensor", "1 or parallelism.tensor (" + std::to_string(p.tensor) + ")");
  }
  pb.get_choice("expert_dispatch", p.expert_dispatch, {"all_to_all", "all_gather"});
  pb.get_bool("expert_overlap", p.expert_overlap);
  STRATA_INPUT_CHECK(!p.whole_experts() || p.sequence_parallel,
                     "parallelism.expert_tensor=1 with parallelism.tensor=", p.tensor,
                     " keeps each expert whole and routes each rank's own sequence-parallel "
                     "rows: set parallelism.sequence_parallel true, or remove "
                     "parallelism.expert_tensor (each expert is then split over the ",
                     p.tensor, " tensor-parallel ranks)");
  pb.get_int("timeout_s", p.timeout_s, 0);
  pb.get_choice("partition", p.partition, {"uniform", "parameters", "time", "explicit"});
  if (pb.has("partition_blocks")) {
    const json& list = pb.at("partition_blocks");
    const char* what = "a list of block counts, one per pipeline model chunk";
    if (!list.is_array()) pb.fail("partition_blocks", what);
    for (const json& n : list) {
      if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > 1000000) {
        pb.fail("partition_blocks", what);
      }
      p.partition_blocks.push_back(n.get<int>());
    }
  }
  if ((p.partition == "explicit") != !p.partition_blocks.empty()) {
    STRATA_INPUT_FAIL(
        "parallelism.partition \"explicit\" and parallelism.partition_blocks go "
        "together: give both (the blocks of each of the pipeline x virtual_stages "
        "model chunks) or neither");
  }
  if (pb.get_string("order", p.order)) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t dash = p.order.find('-', start);
      parts.push_back(p.order.substr(start, dash == std::string::npos ? dash : dash - start));
      if (dash == std::string::npos) break;
      start = dash + 1;
    }
    std::vector<std::string> sorted = parts;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != std::vector<std::string>{"dp", "pp", "tp"} &&
        sorted != std::vector<std::string>{"cp", "dp", "pp", "tp"}) {
      pb.fail("order",
              "a permutation of tp, dp, pp (and optionally cp) joined by '-' (e.g. "
              "\"tp-dp-pp\" or \"tp-cp-dp-pp\")");
    }
  }

  // The micro batch is known here when given; resolve_batch checks again once it is resolved.
  // Both checks need the model: a model block with errors (listed already) leaves it unset.
  const ModelConfig& m = c.model;
  if (m.layers > 0) check_tensor_split(c, c.given_micro_batch);
  const int64_t chunks = int64_t(p.pipeline) * p.virtual_stages;
  if (m.layers > 0 && chunks > m.layers) {
    STRATA_INPUT_FAIL("more pipeline stages than units: parallelism.pipeline=", p.pipeline,
                      " x virtual_stages=", p.virtual_stages, " = ", chunks,
                      " model chunks, but model.layers=", m.layers,
                      " Transformer blocks; each chunk needs at least one: lower "
                      "parallelism.pipeline or virtual_stages");
  }
  if (m.moe.experts > 0 && m.moe.aux_loss == "pooled" && m.moe.router_aux_loss_coef > 0 &&
      chunks > 1) {
    STRATA_INPUT_FAIL(
        "model.moe.aux_loss \"pooled\" pools every MoE layer's routing of a "
        "sequence into one balancing loss, which a model split into ",
        chunks,
        " pipeline chunks does not see in one place: use model.moe.aux_loss "
        "\"per_layer\" (Megatron's), or parallelism.pipeline 1");
  }
  if (p.expert > 1) check_expert_split(c);
  if (p.expert_overlap && m.layers > 0) {
    STRATA_INPUT_CHECK(p.expert > 1 && m.moe.shared_ffn_hidden > 0,
                       "parallelism.expert_overlap runs the shared expert while the tokens are "
                       "dispatched to their experts' ranks, but ",
                       p.expert > 1 ? "model.moe has no shared expert (shared_ffn_hidden)"
                                    : "nothing is dispatched (parallelism.expert is 1)",
                       ": remove parallelism.expert_overlap");
  }
  if (m.moe.experts > 0 && m.moe.capacity_factor > 0 && m.moe.capacity_scope == "sequence" &&
      p.context > 1) {
    STRATA_INPUT_FAIL(
        "model.moe.capacity_scope \"sequence\" ranks each sequence's tokens for "
        "an expert's capacity, which parallelism.context=",
        p.context,
        " spreads over ranks: use capacity_scope \"micro_batch\" (each rank's "
        "own rows), no capacity_factor, or parallelism.context 1");
  }
  if (p.virtual_stages > 1 && p.pipeline == 1) {
    STRATA_INPUT_FAIL("parallelism.virtual_stages=", p.virtual_stages,
                      " needs parallelism.pipeline > 1 (virtual stages are chunks of each "
                      "pipeline stage)");
  }
  if (p.virtual_stages > 1 && p.schedule != "interleaved") {
    STRATA_INPUT_FAIL("parallelism.virtual_stages=", p.virtual_stages,
                      " needs parallelism.schedule \"interleaved\", got \"", p.schedule, "\"");
  }
  if (p.schedule == "interleaved" && p.virtual_stages < 2) {
    STRATA_INPUT_FAIL(
        "parallelism.schedule \"interleaved\" needs parallelism.virtual_stages >= 2 "
        "(model chunks per stage); set virtual_stages or use schedule \"1f1b\"");
  }

  Block db = top.child("data", keys_of("data"));
  db.get_string("path", c.data.path);
  db.get_choice("format", c.data.format, {"auto", "llmc", "megatron"});
  db.get_string("val_path", c.data.val_path);
  db.get_choice("packing", c.data.packing, {"auto", "first_fit", "none"});
  db.get_bool("document_mask", c.data.document_mask);
  db.get_bool("eod_mask_loss", c.data.eod_mask_loss);
  // Megatron's pair, read as aliases: strata restarts positions and blocks attention together.
  bool reset_attention = false, reset_positions = false;
  db.get_bool("reset_attention_mask", reset_attention);
  db.get_bool("reset_position_ids", reset_positions);
  c.data.document_mask = c.data.document_mask || reset_attention || reset_positions;

  Block tb = top.child("train", keys_of("train"));
  tb.get_int("steps", c.train.steps, 1);
  tb.get_int("eval_interval", c.train.eval_interval, 0);
  tb.get_int("eval_iters", c.train.eval_iters, 0);
  tb.get_int("straggler_interval", c.train.straggler_interval, 0);
  tb.get_number("straggler_threshold", c.train.straggler_threshold, 0.0, 100.0, true);
  tb.get_int("straggler_patience", c.train.straggler_patience, 1);
  tb.get_uint64("seed", c.train.seed);
  tb.get_choice("device", c.train.device, {"cpu", "cuda"});
  if (c.train.device == "cuda" && p.context > 1) {
    STRATA_INPUT_FAIL("parallelism.context=", p.context,
                      " runs on the CPU backend only: the CUDA backend has no context-parallel "
                      "attention yet; set train.device \"cpu\" or parallelism.context=1 (tensor "
                      "parallelism with sequence_parallel also splits the sequence)");
  }
  if (c.train.device == "cuda" && m.moe.experts > 0) {
    STRATA_INPUT_FAIL(
        "model.moe (a mixture of experts) runs on the CPU backend only: its CUDA kernels "
        "have not run on a GPU yet (docs/gpu.md); set train.device \"cpu\"");
  }
  if (tb.get_string("run_dir", c.train.run_dir) && c.train.run_dir.empty()) {
    tb.fail("run_dir", "a non-empty directory path");
  }
}

}  // namespace strata::config_detail
