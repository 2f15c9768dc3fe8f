#include "strata/model/param_spec.h"

#include <cmath>

#include "strata/core/check.h"
#include "strata/core/rng.h"

namespace strata {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const ParamSpec& ModelSpec::param(const std::string& name) const {
  for (const ParamSpec& p : params) {
    if (p.name == name) return p;
  }
  STRATA_FAIL("the model has no parameter named ", name);
}

namespace {

struct Builder {
  ModelSpec spec;
  void end_unit() {
    if (spec.units.empty()) return;
    const int64_t pad = (spec.align - spec.units.back().numel % spec.align) % spec.align;
    spec.units.back().numel += pad;
    spec.numel += pad;
  }
  void begin_unit(std::string name) {
    end_unit();
    spec.units.push_back({std::move(name), spec.numel, 0, {}});
  }
  void add(std::string name, std::vector<int64_t> shape, InitKind init, float std = 0.0f) {
    ParamSpec p{std::move(name), std::move(shape), init, std, init == InitKind::Normal, spec.numel};
    if (p.shape.size() < 2) p.decay = false;
    spec.numel += p.numel();
    spec.param_numel += p.numel();
    spec.units.back().numel += p.numel();
    spec.units.back().params.push_back(int(spec.params.size()));
    spec.params.push_back(std::move(p));
  }
};

}  // namespace

ModelSpec build_model_spec(const ModelConfig& m, int64_t align) {
  STRATA_CHECK(align >= 1, "the unit alignment must be at least 1, got ", align);
  Builder b;
  b.spec.config = m;
  b.spec.align = align;
  const int64_t C = m.hidden, V = m.vocab, F = m.ffn_hidden, L = m.layers;
  const int64_t hd = C / m.heads;
  const float s = m.init_std;
  const float s_resid = s / std::sqrt(2.0f * float(L));  // GPT-2: residual projections scaled
  const bool gpt2 = m.family == "gpt2";
  b.begin_unit("embedding");
  if (gpt2) {
    b.add("wte", {V, C}, InitKind::Normal, s);
    b.add("wpe", {m.seq_len, C}, InitKind::Normal, s);
  } else {
    b.add("embed_tokens", {V, C}, InitKind::Normal, s);
  }
  for (int64_t l = 0; l < L; ++l) {
    b.begin_unit("block." + std::to_string(l));
    if (gpt2) {
      std::string p = "h." + std::to_string(l) + ".";
      b.add(p + "ln_1.weight", {C}, InitKind::Ones);
      b.add(p + "ln_1.bias", {C}, InitKind::Zeros);
      b.add(p + "attn.c_attn.weight", {3 * C, C}, InitKind::Normal, s);
      b.add(p + "attn.c_attn.bias", {3 * C}, InitKind::Zeros);
      b.add(p + "attn.c_proj.weight", {C, C}, InitKind::Normal, s_resid);
      b.add(p + "attn.c_proj.bias", {C}, InitKind::Zeros);
      b.add(p + "ln_2.weight", {C}, InitKind::Ones);
      b.add(p + "ln_2.bias", {C}, InitKind::Zeros);
      b.add(p + "mlp.c_fc.weight", {F, C}, InitKind::Normal, s);
      b.add(p + "mlp.c_fc.bias", {F}, InitKind::Zeros);
      b.add(p + "mlp.c_proj.weight", {C, F}, InitKind::Normal, s_resid);
      b.add(p + "mlp.c_proj.bias", {C}, InitKind::Zeros);
    } else {
      std::string p = "layers." + std::to_string(l) + ".";
      const int64_t qkv = (m.heads + 2 * int64_t(m.kv_heads)) * hd;
      b.add(p + "input_layernorm.weight", {C}, InitKind::Ones);
      b.add(p + "self_attn.qkv_proj.weight", {qkv, C}, InitKind::Normal, s);
      b.add(p + "self_attn.o_proj.weight", {C, m.heads * hd}, InitKind::Normal, s_resid);
      b.add(p + "post_attention_layernorm.weight", {C}, InitKind::Ones);
      b.add(p + "mlp.gate_up_proj.weight", {2 * F, C}, InitKind::Normal, s);
      b.add(p + "mlp.down_proj.weight", {C, F}, InitKind::Normal, s_resid);
    }
  }
  b.begin_unit("head");
  if (gpt2) {
    b.add("ln_f.weight", {C}, InitKind::Ones);
    b.add("ln_f.bias", {C}, InitKind::Zeros);
  } else {
    b.add("norm.weight", {C}, InitKind::Ones);
  }
  if (!m.tied_embeddings) b.add("lm_head.weight", {V, C}, InitKind::Normal, s);
  b.end_unit();
  return std::move(b.spec);
}

void init_param_slice(float* out, const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count) {
  switch (p.init) {
    case InitKind::Zeros:
      for (int64_t i = 0; i < count; ++i) out[i] = 0.0f;
      return;
    case InitKind::Ones:
      for (int64_t i = 0; i < count; ++i) out[i] = 1.0f;
      return;
    case InitKind::Normal:
      rng_fill_normal(out, rng_key(seed, p.name), uint64_t(begin), uint64_t(count), 0.0f, p.std);
      return;
  }
}

double train_flops_per_token(const ModelSpec& spec) {
  const ModelConfig& m = spec.config;
  return 6.0 * double(spec.param_numel) + 12.0 * m.layers * m.hidden * double(m.seq_len);
}

}  // namespace strata
