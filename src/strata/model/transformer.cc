#include "strata/model/transformer.h"

#include <algorithm>
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

// Element offsets of one block's parameters relative to the block unit's first element; -1 where
// the family has no such parameter.
struct BlockOffsets {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1, ln2_w = -1,
          ln2_b = -1, fc_w = -1, fc_b = -1, fc2_w = -1, fc2_b = -1;
};

template <typename P>
P* at_offset(P* base, int64_t off) {
  return off < 0 ? nullptr : base + off;
}

template <typename P>
BlockParams<P> bind_block(const BlockOffsets& o, P* base) {
  return {at_offset(base, o.ln1_w), at_offset(base, o.ln1_b),  at_offset(base, o.qkv_w),
          at_offset(base, o.qkv_b), at_offset(base, o.proj_w), at_offset(base, o.proj_b),
          at_offset(base, o.ln2_w), at_offset(base, o.ln2_b),  at_offset(base, o.fc_w),
          at_offset(base, o.fc_b),  at_offset(base, o.fc2_w),  at_offset(base, o.fc2_b)};
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
  void layout();
  void block_forward(int l, const BlockParams<T>& p, const T* x);
  void block_backward(int l, const BlockParams<T>& p, const BlockParams<G>& g, const T* x, T* dres);

  // Offset of a parameter inside its unit, which begins at unit_offset.
  int64_t rel(const std::string& name, int64_t unit_offset) const {
    return spec_.param(name).offset - unit_offset;
  }

  const ModelSpec& spec_;
  ModelConfig cfg_;
  int B_, T_;
  int64_t N_;
  bool gpt2_ = true;
  int C_ = 0, V_ = 0, F_ = 0, L_ = 0, NH_ = 0, KVH_ = 0, HD_ = 0, QKV_ = 0, FCH_ = 0;

  T* P_;  // flat parameters, or nullptr (every pass places them through its hook)
  G* D_;  // flat gradients, or nullptr
  // Offsets inside each unit: embedding (wte, wpe), head (final norm, untied output matrix; a
  // tied output matrix is wte of the embedding unit), blocks.
  int64_t o_wte_ = -1, o_wpe_ = -1, o_lnf_w_ = -1, o_lnf_b_ = -1, o_head_w_ = -1;
  std::vector<BlockOffsets> bo_;

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
  float *norm_scratch_ = nullptr, *att_scratch_ = nullptr;
  int64_t counted_ = 0;
};

template <typename T, typename G>
void TransformerImpl<T, G>::offsets() {
  const int64_t emb = spec_.units.front().offset, head = spec_.units.back().offset;
  o_wte_ = rel(gpt2_ ? "wte" : "embed_tokens", emb);
  if (gpt2_) o_wpe_ = rel("wpe", emb);
  o_lnf_w_ = rel(gpt2_ ? "ln_f.weight" : "norm.weight", head);
  if (gpt2_) o_lnf_b_ = rel("ln_f.bias", head);
  if (!cfg_.tied_embeddings) o_head_w_ = rel("lm_head.weight", head);
  bo_.resize(size_t(L_));
  for (int l = 0; l < L_; ++l) {
    const int64_t u = spec_.units[size_t(l + 1)].offset;
    BlockOffsets& b = bo_[size_t(l)];
    if (gpt2_) {
      std::string h = "h." + std::to_string(l) + ".";
      b.ln1_w = rel(h + "ln_1.weight", u), b.ln1_b = rel(h + "ln_1.bias", u);
      b.qkv_w = rel(h + "attn.c_attn.weight", u), b.qkv_b = rel(h + "attn.c_attn.bias", u);
      b.proj_w = rel(h + "attn.c_proj.weight", u), b.proj_b = rel(h + "attn.c_proj.bias", u);
      b.ln2_w = rel(h + "ln_2.weight", u), b.ln2_b = rel(h + "ln_2.bias", u);
      b.fc_w = rel(h + "mlp.c_fc.weight", u), b.fc_b = rel(h + "mlp.c_fc.bias", u);
      b.fc2_w = rel(h + "mlp.c_proj.weight", u), b.fc2_b = rel(h + "mlp.c_proj.bias", u);
    } else {
      std::string h = "layers." + std::to_string(l) + ".";
      b.ln1_w = rel(h + "input_layernorm.weight", u);
      b.qkv_w = rel(h + "self_attn.qkv_proj.weight", u);
      b.proj_w = rel(h + "self_attn.o_proj.weight", u);
      b.ln2_w = rel(h + "post_attention_layernorm.weight", u);
      b.fc_w = rel(h + "mlp.gate_up_proj.weight", u);
      b.fc2_w = rel(h + "mlp.down_proj.weight", u);
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
  norm_scratch_ = work_.take<float>(int64_t(norm_backward_scratch_floats(int(N), C_)));
  att_scratch_ =
      work_.take<float>(int64_t(attention_backward_scratch_floats(B_, T_, NH_, KVH_, HD_)));
}

template <typename T, typename G>
void TransformerImpl<T, G>::block_forward(int l, const BlockParams<T>& p, const T* x) {
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

// dres (N, C): on entry the gradient of the block's output; on exit that of its input x.
template <typename T, typename G>
void TransformerImpl<T, G>::block_backward(int l, const BlockParams<T>& p, const BlockParams<G>& g,
                                           const T* x, T* dres) {
  const BlockActs<T>& a = ba_[size_t(l)];
  const int N = int(N_), C = C_;
  // MLP branch: dres flows into fc2's output and, unchanged, along the residual.
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
  // Attention branch.
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

template <typename T, typename G>
double TransformerImpl<T, G>::forward(const int32_t* inputs, const int32_t* targets, float dloss,
                                      bool train, UnitHook* hook) {
  const int N = int(N_), C = C_;
  counted_ = 0;
  for (int64_t i = 0; i < N_; ++i) {
    STRATA_CHECK(inputs[i] >= 0 && inputs[i] < V_, "token id ", inputs[i],
                 " is outside the model's vocabulary [0, ", V_, ")");
    inputs_[i] = inputs[i];
    targets_[i] = targets[i];
    counted_ += targets[i] >= 0;
  }
  if (hook) hook->begin_pass(UnitHook::Pass::Forward);
  const T* pe = acquire(hook, 0);
  embedding_forward(encoded_, inputs_, pe + o_wte_, at_offset(pe, o_wpe_), B_, T_, C);
  release(hook, 0);
  const T* x = encoded_;
  for (int l = 0; l < L_; ++l) {
    T* pb = acquire(hook, l + 1);
    block_forward(l, bind_block(bo_[size_t(l)], pb), x);
    release(hook, l + 1);
    x = ba_[size_t(l)].res3;
  }
  const int head = L_ + 1;
  const T* ph = acquire(hook, head);
  const T* head_w = cfg_.tied_embeddings ? acquire(hook, 0) + o_wte_ : ph + o_head_w_;
  if (gpt2_) {
    layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, x, ph + o_lnf_w_, ph + o_lnf_b_, N, C,
                      cfg_.norm_eps);
  } else {
    rmsnorm_forward(lnf_, lnf_rstd_, x, ph + o_lnf_w_, N, C, cfg_.norm_eps);
  }
  linear_forward(logits_, lnf_, head_w, static_cast<const T*>(nullptr), N, C, V_);
  if (cfg_.tied_embeddings) release(hook, 0);
  release(hook, head);
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
  const int head = L_ + 1;
  const bool tied = cfg_.tied_embeddings;
  if (hook) hook->begin_pass(UnitHook::Pass::Backward);
  const T* ph = acquire(hook, head);
  const T* head_w = tied ? acquire(hook, 0) + o_wte_ : ph + o_head_w_;
  G* gh = grads_of(hook, head);
  G* ge = tied ? grads_of(hook, 0) : nullptr;  // the tied weight's gradient starts here
  G* dhead_w = tied ? ge + o_wte_ : gh + o_head_w_;
  // logits_ holds dlogits (N, V) after a training forward.
  linear_backward(dc_, dhead_w, static_cast<G*>(nullptr), logits_, lnf_, head_w, N, C, V_);
  std::fill(dres_, dres_ + N_ * C, from_f32<T>(0.0f));
  const T* x_last = L_ > 0 ? ba_[size_t(L_ - 1)].res3 : encoded_;
  if (gpt2_) {
    layernorm_backward(dres_, gh + o_lnf_w_, gh + o_lnf_b_, norm_scratch_, dc_, x_last,
                       ph + o_lnf_w_, lnf_mean_, lnf_rstd_, N, C);
  } else {
    rmsnorm_backward(dres_, gh + o_lnf_w_, norm_scratch_, dc_, x_last, ph + o_lnf_w_, lnf_rstd_, N,
                     C);
  }
  if (tied) release(hook, 0);
  release(hook, head);
  if (hook) hook->unit_done(head);
  for (int l = L_ - 1; l >= 0; --l) {
    const T* x = l > 0 ? ba_[size_t(l - 1)].res3 : encoded_;
    T* pb = acquire(hook, l + 1);
    G* gb = grads_of(hook, l + 1);
    block_backward(l, bind_block(bo_[size_t(l)], pb), bind_block(bo_[size_t(l)], gb), x, dres_);
    release(hook, l + 1);
    if (hook) hook->unit_done(l + 1);
  }
  if (!tied) ge = grads_of(hook, 0);
  embedding_backward(ge + o_wte_, at_offset(ge, o_wpe_), dres_, inputs_, B_, T_, C);
  if (hook) hook->unit_done(0);
}

}  // namespace

std::vector<int> param_trace(const ModelSpec& spec, UnitHook::Pass pass) {
  const int L = int(spec.config.layers), head = L + 1;
  const bool tied = spec.config.tied_embeddings;
  std::vector<int> t;
  if (pass == UnitHook::Pass::Forward) {
    for (int u = 0; u <= head; ++u) t.push_back(u);
    if (tied) t.push_back(0);
  } else {
    t.push_back(head);
    if (tied) t.push_back(0);
    for (int u = L; u >= 1; --u) t.push_back(u);
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
