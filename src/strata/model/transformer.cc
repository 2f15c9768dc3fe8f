#include "strata/model/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/activation.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/cpu/cross_entropy.h"
#include "strata/kernels/cpu/embedding.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/cpu/norm.h"
#include "strata/kernels/cpu/rope.h"

namespace strata {

namespace {

using namespace kernels;

// Carves typed views out of one allocation, each 64-byte aligned. Laid out twice: once to size
// the allocation, once to point into it.
class Arena {
 public:
  template <typename X>
  X* take(int64_t n) {
    uintptr_t at = reinterpret_cast<uintptr_t>(buffer_.data()) + uintptr_t(used_);
    used_ += (n * int64_t(sizeof(X)) + 63) / 64 * 64;
    return reinterpret_cast<X*>(at);
  }
  void allocate(MemCategory c) { buffer_ = Buffer(c, size_t(used_)); }
  void rewind() { used_ = 0; }

 private:
  Buffer buffer_;
  int64_t used_ = 0;
};

// y (n) += x (n): the residual connection.
template <typename T>
void add_inplace(T* y, const T* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i]));
}

// Pointers to one block's parameters (or their gradients), in ModelSpec order.
template <typename P>
struct BlockParams {
  P *ln1_w = nullptr, *ln1_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr, *proj_w = nullptr,
    *proj_b = nullptr, *ln2_w = nullptr, *ln2_b = nullptr, *fc_w = nullptr, *fc_b = nullptr,
    *fc2_w = nullptr, *fc2_b = nullptr;
};

// Where each of one block's parameters sits: the unit holding it (its attention or MLP
// sublayer) and its element offset from that unit's first element; unit -1 where the family has
// no such parameter.
struct ParamPlace {
  int unit = -1;
  int64_t offset = 0;
};
using BlockPlaces = std::array<ParamPlace, kNumParamRoles>;

// The block's parameters (or gradients) with its sublayer units at attn and mlp (either may be
// null when that sublayer is not being computed).
template <typename P>
BlockParams<P> bind_block(const BlockPlaces& o, int attn_unit, P* attn, P* mlp) {
  auto at = [&](ParamRole r) -> P* {
    const ParamPlace& pl = o[size_t(r)];
    if (pl.unit < 0) return nullptr;
    P* base = pl.unit == attn_unit ? attn : mlp;
    return base == nullptr ? nullptr : base + pl.offset;
  };
  using R = ParamRole;
  return {at(R::Norm1W), at(R::Norm1B), at(R::QkvW), at(R::QkvB), at(R::ProjW), at(R::ProjB),
          at(R::Norm2W), at(R::Norm2B), at(R::FcW),  at(R::FcB),  at(R::Fc2W),  at(R::Fc2B)};
}

// Saved activations of one block for the micro-batch; N = B*T rows.
template <typename T>
struct BlockActs {
  T* ln1;           // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  T* qkv;           // (N, QKV)  after RoPE for llama
  T* att;           // (B, NH, T, T)
  T* atty;          // (N, C)
  T* res2;          // (N, C)  residual after attention
  T* ln2;           // (N, C)
  float* ln2_mean;
  float* ln2_rstd;
  T* fch;      // (N, F) gpt2 pre-GELU; (N, 2F) llama gate|up
  T* fch_act;  // (N, F)
  T* res3;     // (N, C)  block output
};

template <typename T, typename G>
class TransformerImpl final : public Transformer {
 public:
  TransformerImpl(const ModelSpec& spec, void* params, void* grads, int B, int seq)
      : spec_(spec), cfg_(spec.config), B_(B), T_(seq), N_(int64_t(B) * seq) {
    const ModelConfig& m = cfg_;
    STRATA_CHECK(seq <= m.seq_len, "micro-batch sequence length ", seq, " exceeds model.seq_len ",
                 m.seq_len);
    gpt2_ = m.family == "gpt2";
    C_ = m.hidden, V_ = m.vocab, F_ = m.ffn_hidden, L_ = m.layers;
    NH_ = m.heads, KVH_ = m.kv_heads, HD_ = C_ / NH_;
    QKV_ = (NH_ + 2 * KVH_) * HD_;
    FCH_ = gpt2_ ? F_ : 2 * F_;
    P_ = static_cast<T*>(params);
    D_ = static_cast<G*>(grads);
    offsets();
    // Two passes over the layouts: first to size, then to point into the allocation.
    for (int pass = 0; pass < 2; ++pass) {
      acts_.rewind();
      work_.rewind();
      layout();
      if (pass == 0) {
        acts_.allocate(MemCategory::Activations);
        work_.allocate(MemCategory::Workspace);
      }
    }
  }

  double forward(const int32_t* inputs, const int32_t* targets, float dloss, bool train,
                 UnitHook* hook) override;
  void backward(UnitHook* hook) override;
  const void* logits() const override { return logits_; }
  int64_t counted_tokens() const override { return counted_; }

 private:
  void offsets();
  // The unit's parameters / gradients: from the hook when it places them, else the flat buffers.
  T* acquire(UnitHook* hook, int unit);
  void release(UnitHook* hook, int unit) {
    if (hook) hook->release_params(unit);
  }
  G* grads_of(UnitHook* hook, int unit);
  void done(UnitHook* hook, int unit, bool final) {
    if (hook) hook->unit_done(unit, final);
  }
  void layout();
  void attention_forward_part(int l, const BlockParams<T>& p, const T* x);
  void mlp_forward_part(int l, const BlockParams<T>& p);
  void mlp_backward_part(int l, const BlockParams<T>& p, const BlockParams<G>& g, T* dres);
  void attention_backward_part(int l, const BlockParams<T>& p, const BlockParams<G>& g, const T* x,
                               T* dres);
  const std::vector<int>& output_units() const { return tied_ ? vocab_ : output_; }

  const ModelSpec& spec_;
  ModelConfig cfg_;
  int B_, T_;
  int64_t N_;
  bool gpt2_ = true, tied_ = true;
  int C_ = 0, V_ = 0, F_ = 0, L_ = 0, NH_ = 0, KVH_ = 0, HD_ = 0, QKV_ = 0, FCH_ = 0;

  T* P_;  // flat parameters, or nullptr (every pass places them through its hook)
  G* D_;  // flat gradients, or nullptr
  // Units by kind (ModelSpec order) and where each block parameter sits.
  std::vector<int> vocab_, output_, attn_, mlp_;
  int position_ = -1, final_ = -1;
  std::vector<BlockPlaces> places_;
  int64_t o_lnf_w_ = -1, o_lnf_b_ = -1;  // inside the final-norm unit

  Arena acts_, work_;
  int32_t *inputs_ = nullptr, *targets_ = nullptr;
  T* encoded_ = nullptr;  // (N, C) embedding output = input of block 0
  std::vector<BlockActs<T>> ba_;
  T* lnf_ = nullptr;  // (N, C)
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  T* logits_ = nullptr;      // (N, V); overwritten by dlogits in a training forward
  float* losses_ = nullptr;  // (N)
  // Backward workspace.
  T *dres_ = nullptr, *dc_ = nullptr, *dbig_ = nullptr, *dbig2_ = nullptr;
  float* dlnf_ = nullptr;  // (N, C) the final norm's output gradient, summed over vocab units
  float *norm_scratch_ = nullptr, *att_scratch_ = nullptr;
  int64_t counted_ = 0;
};

template <typename T, typename G>
void TransformerImpl<T, G>::offsets() {
  tied_ = cfg_.tied_embeddings;
  vocab_ = spec_.units_of(UnitKind::Vocab);
  output_ = spec_.units_of(UnitKind::Output);
  attn_ = spec_.units_of(UnitKind::Attention);
  mlp_ = spec_.units_of(UnitKind::Mlp);
  const std::vector<int> pos = spec_.units_of(UnitKind::Position);
  position_ = pos.empty() ? -1 : pos.front();
  final_ = spec_.units_of(UnitKind::FinalNorm).front();
  STRATA_CHECK(int(attn_.size()) == L_ && int(mlp_.size()) == L_ && !vocab_.empty() &&
                   (tied_ || output_.size() == vocab_.size()),
               "the model spec's units do not match the model config");
  places_.assign(size_t(L_), BlockPlaces{});
  for (size_t u = 0; u < spec_.units.size(); ++u) {
    const UnitSpec& unit = spec_.units[u];
    for (int i : unit.params) {
      const ParamSpec& p = spec_.params[size_t(i)];
      if (unit.kind == UnitKind::Attention || unit.kind == UnitKind::Mlp) {
        places_[size_t(p.layer)][size_t(p.role)] = {int(u), p.offset - unit.offset};
      } else if (p.role == ParamRole::FinalNormW) {
        o_lnf_w_ = p.offset - unit.offset;
      } else if (p.role == ParamRole::FinalNormB) {
        o_lnf_b_ = p.offset - unit.offset;
      }
    }
  }
}

template <typename T, typename G>
T* TransformerImpl<T, G>::acquire(UnitHook* hook, int unit) {
  if (hook) {
    if (const void* p = hook->acquire_params(unit)) return static_cast<T*>(const_cast<void*>(p));
  }
  STRATA_CHECK(P_ != nullptr, "the model has no parameter buffer and its hook placed none for ",
               spec_.units[size_t(unit)].name);
  return P_ + spec_.units[size_t(unit)].offset;
}

template <typename T, typename G>
G* TransformerImpl<T, G>::grads_of(UnitHook* hook, int unit) {
  if (hook) {
    if (void* g = hook->grads_for(unit)) return static_cast<G*>(g);
  }
  STRATA_CHECK(D_ != nullptr, "the model has no gradient buffer and its hook placed none for ",
               spec_.units[size_t(unit)].name);
  return D_ + spec_.units[size_t(unit)].offset;
}

template <typename T, typename G>
void TransformerImpl<T, G>::layout() {
  const int64_t N = N_, C = C_;
  inputs_ = acts_.take<int32_t>(N);
  targets_ = acts_.take<int32_t>(N);
  encoded_ = acts_.take<T>(N * C);
  ba_.resize(size_t(L_));
  for (BlockActs<T>& a : ba_) {
    a.ln1 = acts_.take<T>(N * C);
    a.ln1_mean = acts_.take<float>(N);
    a.ln1_rstd = acts_.take<float>(N);
    a.qkv = acts_.take<T>(N * QKV_);
    a.att = acts_.take<T>(int64_t(B_) * NH_ * T_ * T_);
    a.atty = acts_.take<T>(N * C);
    a.res2 = acts_.take<T>(N * C);
    a.ln2 = acts_.take<T>(N * C);
    a.ln2_mean = acts_.take<float>(N);
    a.ln2_rstd = acts_.take<float>(N);
    a.fch = acts_.take<T>(N * FCH_);
    a.fch_act = acts_.take<T>(N * F_);
    a.res3 = acts_.take<T>(N * C);
  }
  lnf_ = acts_.take<T>(N * C);
  lnf_mean_ = acts_.take<float>(N);
  lnf_rstd_ = acts_.take<float>(N);
  logits_ = acts_.take<T>(N * V_);
  losses_ = acts_.take<float>(N);

  const int64_t big = std::max<int64_t>({QKV_, FCH_, C});
  dres_ = work_.take<T>(N * C);
  dc_ = work_.take<T>(N * C);
  dbig_ = work_.take<T>(N * big);
  dbig2_ = work_.take<T>(N * std::max<int64_t>(F_, C));
  dlnf_ = work_.take<float>(N * C);
  norm_scratch_ = work_.take<float>(int64_t(norm_backward_scratch_floats(int(N), C_)));
  att_scratch_ =
      work_.take<float>(int64_t(attention_backward_scratch_floats(B_, T_, NH_, KVH_, HD_)));
}

template <typename T, typename G>
void TransformerImpl<T, G>::attention_forward_part(int l, const BlockParams<T>& p, const T* x) {
  BlockActs<T>& a = ba_[size_t(l)];
  const int N = int(N_), C = C_;
  const float eps = cfg_.norm_eps;
  if (gpt2_) {
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, C, eps);
  } else {
    rmsnorm_forward(a.ln1, a.ln1_rstd, x, p.ln1_w, N, C, eps);
  }
  linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, QKV_);
  if (!gpt2_) rope_forward(a.qkv, B_, T_, NH_ + KVH_, HD_, QKV_, cfg_.rope_theta);
  attention_forward(a.atty, a.att, a.qkv, B_, T_, NH_, KVH_, HD_);
  linear_forward(a.res2, a.atty, p.proj_w, p.proj_b, N, NH_ * HD_, C);
  add_inplace(a.res2, x, N_ * C);
}

template <typename T, typename G>
void TransformerImpl<T, G>::mlp_forward_part(int l, const BlockParams<T>& p) {
  BlockActs<T>& a = ba_[size_t(l)];
  const int N = int(N_), C = C_;
  const float eps = cfg_.norm_eps;
  if (gpt2_) {
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C, eps);
    linear_forward(a.fch, a.ln2, p.fc_w, p.fc_b, N, C, F_);
    gelu_forward(a.fch_act, a.fch, size_t(N_) * F_);
  } else {
    rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, p.ln2_w, N, C, eps);
    linear_forward(a.fch, a.ln2, p.fc_w, static_cast<const T*>(nullptr), N, C, 2 * F_);
    swiglu_forward(a.fch_act, a.fch, N, F_);
  }
  linear_forward(a.res3, a.fch_act, p.fc2_w, p.fc2_b, N, F_, C);
  add_inplace(a.res3, a.res2, N_ * C);
}

// dres (N, C): on entry the gradient of the block's output; on exit that of the MLP's input res2
// (the MLP branch's gradient plus, unchanged, the residual's).
template <typename T, typename G>
void TransformerImpl<T, G>::mlp_backward_part(int l, const BlockParams<T>& p,
                                              const BlockParams<G>& g, T* dres) {
  const BlockActs<T>& a = ba_[size_t(l)];
  const int N = int(N_), C = C_;
  linear_backward(dbig2_, g.fc2_w, g.fc2_b, dres, a.fch_act, p.fc2_w, N, F_, C);
  if (gpt2_) {
    gelu_backward(dbig_, a.fch, dbig2_, size_t(N_) * F_);
  } else {
    swiglu_backward(dbig_, dbig2_, a.fch, N, F_);
  }
  linear_backward(dc_, g.fc_w, g.fc_b, dbig_, a.ln2, p.fc_w, N, C, FCH_);
  if (gpt2_) {
    layernorm_backward(dres, g.ln2_w, g.ln2_b, norm_scratch_, dc_, a.res2, p.ln2_w, a.ln2_mean,
                       a.ln2_rstd, N, C);
  } else {
    rmsnorm_backward(dres, g.ln2_w, norm_scratch_, dc_, a.res2, p.ln2_w, a.ln2_rstd, N, C);
  }
}

// dres (N, C): on entry the gradient of res2; on exit that of the block's input x.
template <typename T, typename G>
void TransformerImpl<T, G>::attention_backward_part(int l, const BlockParams<T>& p,
                                                    const BlockParams<G>& g, const T* x, T* dres) {
  const BlockActs<T>& a = ba_[size_t(l)];
  const int N = int(N_), C = C_;
  linear_backward(dc_, g.proj_w, g.proj_b, dres, a.atty, p.proj_w, N, NH_ * HD_, C);
  attention_backward(dbig_, att_scratch_, dc_, a.qkv, a.att, B_, T_, NH_, KVH_, HD_);
  if (!gpt2_) rope_backward(dbig_, B_, T_, NH_ + KVH_, HD_, QKV_, cfg_.rope_theta);
  linear_backward(dc_, g.qkv_w, g.qkv_b, dbig_, a.ln1, p.qkv_w, N, C, QKV_);
  if (gpt2_) {
    layernorm_backward(dres, g.ln1_w, g.ln1_b, norm_scratch_, dc_, x, p.ln1_w, a.ln1_mean,
                       a.ln1_rstd, N, C);
  } else {
    rmsnorm_backward(dres, g.ln1_w, norm_scratch_, dc_, x, p.ln1_w, a.ln1_rstd, N, C);
  }
}

namespace {
const int64_t kNoBatch[2] = {1, 1};
}

template <typename T, typename G>
double TransformerImpl<T, G>::forward(const int32_t* inputs, const int32_t* targets, float dloss,
                                      bool train, UnitHook* hook) {
  const int N = int(N_), C = C_;
  constexpr DType t = dtype_of<T>();
  counted_ = 0;
  for (int64_t i = 0; i < N_; ++i) {
    STRATA_CHECK(inputs[i] >= 0 && inputs[i] < V_, "token id ", inputs[i],
                 " is outside the model's vocabulary [0, ", V_, ")");
    inputs_[i] = inputs[i];
    targets_[i] = targets[i];
    counted_ += targets[i] >= 0;
  }
  if (hook) hook->begin_pass(UnitHook::Pass::Forward);
  for (int u : vocab_) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    embedding_forward(encoded_, inputs_, acquire(hook, u), unit.row_begin, unit.row_end, B_, T_, C);
    release(hook, u);
  }
  if (position_ >= 0) {
    position_forward(encoded_, acquire(hook, position_), B_, T_, C);
    release(hook, position_);
  }
  const T* x = encoded_;
  for (int l = 0; l < L_; ++l) {
    const BlockPlaces& pl = places_[size_t(l)];
    const int ua = attn_[size_t(l)], um = mlp_[size_t(l)];
    attention_forward_part(l, bind_block(pl, ua, acquire(hook, ua), static_cast<T*>(nullptr)), x);
    release(hook, ua);
    mlp_forward_part(l, bind_block(pl, ua, static_cast<T*>(nullptr), acquire(hook, um)));
    release(hook, um);
    x = ba_[size_t(l)].res3;
  }
  const T* pf = acquire(hook, final_);
  if (gpt2_) {
    layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, pf + o_lnf_w_, pf + o_lnf_b_, N, C,
                      cfg_.norm_eps);
  } else {
    rmsnorm_forward(lnf_, lnf_rstd_, x, pf + o_lnf_w_, N, C, cfg_.norm_eps);
  }
  release(hook, final_);
  // logits[:, rows] (N, rows) = lnf (N, C) · W[rows]ᵀ, one vocabulary unit at a time.
  for (int u : output_units()) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    matmul({logits_ + unit.row_begin, t, V_}, {lnf_, t, C, 1}, {acquire(hook, u), t, 1, C}, N_,
           rows, C, kNoBatch);
    release(hook, u);
  }
  if (train) {
    cross_entropy_forward_backward(losses_, logits_, targets_, N, V_, dloss);
  } else {
    cross_entropy_forward(losses_, logits_, targets_, N, V_);
  }
  double sum = 0.0;
  for (int64_t i = 0; i < N_; ++i) sum += losses_[i];
  return sum;
}

template <typename T, typename G>
void TransformerImpl<T, G>::backward(UnitHook* hook) {
  const int N = int(N_), C = C_;
  constexpr DType t = dtype_of<T>();
  if (hook) hook->begin_pass(UnitHook::Pass::Backward);
  // Output projection, last vocabulary unit first (descending offsets): logits_ holds dlogits
  // (N, V). dlnf (N, C) fp32 = Σ_units dlogits[:, rows] · W[rows], rounded once below;
  // dW[rows] += dlogits[:, rows]ᵀ · lnf. A tied unit's gradient is not final yet: the embedding
  // adds to it at the end of backward.
  const std::vector<int>& out = output_units();
  for (size_t k = out.size(); k-- > 0;) {
    const int u = out[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    const T* w = acquire(hook, u);
    G* dw = grads_of(hook, u);
    const T* dlogits = logits_ + unit.row_begin;
    matmul({dlnf_, DType::F32, C}, {dlogits, t, V_, 1}, {w, t, C, 1}, N_, C, rows, kNoBatch, 1.0f,
           k + 1 != out.size());
    matmul({dw, dtype_of<G>(), C}, {dlogits, t, 1, V_}, {lnf_, t, C, 1}, rows, C, N_, kNoBatch,
           1.0f, true);
    release(hook, u);
    done(hook, u, !tied_);
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N_ * C; ++i) dc_[i] = from_f32<T>(dlnf_[i]);
  std::fill(dres_, dres_ + N_ * C, from_f32<T>(0.0f));
  const T* x_last = L_ > 0 ? ba_[size_t(L_ - 1)].res3 : encoded_;
  const T* pf = acquire(hook, final_);
  G* gf = grads_of(hook, final_);
  if (gpt2_) {
    layernorm_backward(dres_, gf + o_lnf_w_, gf + o_lnf_b_, norm_scratch_, dc_, x_last,
                       pf + o_lnf_w_, lnf_mean_, lnf_rstd_, N, C);
  } else {
    rmsnorm_backward(dres_, gf + o_lnf_w_, norm_scratch_, dc_, x_last, pf + o_lnf_w_, lnf_rstd_, N,
                     C);
  }
  release(hook, final_);
  done(hook, final_, true);
  for (int l = L_ - 1; l >= 0; --l) {
    const BlockPlaces& pl = places_[size_t(l)];
    const int ua = attn_[size_t(l)], um = mlp_[size_t(l)];
    T* const no_t = nullptr;
    G* const no_g = nullptr;
    T* pm = acquire(hook, um);
    mlp_backward_part(l, bind_block(pl, ua, no_t, pm), bind_block(pl, ua, no_g, grads_of(hook, um)),
                      dres_);
    release(hook, um);
    done(hook, um, true);
    const T* x = l > 0 ? ba_[size_t(l - 1)].res3 : encoded_;
    T* pa = acquire(hook, ua);
    attention_backward_part(l, bind_block(pl, ua, pa, no_t),
                            bind_block(pl, ua, grads_of(hook, ua), no_g), x, dres_);
    release(hook, ua);
    done(hook, ua, true);
  }
  // The embedding reads no parameters: position (the higher offsets) first, then the vocabulary
  // units in descending order.
  if (position_ >= 0) {
    position_backward(grads_of(hook, position_), dres_, B_, T_, C);
    done(hook, position_, true);
  }
  for (size_t k = vocab_.size(); k-- > 0;) {
    const int u = vocab_[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    embedding_backward(grads_of(hook, u), unit.row_begin, unit.row_end, dres_, inputs_, B_, T_, C);
    done(hook, u, true);
  }
}

}  // namespace

std::vector<int> param_trace(const ModelSpec& spec, UnitHook::Pass pass) {
  const std::vector<int> vocab = spec.units_of(UnitKind::Vocab);
  const std::vector<int> pos = spec.units_of(UnitKind::Position);
  const std::vector<int> attn = spec.units_of(UnitKind::Attention);
  const std::vector<int> mlp = spec.units_of(UnitKind::Mlp);
  const int fin = spec.units_of(UnitKind::FinalNorm).front();
  const std::vector<int> out =
      spec.config.tied_embeddings ? vocab : spec.units_of(UnitKind::Output);
  std::vector<int> t;
  if (pass == UnitHook::Pass::Forward) {
    t = vocab;
    t.insert(t.end(), pos.begin(), pos.end());
    for (size_t l = 0; l < attn.size(); ++l) {
      t.push_back(attn[l]);
      t.push_back(mlp[l]);
    }
    t.push_back(fin);
    t.insert(t.end(), out.begin(), out.end());
  } else {
    t.assign(out.rbegin(), out.rend());
    t.push_back(fin);
    for (size_t l = attn.size(); l-- > 0;) {
      t.push_back(mlp[l]);
      t.push_back(attn[l]);
    }
  }
  return t;
}

std::unique_ptr<Transformer> make_transformer(const ModelSpec& spec, DType param_dtype,
                                              DType grad_dtype, void* params, void* grads, int B,
                                              int T) {
  if (param_dtype == DType::F32 && grad_dtype == DType::F32) {
    return std::make_unique<TransformerImpl<float, float>>(spec, params, grads, B, T);
  }
  if (param_dtype == DType::BF16 && grad_dtype == DType::F32) {
    return std::make_unique<TransformerImpl<bf16, float>>(spec, params, grads, B, T);
  }
  if (param_dtype == DType::BF16 && grad_dtype == DType::BF16) {
    return std::make_unique<TransformerImpl<bf16, bf16>>(spec, params, grads, B, T);
  }
  if (param_dtype == DType::F16 && grad_dtype == DType::F32) {
    return std::make_unique<TransformerImpl<f16, float>>(spec, params, grads, B, T);
  }
  if (param_dtype == DType::F16 && grad_dtype == DType::F16) {
    return std::make_unique<TransformerImpl<f16, f16>>(spec, params, grads, B, T);
  }
  STRATA_INPUT_FAIL("parameters in ", dtype_name(param_dtype), " with gradients accumulated in ",
                    dtype_name(grad_dtype),
                    " is not supported; set data_types.grad_accum_dtype to fp32 or to the "
                    "parameter dtype");
}

}  // namespace strata
