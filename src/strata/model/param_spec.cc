#include "strata/model/param_spec.h"

#include <algorithm>
#include <cmath>
#include <numeric>

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

std::vector<int> ModelSpec::units_of(UnitKind kind) const {
  std::vector<int> out;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].kind == kind) out.push_back(int(u));
  }
  return out;
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
  void begin_unit(std::string name, UnitKind kind, int layer = -1) {
    end_unit();
    UnitSpec u;
    u.name = std::move(name), u.offset = spec.numel, u.kind = kind, u.layer = layer;
    spec.units.push_back(std::move(u));
  }
  void add(std::string name, std::vector<int64_t> shape, ParamRole role, InitKind init,
           float std = 0.0f, int layer = -1) {
    ParamSpec p{std::move(name),          std::move(shape), role, layer, init, std,
                init == InitKind::Normal, spec.numel};
    if (p.shape.size() < 2) p.decay = false;
    spec.numel += p.numel();
    spec.param_numel += p.numel();
    spec.units.back().numel += p.numel();
    spec.units.back().params.push_back(int(spec.params.size()));
    spec.params.push_back(std::move(p));
  }
  // A (V, C) matrix as units of `rows` whole rows each: "<unit>.0", "<unit>.1", ...
  void add_rows(const std::string& unit, UnitKind kind, std::string name, int64_t V, int64_t C,
                ParamRole role, float std, int64_t rows) {
    const int index = int(spec.params.size());
    for (int64_t r = 0, k = 0; r < V; r += rows, ++k) {
      begin_unit(unit + "." + std::to_string(k), kind);  // pads the unit before
      if (k == 0) {
        spec.params.push_back({name, {V, C}, role, -1, InitKind::Normal, std, true, spec.numel});
        spec.param_numel += V * C;
      }
      UnitSpec& u = spec.units.back();
      u.row_begin = r, u.row_end = std::min(V, r + rows);
      u.numel = (u.row_end - r) * C;
      u.params.push_back(index);
      spec.numel += u.numel;
    }
  }
};

// Rows per vocabulary unit: as many as fit in `cap` elements, a multiple of 8 and of
// align/gcd(align, C) (then rows·C is a multiple of align and no padding splits the matrix).
int64_t vocab_rows(int64_t cap, int64_t C, int64_t align) {
  const int64_t step = std::lcm(int64_t(8), align / std::gcd(align, C));
  return std::max(step, cap / C / step * step);
}

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
  const int64_t qkv = gpt2 ? 3 * C : (m.heads + 2 * int64_t(m.kv_heads)) * hd;
  const int64_t fch = gpt2 ? F : 2 * F;
  // The largest sublayer bounds a vocabulary unit.
  const int64_t attn = gpt2 ? 2 * C + qkv * C + qkv + C * C + C : C + qkv * C + C * m.heads * hd;
  const int64_t mlp = gpt2 ? 2 * C + fch * C + fch + C * F + C : C + fch * C + C * F;
  const int64_t rows = vocab_rows(std::max(attn, mlp), C, align);

  b.add_rows("embedding", UnitKind::Vocab, gpt2 ? "wte" : "embed_tokens", V, C,
             ParamRole::TokenEmbedding, s, rows);
  if (gpt2) {
    b.begin_unit("position", UnitKind::Position);
    b.add("wpe", {m.seq_len, C}, ParamRole::PositionEmbedding, InitKind::Normal, s);
  }
  for (int l = 0; l < int(L); ++l) {
    const std::string u = "block." + std::to_string(l);
    using R = ParamRole;
    if (gpt2) {
      const std::string p = "h." + std::to_string(l) + ".";
      b.begin_unit(u + ".attn", UnitKind::Attention, l);
      b.add(p + "ln_1.weight", {C}, R::Norm1W, InitKind::Ones, 0.0f, l);
      b.add(p + "ln_1.bias", {C}, R::Norm1B, InitKind::Zeros, 0.0f, l);
      b.add(p + "attn.c_attn.weight", {qkv, C}, R::QkvW, InitKind::Normal, s, l);
      b.add(p + "attn.c_attn.bias", {qkv}, R::QkvB, InitKind::Zeros, 0.0f, l);
      b.add(p + "attn.c_proj.weight", {C, C}, R::ProjW, InitKind::Normal, s_resid, l);
      b.add(p + "attn.c_proj.bias", {C}, R::ProjB, InitKind::Zeros, 0.0f, l);
      b.begin_unit(u + ".mlp", UnitKind::Mlp, l);
      b.add(p + "ln_2.weight", {C}, R::Norm2W, InitKind::Ones, 0.0f, l);
      b.add(p + "ln_2.bias", {C}, R::Norm2B, InitKind::Zeros, 0.0f, l);
      b.add(p + "mlp.c_fc.weight", {F, C}, R::FcW, InitKind::Normal, s, l);
      b.add(p + "mlp.c_fc.bias", {F}, R::FcB, InitKind::Zeros, 0.0f, l);
      b.add(p + "mlp.c_proj.weight", {C, F}, R::Fc2W, InitKind::Normal, s_resid, l);
      b.add(p + "mlp.c_proj.bias", {C}, R::Fc2B, InitKind::Zeros, 0.0f, l);
    } else {
      const std::string p = "layers." + std::to_string(l) + ".";
      b.begin_unit(u + ".attn", UnitKind::Attention, l);
      b.add(p + "input_layernorm.weight", {C}, R::Norm1W, InitKind::Ones, 0.0f, l);
      b.add(p + "self_attn.qkv_proj.weight", {qkv, C}, R::QkvW, InitKind::Normal, s, l);
      b.add(p + "self_attn.o_proj.weight", {C, m.heads * hd}, R::ProjW, InitKind::Normal, s_resid,
            l);
      b.begin_unit(u + ".mlp", UnitKind::Mlp, l);
      b.add(p + "post_attention_layernorm.weight", {C}, R::Norm2W, InitKind::Ones, 0.0f, l);
      b.add(p + "mlp.gate_up_proj.weight", {2 * F, C}, R::FcW, InitKind::Normal, s, l);
      b.add(p + "mlp.down_proj.weight", {C, F}, R::Fc2W, InitKind::Normal, s_resid, l);
    }
  }
  b.begin_unit("final_norm", UnitKind::FinalNorm);
  if (gpt2) {
    b.add("ln_f.weight", {C}, ParamRole::FinalNormW, InitKind::Ones);
    b.add("ln_f.bias", {C}, ParamRole::FinalNormB, InitKind::Zeros);
  } else {
    b.add("norm.weight", {C}, ParamRole::FinalNormW, InitKind::Ones);
  }
  if (!m.tied_embeddings) {
    b.add_rows("output", UnitKind::Output, "lm_head.weight", V, C, ParamRole::OutputW, s, rows);
  }
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
