#include "strata/model/param_spec.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/kernels/ops.h"

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

// How a parameter is split over the tensor-parallel group: along `axis` (-1: replicated), holding
// `ranges` there, `local` indices long (the ranges' total, or more with padding).
struct Split {
  int axis = -1;
  std::vector<TpRange> ranges;
  int64_t local = 0;
  int64_t rows = 0, row0 = 0;  // axis 1: the rank's rows, from global row row0 (0: every row)
};

struct Builder {
  ModelSpec spec;
  int64_t expert_align = 1;  // the Experts units' alignment (a multiple of spec.align)
  void end_unit() {
    if (spec.units.empty()) return;
    const int64_t a = spec.units.back().kind == UnitKind::Experts ? expert_align : spec.align;
    const int64_t pad = (a - spec.units.back().numel % a) % a;
    spec.units.back().numel += pad;
    spec.numel += pad;
  }
  void begin_unit(std::string name, UnitKind kind, int layer = -1) {
    end_unit();
    UnitSpec u;
    u.name = std::move(name), u.offset = spec.numel, u.kind = kind, u.layer = layer;
    spec.units.push_back(std::move(u));
  }
  ParamSpec make(std::string name, std::vector<int64_t> shape, ParamRole role, InitKind init,
                 float std, int layer, const Split& split) {
    ParamSpec p;
    p.name = std::move(name);
    p.global_shape = shape;
    p.shape = std::move(shape);
    p.role = role, p.layer = layer, p.init = init, p.std = std;
    p.decay = init == InitKind::Normal && p.shape.size() >= 2;
    p.offset = spec.numel;
    p.split_axis = split.axis;
    if (split.axis >= 0) {
      p.ranges = split.ranges;
      p.shape[size_t(split.axis)] = split.local;
      if (split.rows > 0) p.shape[0] = split.rows, p.row0 = split.row0;
    } else {
      p.replicas = spec.tp.size;
    }
    return p;
  }
  void add(std::string name, std::vector<int64_t> shape, ParamRole role, InitKind init,
           float std = 0.0f, int layer = -1, const Split& split = {}) {
    ParamSpec p = make(std::move(name), std::move(shape), role, init, std, layer, split);
    spec.numel += p.numel();
    spec.param_numel += p.numel();
    spec.global_param_numel +=
        p.global_shape.size() == 1 ? p.global_shape[0] : p.global_shape[0] * p.global_shape[1];
    spec.units.back().numel += p.numel();
    spec.units.back().params.push_back(int(spec.params.size()));
    spec.params.push_back(std::move(p));
  }
  // This rank's rows of a (V, C) vocabulary matrix as units of `rows` whole rows each:
  // "<unit>.0", "<unit>.1", ...
  void add_rows(const std::string& unit, UnitKind kind, std::string name, int64_t V, int64_t C,
                ParamRole role, float std, int64_t rows) {
    const TpLayout& tp = spec.tp;
    const int index = int(spec.params.size());
    const int64_t local = tp.vocab_rows;
    for (int64_t r = 0, k = 0; r < local; r += rows, ++k) {
      begin_unit(unit + "." + std::to_string(k), kind);  // pads the unit before
      if (k == 0) {
        Split split{0, {{tp.vocab_begin, tp.vocab_valid, 1}}, local};
        spec.params.push_back(make(name, {V, C}, role, InitKind::Normal, std, -1, split));
        spec.param_numel += local * C;
        spec.global_param_numel += V * C;
      }
      UnitSpec& u = spec.units.back();
      u.row_begin = r, u.row_end = std::min(local, r + rows);
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

TpLayout tp_layout(const ModelConfig& m, int size, int rank) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor-parallel rank ", rank, " of ", size);
  const int kvh = m.gpt2_block() ? m.heads : m.kv_heads;
  STRATA_CHECK(m.heads % size == 0 && m.ffn_hidden % size == 0 &&
                   (kvh >= size ? kvh % size == 0 : size % kvh == 0),
               "parallelism.tensor=", size, " does not divide model.heads=", m.heads,
               ", model.ffn_hidden=", m.ffn_hidden, " and the key/value heads ", kvh);
  TpLayout t;
  t.size = size, t.rank = rank;
  t.heads = m.heads / size;
  t.kv_replicated = kvh < size;
  t.groups = t.kv_replicated ? 1 : kvh / size;
  t.rep = t.heads / t.groups;
  t.qkv_rows = int64_t(t.groups) * (t.rep + 2) * m.hd();
  t.ffn = m.ffn_hidden / size;
  t.vocab_padded = (int64_t(m.vocab) + size - 1) / size * size;
  t.vocab_rows = t.vocab_padded / size;
  t.vocab_begin = t.vocab_rows * rank;
  t.vocab_valid = std::clamp(int64_t(m.vocab) - t.vocab_begin, int64_t(0), t.vocab_rows);
  return t;
}

// This rank's rows of the grouped QKV weight (or bias).
Split qkv_split(const ModelConfig& m, const TpLayout& t) {
  const int64_t hd = m.hd();
  const int kvh = m.gpt2_block() ? m.heads : m.kv_heads;
  const int64_t rep = m.heads / kvh, group = (rep + 2) * hd;  // global rows per group
  if (!t.kv_replicated) {
    const int64_t rows = int64_t(kvh / t.size) * group;
    return {0, {{t.rank * rows, rows, 1}}, rows};
  }
  const int share = t.size / kvh;  // ranks per group
  const int64_t g = t.rank / share, j = t.rank % share;
  const int64_t q = int64_t(t.heads) * hd;
  return {0, {{g * group + j * q, q, 1}, {g * group + rep * hd, 2 * hd, share}}, q + 2 * hd};
}

Split rows_split(int64_t n, const TpLayout& t) {
  const int64_t local = n / t.size;
  return {0, {{t.rank * local, local, 1}}, local};
}

Split cols_split(int64_t n, const TpLayout& t) {
  Split s = rows_split(n, t);
  s.axis = 1;
  return s;
}

}  // namespace

ModelSpec build_model_spec(const ModelConfig& m, int64_t align, int tp_size, int tp_rank,
                           int ep_size, int ep_rank, bool whole_experts, int64_t expert_align) {
  STRATA_CHECK(align >= 1 && expert_align >= 1, "the unit alignment must be at least 1, got ",
               align, " and ", expert_align);
  Builder b;
  b.spec.config = m;
  b.spec.align = align;
  b.expert_align = std::lcm(align, expert_align);
  const TpLayout tp = b.spec.tp = tp_layout(m, tp_size, tp_rank);
  STRATA_CHECK(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size &&
                   (ep_size == 1 || m.moe.experts % ep_size == 0),
               "expert-parallel rank ", ep_rank, " of ", ep_size, " for ", m.moe.experts,
               " experts");
  ExpertLayout& ep = b.spec.ep;
  ep.size = ep_size, ep.rank = ep_rank;
  ep.experts = m.moe.experts / ep_size, ep.first = ep.experts * ep_rank;
  ep.whole = whole_experts && tp_size > 1;
  const int64_t C = m.hidden, V = m.vocab, F = m.ffn_hidden, L = m.layers;
  const int64_t hd = m.hd();
  const float s = m.init_std;
  const float s_resid = s / std::sqrt(2.0f * float(L));  // GPT-2: residual projections scaled
  const bool gpt2 = m.gpt2_block(), qk_norm = m.qk_norm != "none";
  const bool whole_qk = m.qk_norm == "whole", pre = m.pre_norm(), post = m.post_norm();
  const int64_t kvh = gpt2 ? m.heads : m.kv_heads;
  const int64_t qkv = (m.heads + 2 * kvh) * hd;  // global rows
  const int64_t fch = gpt2 ? F : 2 * F;
  // The largest local sublayer bounds a vocabulary unit.
  const int64_t ql = tp.qkv_rows, fl = gpt2 ? tp.ffn : 2 * tp.ffn, hl = int64_t(tp.heads) * hd;
  const int64_t qk_gains = !qk_norm   ? 0
                           : whole_qk ? int64_t(tp.groups) * (tp.rep + 1) * hd
                                      : 2 * hd;
  const int64_t norms = (pre ? C : 0) + (post ? C : 0);
  const int64_t attn = gpt2 ? 2 * C + ql * C + ql + C * hl + C
                            : norms + ql * C + (m.qkv_bias ? ql : 0) + qk_gains + C * hl;
  const int64_t dense_mlp =
      gpt2 ? 2 * C + fl * C + fl + C * tp.ffn + C : norms + fl * C + C * tp.ffn;
  const MoeConfig& moe = m.moe;
  const int64_t E = moe.experts, Fe = moe.ffn_hidden, Fs = moe.shared_ffn_hidden;
  const int64_t fe = ep.whole ? Fe : Fe / tp.size, fs = Fs / tp.size;  // this rank's units
  const int64_t moe_mlp = norms + E * C + 3 * fs * C + (moe.shared_gate ? C : 0);
  const int64_t El = ep.experts, e0 = ep.first;  // the experts this rank holds
  const int64_t mlp = std::max({dense_mlp, E > 0 ? moe_mlp : 0, El * 3 * fe * C});
  const int64_t rows = vocab_rows(std::max(attn, mlp), C, align);
  const Split qkv_rows = qkv_split(m, tp), fc_rows = rows_split(fch, tp);
  const Split proj_cols = cols_split(m.heads * hd, tp), fc2_cols = cols_split(F, tp);

  b.add_rows("embedding", UnitKind::Vocab, gpt2 ? "wte" : "embed_tokens", V, C,
             ParamRole::TokenEmbedding, s, rows);
  if (gpt2) {
    b.begin_unit("position", UnitKind::Position);
    b.add("wpe", {m.seq_len, C}, ParamRole::PositionEmbedding, InitKind::Normal, s);
  }
  for (int l = 0; l < int(L); ++l) {
    const std::string u = "block." + std::to_string(l);
    using R = ParamRole;
    using I = InitKind;
    if (gpt2) {
      const std::string p = "h." + std::to_string(l) + ".";
      b.begin_unit(u + ".attn", UnitKind::Attention, l);
      b.add(p + "ln_1.weight", {C}, R::Norm1W, I::Ones, 0.0f, l);
      b.add(p + "ln_1.bias", {C}, R::Norm1B, I::Zeros, 0.0f, l);
      b.add(p + "attn.c_attn.weight", {qkv, C}, R::QkvW, I::Normal, s, l, qkv_rows);
      b.add(p + "attn.c_attn.bias", {qkv}, R::QkvB, I::Zeros, 0.0f, l, qkv_rows);
      b.add(p + "attn.c_proj.weight", {C, C}, R::ProjW, I::Normal, s_resid, l, proj_cols);
      b.add(p + "attn.c_proj.bias", {C}, R::ProjB, I::Zeros, 0.0f, l);
      b.begin_unit(u + ".mlp", UnitKind::Mlp, l);
      b.add(p + "ln_2.weight", {C}, R::Norm2W, I::Ones, 0.0f, l);
      b.add(p + "ln_2.bias", {C}, R::Norm2B, I::Zeros, 0.0f, l);
      b.add(p + "mlp.c_fc.weight", {F, C}, R::FcW, I::Normal, s, l, fc_rows);
      b.add(p + "mlp.c_fc.bias", {F}, R::FcB, I::Zeros, 0.0f, l, fc_rows);
      b.add(p + "mlp.c_proj.weight", {C, F}, R::Fc2W, I::Normal, s_resid, l, fc2_cols);
      b.add(p + "mlp.c_proj.bias", {C}, R::Fc2B, I::Zeros, 0.0f, l);
    } else {
      const std::string p = "layers." + std::to_string(l) + ".";
      // A gain of (norm_offset + w) starts at 1: w at 1 - norm_offset (Gemma's at 0).
      const I gain = m.norm_offset == 1.0f ? I::Zeros : I::Ones;
      b.begin_unit(u + ".attn", UnitKind::Attention, l);
      if (pre) b.add(p + "input_layernorm.weight", {C}, R::Norm1W, gain, 0.0f, l);
      b.add(p + "self_attn.qkv_proj.weight", {qkv, C}, R::QkvW, I::Normal, s, l, qkv_rows);
      if (m.qkv_bias) {
        b.add(p + "self_attn.qkv_proj.bias", {qkv}, R::QkvB, I::Zeros, 0.0f, l, qkv_rows);
      }
      if (qk_norm && !whole_qk) {
        b.add(p + "self_attn.q_norm.weight", {hd}, R::QNormW, gain, 0.0f, l);
        b.add(p + "self_attn.k_norm.weight", {hd}, R::KNormW, gain, 0.0f, l);
      } else if (whole_qk) {  // this rank's heads' slices (tp <= kv_heads: config/model.cc)
        b.add(p + "self_attn.q_norm.weight", {m.heads * hd}, R::QNormW, gain, 0.0f, l,
              rows_split(m.heads * hd, tp));
        b.add(p + "self_attn.k_norm.weight", {kvh * hd}, R::KNormW, gain, 0.0f, l,
              rows_split(kvh * hd, tp));
      }
      b.add(p + "self_attn.o_proj.weight", {C, m.heads * hd}, R::ProjW, I::Normal, s_resid, l,
            proj_cols);
      if (post) b.add(p + "post_attention_norm.weight", {C}, R::PostAttnNormW, gain, 0.0f, l);
      b.begin_unit(u + ".mlp", UnitKind::Mlp, l);
      if (pre) b.add(p + "post_attention_layernorm.weight", {C}, R::Norm2W, gain, 0.0f, l);
      if (m.moe_layer(l)) {
        b.add(p + "mlp.gate.weight", {E, C}, R::RouterW, I::Normal, s, l);
        if (Fs > 0) {
          b.add(p + "mlp.shared_expert.gate_up_proj.weight", {2 * Fs, C}, R::SharedFcW, I::Normal,
                s, l, rows_split(2 * Fs, tp));
          b.add(p + "mlp.shared_expert.down_proj.weight", {C, Fs}, R::SharedFc2W, I::Normal,
                s_resid, l, cols_split(Fs, tp));
          if (moe.shared_gate) {
            b.add(p + "mlp.shared_expert_gate.weight", {1, C}, R::SharedGateW, I::Normal, s, l);
          }
        }
      } else {
        b.add(p + "mlp.gate_up_proj.weight", {2 * F, C}, R::FcW, I::Normal, s, l, fc_rows);
        b.add(p + "mlp.down_proj.weight", {C, F}, R::Fc2W, I::Normal, s_resid, l, fc2_cols);
      }
      if (post) b.add(p + "post_mlp_norm.weight", {C}, R::PostMlpNormW, gain, 0.0f, l);
      if (m.moe_layer(l)) {
        // The experts this rank holds, each one's gate|up rows split over tp as a dense MLP's
        // (a range of 2F/tp rows per expert) and its down projection by columns; or whole.
        b.begin_unit(u + ".experts", UnitKind::Experts, l);
        Split experts{0, {}, El * 2 * fe};
        const int64_t first_row = ep.whole ? 0 : tp.rank * 2 * fe;
        for (int64_t e = e0; e < e0 + El; ++e) {
          experts.ranges.push_back({e * 2 * Fe + first_row, 2 * fe, 1});
        }
        Split down = ep.whole ? Split{1, {{0, Fe, 1}}, Fe} : cols_split(Fe, tp);
        if (El < E) down.rows = El * C, down.row0 = e0 * C;
        b.add(p + "mlp.experts.gate_up_proj.weight", {E * 2 * Fe, C}, R::ExpertGateUpW, I::Normal,
              s, l, experts);
        b.add(p + "mlp.experts.down_proj.weight", {E * C, Fe}, R::ExpertDownW, I::Normal, s_resid,
              l, down);
      }
    }
  }
  b.begin_unit("final_norm", UnitKind::FinalNorm);
  if (gpt2) {
    b.add("ln_f.weight", {C}, ParamRole::FinalNormW, InitKind::Ones);
    b.add("ln_f.bias", {C}, ParamRole::FinalNormB, InitKind::Zeros);
  } else {
    b.add("norm.weight", {C}, ParamRole::FinalNormW,
          m.norm_offset == 1.0f ? InitKind::Zeros : InitKind::Ones);
  }
  if (!m.tied_embeddings) {
    b.add_rows("output", UnitKind::Output, "lm_head.weight", V, C, ParamRole::OutputW, s, rows);
  }
  b.end_unit();
  for (ParamSpec& p : b.spec.params) {
    if (p.role == ParamRole::QkvW || p.role == ParamRole::QkvB) {
      p.fused = Fused::Qkv, p.fused_dims = {m.heads, kvh, hd};
    } else if (p.role == ParamRole::FcW && !gpt2) {
      p.fused = Fused::GateUp, p.fused_dims = {F, 0, 0};
    } else if (p.role == ParamRole::ExpertGateUpW) {
      p.fused = Fused::GateUp, p.fused_dims = {Fe, E, 0};
    } else if (p.role == ParamRole::SharedFcW) {
      p.fused = Fused::GateUp, p.fused_dims = {Fs, 0, 0};
    }
  }
  return std::move(b.spec);
}

ModelSpec hold_units(const ModelSpec& spec, const std::vector<bool>& held) {
  STRATA_CHECK(held.size() == spec.units.size(), "hold_units needs one flag per unit");
  ModelSpec out = spec;
  std::vector<int64_t> shift(spec.params.size(), 0);  // new offset - old offset, held params
  std::vector<char> param_held(spec.params.size(), 0);
  int64_t at = 0;
  bool vocab_held = false, vocab_seen = false;
  for (size_t u = 0; u < out.units.size(); ++u) {
    UnitSpec& unit = out.units[u];
    if (unit.kind == UnitKind::Vocab) {
      STRATA_CHECK(!vocab_seen || vocab_held == held[u],
                   "a pipeline stage holds every vocabulary unit or none");
      vocab_seen = true, vocab_held = held[u];
    }
    unit.held = held[u];
    if (!held[u]) {
      unit.offset = at, unit.numel = 0;
      continue;
    }
    for (int i : unit.params) {
      if (!param_held[size_t(i)]) shift[size_t(i)] = at - spec.units[u].offset;
      param_held[size_t(i)] = 1;
    }
    unit.offset = at;
    at += unit.numel;
  }
  out.numel = at;
  out.param_numel = 0;
  for (size_t i = 0; i < out.params.size(); ++i) {
    ParamSpec& p = out.params[i];
    p.held = param_held[i] != 0;
    p.offset = p.held ? p.offset + shift[i] : at;
    if (p.held) out.param_numel += p.numel();
  }
  return out;
}

int64_t canonical_row(const ParamSpec& p, int64_t row) {
  if (p.fused == Fused::Qkv) {
    const int64_t heads = p.fused_dims[0], kvh = p.fused_dims[1], hd = p.fused_dims[2];
    const int64_t rep = heads / kvh;
    const int64_t g = row / ((rep + 2) * hd), slot = row / hd % (rep + 2), d = row % hd;
    if (slot < rep) return ((g * rep + slot) * hd) + d;  // query head g·rep+slot
    if (slot == rep) return (heads + g) * hd + d;        // key head g
    return (heads + kvh + g) * hd + d;                   // value head g
  }
  if (p.fused == Fused::GateUp) {  // gate f | up f, expert after expert
    const int64_t F = p.fused_dims[0], base = row / (2 * F) * 2 * F, j = row % (2 * F);
    return base + (j % 2 == 0 ? j / 2 : F + j / 2);
  }
  return row;
}

void to_canonical(const ParamSpec& p, const float* in, float* out) {
  const int64_t rows = p.global_shape[0], cols = p.numel() / rows;
  STRATA_CHECK(p.shape == p.global_shape, "to_canonical takes whole tensors, ", p.name,
               " is a slice");
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(in + r * cols, in + (r + 1) * cols, out + canonical_row(p, r) * cols);
  }
}

void init_param_slice(float* out, const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count) {
  if (p.init != InitKind::Normal) {
    std::fill(out, out + count, p.init == InitKind::Ones ? 1.0f : 0.0f);
    return;
  }
  // Local (row, column) -> global -> canonical, one run of columns at a time.
  const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  const uint64_t key = rng_key(seed, p.name);
  auto global_of = [&](int64_t local) -> int64_t {  // along the split axis; -1: padding
    for (const TpRange& r : p.ranges) {
      if (local < r.count) return r.begin + local;
      local -= r.count;
    }
    return -1;
  };
  for (int64_t i = begin, end = begin + count; i < end;) {
    const int64_t row = i / cols, col = i % cols, n = std::min(cols - col, end - i);
    float* o = out + (i - begin);
    const int64_t grow = p.split_axis == 0 ? global_of(row) : p.row0 + row;
    const int64_t gcol = p.split_axis == 1 ? global_of(col) : col;
    if (grow < 0) {
      std::fill(o, o + n, 0.0f);  // vocabulary padding
    } else {
      const int64_t at = canonical_row(p, grow) * gcols + gcol;
      rng_fill_normal(o, key, uint64_t(at), uint64_t(n), 0.0f, p.std);
    }
    i += n;
  }
}

void init_param_slice(Tensor out, const ParamSpec& p, uint64_t seed, int64_t begin) {
  STRATA_CHECK(out.dtype == DType::F32, "parameters are initialised in fp32, got ",
               dtype_name(out.dtype));
  constexpr int64_t kPiece = int64_t(1) << 20;  // 4 MiB of host staging
  const int64_t count = out.numel();
  std::vector<float> host(size_t(std::min(count, kPiece)));
  for (int64_t i = 0; i < count; i += kPiece) {
    const int64_t n = std::min(kPiece, count - i);
    init_param_slice(host.data(), p, seed, begin + i, n);
    ops::copy_from_host(Tensor(static_cast<float*>(out.data) + i, DType::F32, {n}, out.device),
                        host.data());
  }
}

std::vector<ReplicatedRange> replicated_ranges(const ModelSpec& spec) {
  std::vector<ReplicatedRange> out;
  for (const ParamSpec& p : spec.params) {
    if (!p.held) continue;
    if (p.split_axis < 0) {
      if (p.replicas > 1) out.push_back({p.offset, p.numel(), p.replicas});
      continue;
    }
    const int64_t cols = p.split_axis == 0 && p.shape.size() > 1 ? p.shape[1] : 1;
    int64_t at = 0;
    for (const TpRange& r : p.ranges) {
      if (r.replicas > 1) {
        STRATA_CHECK(p.split_axis == 0, "replicated column ranges are not supported");
        out.push_back({p.offset + at * cols, r.count * cols, r.replicas});
      }
      at += r.count;
    }
  }
  return out;
}

double train_flops_per_token(const ModelSpec& spec) {
  const ModelConfig& m = spec.config;
  // A token passes through top_k of a MoE layer's experts: the others' weights do no work for it.
  const MoeConfig& e = m.moe;
  const double idle = double(m.moe_layers()) * double(e.experts - e.top_k) * 3.0 *
                      double(e.ffn_hidden) * double(m.hidden);
  return 6.0 * (double(spec.global_param_numel) - idle) +
         12.0 * m.layers * double(m.heads) * m.hd() * double(m.seq_len);
}

}  // namespace strata
