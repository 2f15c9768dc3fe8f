// Each sublayer's forward and its backward in two halves (input gradients; weight gradients, run
// with them or deferred): embedding, attention, MLP, final norm and head, with the tensor- and
// sequence-parallel mappings between them (tensor_parallel/mappings.h): each call names the half
// of the mapping it is.
#include "strata/model/transformer_impl.h"

namespace strata::model_detail {

// --- forward ------------------------------------------------------------------------------------

// Row-parallel linear: out (Ns, C) = x (N, in_l) · wᵀ summed over the group, + b. Each rank's
// partial sum over its heads or hidden units leaves the tensor-parallel region (under sequence
// parallelism into this rank's block of rows); the bias is added after the sum.
void TransformerImpl::row_parallel_forward(void* out, Tensor x, Tensor w, Tensor b) {
  if (tp_->size() == 1) return ops::linear_forward(hid(out), x, w, b);
  ops::linear_forward(full(sp_ ? part_ : out), x, w, Tensor());
  if (sp_) {
    reduce_scatter_to_sp::forward(*tp_, hid(out), full(part_));
  } else {
    reduce_from::forward(*tp_, hid(out));
  }
  if (b.data != nullptr) ops::add_bias(hid(out), b);
}

// out (Ns, C) = the family's norm of x with gain (and bias: layernorm); mean unused for rms.
void TransformerImpl::norm_forward(void* out, float* mean, float* rstd, const void* x, Tensor gain,
                                   Tensor bias) {
  const Tensor xin = hid(const_cast<void*>(x));
  if (gpt2_) {
    ops::layernorm_forward(hid(out), f32(mean, Ns_), f32(rstd, Ns_), xin, gain, bias,
                           cfg_.norm_eps);
  } else {
    ops::rmsnorm_forward(hid(out), f32(rstd, Ns_), xin, gain, cfg_.norm_eps, cfg_.norm_offset);
  }
}

void TransformerImpl::embed_forward(Slot& s, UnitHook* hook) {
  const Tensor tokens = ids(s.tokens);
  // Vocabulary-parallel: each rank writes the rows of the tokens it owns, the rest stay zero,
  // and the sum over the group is the embedding (under SP, each rank keeps its block of rows),
  // as Megatron's VocabParallelEmbedding.
  const bool multi = tp_->size() > 1;
  void* out = sp_ ? part_ : s.encoded;
  if (multi) ops::fill_zero(full(out));
  for (int u : vocab_) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::embedding_forward(full(out), tokens, mat(acquire(hook, u), pt_, rows, C_),
                           tp_layout_.vocab_begin + unit.row_begin,
                           tp_layout_.vocab_begin + unit.row_end);
    release(hook, u);
  }
  if (multi) {
    if (sp_) {
      reduce_scatter_to_sp::forward(*tp_, hid(s.encoded), full(out));
    } else {
      reduce_from::forward(*tp_, full(out));
    }
  }
  if (cfg_.embed_scale) ops::scale_inplace(hid(s.encoded), embed_scale_);
  if (position_ >= 0) {
    ops::position_forward(hid(s.encoded), mat(acquire(hook, position_), pt_, cfg_.seq_len, C_), T_,
                          sp_ ? tp_->rank() * Ns_ : 0, pos_.empty() ? nullptr : pos_.data(),
                          documents(s), seq_);
    release(hook, position_);
  }
}

void TransformerImpl::attn_forward(Slot& s, int l, const void* x, UnitHook* hook) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  const int ua = attn_[size_t(l)];
  void* P = acquire(hook, ua);
  using R = ParamRole;
  const Tensor xin = hid(const_cast<void*>(x));
  if (cfg_.pre_norm()) {
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(l, R::Norm1W, P, pt_),
                 param(l, R::Norm1B, P, pt_));
  }
  // Column-parallel QKV (this rank's heads), attention, row-parallel projection.
  const Tensor ln1 = column_input(attn_input(a, x));
  ops::linear_forward(mat(qk_norm_ ? a.qkv_in : a.qkv, pt_, N_, QKVl_), ln1,
                      param(l, R::QkvW, P, pt_), param(l, R::QkvB, P, pt_));
  if (qk_norm_) qk_norm_forward(a, l, P);
  if (cfg_.rope(l)) ops::rope_forward(mat(a.qkv, pt_, N_, QKVl_), att_shape_, rope_of(l));
  if (ulysses()) ulysses_to_heads(a.qkv, (core_att_shape_.rep + 2) * core_att_shape_.hd);
  attention_core_forward(a, l, a.atty);
  const Tensor atty = mat(a.atty, pt_, N_, Hl_);
  if (cfg_.post_norm()) {  // the attention's output normed before the residual adds it
    row_parallel_forward(a.attn_out, atty, param(l, R::ProjW, P, pt_), param(l, R::ProjB, P, pt_));
    norm_forward(a.res2, nullptr, a.attn_out_rstd, a.attn_out, param(l, R::PostAttnNormW, P, pt_),
                 Tensor());
  } else {
    row_parallel_forward(a.res2, atty, param(l, R::ProjW, P, pt_), param(l, R::ProjB, P, pt_));
  }
  release(hook, ua);
  ops::add_inplace(hid(a.res2), xin);
}

void TransformerImpl::select_layer(int l) {
  const int window = cfg_.sliding(l) ? cfg_.sliding_window : 0;
  att_shape_.window = core_att_shape_.window = window;
}

ops::QkNorm TransformerImpl::qk_norm_options() const {
  ops::QkNorm n;
  n.per_head = cfg_.qk_norm == "head";
  n.eps = cfg_.norm_eps;
  n.w_offset = cfg_.norm_offset;
  n.q_width = int64_t(cfg_.heads) * cfg_.hd();
  n.k_width = int64_t(cfg_.kv_heads) * cfg_.hd();
  return n;
}

// Whole q/k norms span every tensor-parallel rank's heads: their sums are all-reduced between
// the two calls (a plain collective, no mapping's half: its backward is qk_norm_backward_dot's).
void TransformerImpl::qk_norm_forward(const BlockActs& a, int l, void* P) {
  const ops::QkNorm n = qk_norm_options();
  const int64_t rows = n.per_head ? int64_t(tp_layout_.groups) * (tp_layout_.rep + 1) : 2;
  const Tensor qkv_in = mat(a.qkv_in, pt_, N_, QKVl_);
  Tensor sums;
  if (!n.per_head) {
    sums = mat(qk_sums_, DType::F32, N_, 2);
    ops::qk_norm_sumsq(sums, qkv_in, att_shape_);
    if (tp_->size() > 1) tp_->all_reduce(f32(qk_sums_, 2 * N_));
  }
  ops::qk_norm_forward(mat(a.qkv, pt_, N_, QKVl_), mat(a.qk_rstd, DType::F32, N_, rows), qkv_in,
                       param(l, ParamRole::QNormW, P, pt_), param(l, ParamRole::KNormW, P, pt_),
                       sums, att_shape_, n);
}

void TransformerImpl::qk_norm_backward(const BlockActs& a, int l, void* P, Tensor dwq, Tensor dwk,
                                       Tensor dqk, Tensor dqkv) {
  const ops::QkNorm n = qk_norm_options();
  const int64_t rows = n.per_head ? int64_t(tp_layout_.groups) * (tp_layout_.rep + 1) : 2;
  const Tensor qkv_in = mat(a.qkv_in, pt_, N_, QKVl_), rstd = mat(a.qk_rstd, DType::F32, N_, rows);
  const Tensor wq = param(l, ParamRole::QNormW, P, pt_), wk = param(l, ParamRole::KNormW, P, pt_);
  Tensor dot;
  if (!n.per_head) {
    dot = mat(qk_sums_, DType::F32, N_, 2);
    ops::qk_norm_backward_dot(dot, dqk, qkv_in, wq, wk, rstd, att_shape_, n);
    if (tp_->size() > 1) tp_->all_reduce(f32(qk_sums_, 2 * N_));
  }
  ops::qk_norm_backward(dqkv, dwq, dwk, dqk, qkv_in, wq, wk, rstd, dot, att_shape_, n);
}

Tensor TransformerImpl::post_norm_backward(int l, ParamRole r, void* P, void* G, const void* x,
                                           const float* rstd, void* stash, bool fuse) {
  const Tensor d = hid(d_post_), xin = hid(const_cast<void*>(x));
  const Tensor st = f32(const_cast<float*>(rstd), Ns_);
  ops::fill_zero(d);
  if (fuse) {
    ops::rmsnorm_backward(d, grad(l, r, G), norm_scratch(), hid(dres_), xin, param(l, r, P, pt_),
                          st, cfg_.norm_offset);
  } else {
    ops::rmsnorm_backward_input(d, hid(dres_), xin, param(l, r, P, pt_), st, cfg_.norm_offset);
    ops::copy(hid(stash), hid(dres_));
  }
  return d;
}

void TransformerImpl::attention_core_forward(const BlockActs& a, int l, void* out) {
  select_layer(l);
  if (chunk_.context.on()) return context_attention_forward(a, out);
  ops::attention_forward(out != nullptr ? mat(out, pt_, N_, Hl_) : Tensor(), att_view(a.att),
                         mat(a.qkv, pt_, N_, QKVl_), att_shape_);
}

void TransformerImpl::attention_core_backward(const BlockActs& a, int l, Tensor dout, Tensor dqkv) {
  select_layer(l);
  if (chunk_.context.on()) return context_attention_backward(a, dout, dqkv);
  const int64_t scratch = int64_t(ops::attention_backward_scratch_floats(dev_, pt_, att_shape_));
  ops::attention_backward(dqkv, f32(att_scratch_, scratch), dout, mat(a.qkv, pt_, N_, QKVl_),
                          att_view(a.att), att_shape_);
}

void TransformerImpl::mlp_forward(Slot& s, int l, UnitHook* hook, bool project) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  const int um = mlp_[size_t(l)];
  void* P = acquire(hook, um);
  using R = ParamRole;
  if (cfg_.pre_norm()) {
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, param(l, R::Norm2W, P, pt_),
                 param(l, R::Norm2B, P, pt_));
  }
  if (cfg_.moe_layer(l)) {
    moe_forward(s, l, P, hook, project);
    if (project) ops::add_inplace(hid(a.res3), hid(a.res2));
    return;
  }
  const Tensor ln2 = column_input(mlp_input(a));
  ops::linear_forward(mat(a.fch, pt_, N_, FCHl_), ln2, param(l, R::FcW, P, pt_),
                      param(l, R::FcB, P, pt_));
  if (gpt2_) {
    ops::gelu_forward(mat(a.fch_act, pt_, N_, Fl_), mat(a.fch, pt_, N_, FCHl_));
  } else if (cfg_.mlp_act == "gelu_tanh") {
    ops::geglu_forward(mat(a.fch_act, pt_, N_, Fl_), mat(a.fch, pt_, N_, FCHl_));
  } else {
    ops::swiglu_forward(mat(a.fch_act, pt_, N_, Fl_), mat(a.fch, pt_, N_, FCHl_));
  }
  // A recompute stops before the projection, whose output res3 is kept, but for a post norm,
  // whose backward reads its input (the projection's output, recomputed; the norm's own output
  // goes to the workspace).
  if (!project && !cfg_.post_norm()) return release(hook, um);
  const Tensor act = mat(a.fch_act, pt_, N_, Fl_);
  if (cfg_.post_norm()) {
    row_parallel_forward(a.mlp_out, act, param(l, R::Fc2W, P, pt_), param(l, R::Fc2B, P, pt_));
    norm_forward(project ? a.res3 : d_post_, nullptr, a.mlp_out_rstd, a.mlp_out,
                 param(l, R::PostMlpNormW, P, pt_), Tensor());
  } else {
    row_parallel_forward(a.res3, act, param(l, R::Fc2W, P, pt_), param(l, R::Fc2B, P, pt_));
  }
  release(hook, um);
  if (!project) return;
  ops::add_inplace(hid(a.res3), hid(a.res2));
}

double TransformerImpl::head_forward(Slot& s, const void* x, float dloss, bool train,
                                     UnitHook* hook) {
  void* pf = acquire(hook, final_);
  norm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, final_gain(pf, pt_), final_bias(pf, pt_));
  release(hook, final_);
  // logits[:, rows] (N, rows) = lnf (N, C) · W[rows]ᵀ, one vocabulary unit at a time: this
  // rank's vocabulary columns only (column-parallel over the vocabulary).
  const Tensor lnf = column_input(s.lnf);
  for (int u : output_units()) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::Gemm g;
    g.M = N_, g.N = rows, g.K = C_, g.trans_b = true, g.lda = C_, g.ldb = C_, g.ldc = Vl_;
    ops::gemm(logit_cols(s, unit.row_begin), lnf, mat(acquire(hook, u), pt_, rows, C_), g);
    release(hook, u);
  }
  const Tensor logits = mat(s.logits, pt_, N_, Vl_), targets = ids(s.targets);
  const Tensor losses = f32(s.losses, N_);
  // Gemma 2's soft-cap of the logits, in place: the loss and its gradient see the capped ones.
  if (cfg_.final_logit_softcapping > 0) ops::softcap_inplace(logits, cfg_.final_logit_softcapping);
  // Training keeps each row's statistics; the backward turns them into dlogits a unit at a time.
  s.dloss = dloss;
  if (tp_->size() == 1) {
    if (train) {
      ops::cross_entropy_stats(losses, f32(s.ce, 3 * N_), logits, targets);
    } else {
      ops::cross_entropy_forward(losses, logits, targets);
    }
  } else {
    // Vocabulary-parallel cross-entropy: the full logits never exist on one rank. Its two
    // collectives are plain ones, no mapping's half: they combine the rows' statistics (every
    // rank's maximum, then Σ exp and the target logit), which have no backward of their own (the
    // backward is local: softmax − one-hot on this rank's columns, from the saved statistics).
    const int64_t v0 = tp_layout_.vocab_begin, valid = tp_layout_.vocab_valid;
    const Tensor gmax = f32(s.ce, N_), sums = mat(s.ce + N_, DType::F32, 2, N_);
    ops::vocab_ce_max(gmax, logits, valid);
    tp_->all_gather(mat(ce_all_, DType::F32, tp_->size(), N_), mat(s.ce, DType::F32, 1, N_));
    ops::max_rows(gmax, mat(ce_all_, DType::F32, tp_->size(), N_));
    ops::vocab_ce_sums(sums, logits, targets, gmax, v0, valid);
    tp_->all_reduce(f32(s.ce + N_, 2 * N_));
    ops::vocab_ce_finish(losses, targets, gmax, sums);
  }
  return ops::sum(losses);
}

// --- backward -----------------------------------------------------------------------------------

std::pair<Tensor, int64_t> TransformerImpl::unit_dlogits(const Slot& s, const UnitSpec& unit,
                                                         bool compute) {
  const int64_t c0 = unit.row_begin, rows = unit.row_end - unit.row_begin;
  const Tensor logits = mat(s.logits, pt_, N_, Vl_);
  const int64_t v0 = tp_->size() > 1 ? tp_layout_.vocab_begin : 0;
  const int64_t valid = tp_->size() > 1 ? tp_layout_.vocab_valid : Vl_;
  if (widen_dlogits_) {
    const Tensor d = mat(dlogits32_, DType::F32, N_, rows);
    ops::ce_dlogits(d, rows, logits, ids(s.targets), f32(s.ce, 3 * N_), c0, rows, v0, valid,
                    s.dloss, cfg_.final_logit_softcapping);
    return {d, rows};
  }
  const Tensor cols = logit_cols(s, c0);
  if (compute) {
    ops::ce_dlogits(cols, Vl_, logits, ids(s.targets), f32(s.ce, 3 * N_), c0, rows, v0, valid,
                    s.dloss, cfg_.final_logit_softcapping);
  }
  return {cols, Vl_};
}

// dres (Ns, C): on exit the gradient of the final norm's input.
void TransformerImpl::head_backward(Slot& s, UnitHook* hook) {
  // dlnf (N, C) fp32 = Σ_units dlogits[:, rows] · W[rows] (this rank's vocabulary columns: a
  // partial sum over the group), rounded once.
  const std::vector<int>& out = output_units();
  const Tensor lnf = chunk_.defer_weight ? Tensor() : column_input(s.lnf);
  for (size_t k = out.size(); k-- > 0;) {
    const int u = out[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    const auto [dl, ld] = unit_dlogits(s, unit, true);
    const void* w = acquire(hook, u);
    ops::Gemm g;
    g.M = N_, g.N = C_, g.K = rows, g.lda = ld, g.ldb = C_, g.ldc = C_;
    g.accumulate = k + 1 != out.size();
    ops::gemm(mat(dlnf32_, DType::F32, N_, C_), dl, mat(const_cast<void*>(w), pt_, rows, C_), g);
    release(hook, u);
    if (!chunk_.defer_weight) {
      // dW[rows] += dlogits[:, rows]ᵀ · lnf
      void* dw = grads_of(hook, u);
      ops::Gemm gw;
      gw.M = rows, gw.N = C_, gw.K = N_, gw.trans_a = true, gw.lda = ld, gw.ldb = C_, gw.ldc = C_,
      gw.accumulate = true;
      ops::gemm(mat(dw, gt_, rows, C_), dl, lnf, gw);
      done(hook, u, !tied_);
    }
  }
  // The head's input entered the tensor-parallel region through column_input: its backward half.
  const Tensor d32 = mat(dlnf32_, DType::F32, N_, C_);
  if (sp_) {
    gather_from_sp::backward(*tp_, mat(dlnf32_, DType::F32, Ns_, C_), d32);
  } else {
    copy_to::backward(*tp_, d32);
  }
  // The final norm's output gradient (Ns, C), rounded to the parameter dtype.
  void* dy = chunk_.defer_weight ? s.dlnf : dc_;
  ops::copy(hid(dy), mat(dlnf32_, DType::F32, Ns_, C_));
  ops::fill_zero(hid(dres_));
  const void* x = block_input(s, l1_);
  void* pf = acquire(hook, final_);
  const bool fuse = !chunk_.defer_weight;
  void* gf = nullptr;
  if (fuse) begin_partials(final_), gf = grads_of(hook, final_);
  norm_backward(final_gain(pf, pt_), final_gain(final_grads(gf), gt_),
                final_bias(final_grads(gf), gt_), dy, x, s.lnf_mean, s.lnf_rstd, fuse);
  release(hook, final_);
  if (fuse) {
    settle_partials(final_, gf);
    done(hook, final_, true);
  }
}

void TransformerImpl::head_weight(Slot& s, UnitHook* hook) {
  const std::vector<int>& out = output_units();
  const Tensor lnf = column_input(s.lnf);
  for (size_t k = out.size(); k-- > 0;) {
    const int u = out[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    const auto [dl, ld] = unit_dlogits(s, unit, false);
    ops::Gemm gw;
    gw.M = rows, gw.N = C_, gw.K = N_, gw.trans_a = true, gw.lda = ld, gw.ldb = C_, gw.ldc = C_,
    gw.accumulate = true;
    ops::gemm(mat(grads_of(hook, u), gt_, rows, C_), dl, lnf, gw);
    done(hook, u, !tied_);
  }
  final_norm_weight(s, block_input(s, l1_), s.dlnf, hook);
}

void TransformerImpl::final_norm_weight(Slot& s, const void* x, void* dy, UnitHook* hook) {
  begin_partials(final_);
  void* gf = grads_of(hook, final_);
  norm_weight(final_gain(final_grads(gf), gt_), final_bias(final_grads(gf), gt_), dy, x, s.lnf_mean,
              s.lnf_rstd);
  settle_partials(final_, gf);
  done(hook, final_, true);
}

// The pieces of a sublayer's backward: norm → column-parallel → (attention | activation) →
// row-parallel, run in reverse. In each, `fuse` computes the weight gradients with the input
// gradients (G: the unit's gradients); otherwise only the input gradients, leaving the output
// gradients the weight half needs in the slot's stash.

// Row-parallel linear (w: (C, in_l)): its output gradient is dres on every row, through the
// backward half of the mapping its forward left the region by (gathered into `stash` under
// sequence parallelism; copied there for a deferred weight half). dx (N, in_l).
Tensor TransformerImpl::row_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G,
                                              void* stash, Tensor x, Tensor dx, Tensor dres,
                                              bool fuse) {
  Tensor dy = sp_ ? reduce_scatter_to_sp::backward(*tp_, full(stash), dres)
                  : reduce_from::backward(*tp_, dres);
  if (!fuse && !sp_) ops::copy(full(stash), dy), dy = full(stash);
  if (!fuse) {
    ops::linear_backward_input(dx, dy, param(l, w, P, pt_), false);
    return dy;
  }
  // Input and weight gradients in one call (dy widened once where half operands are).
  ops::linear_backward(dx, grad(l, w, G), sp_ ? Tensor() : grad(l, b, G), dy, x,
                       param(l, w, P, pt_));
  sp_bias_grad(grad(l, b, G), dy);
  return dy;
}

void TransformerImpl::row_parallel_weight(int l, ParamRole w, ParamRole b, void* G, Tensor dy,
                                          Tensor x) {
  ops::linear_backward_weight(grad(l, w, G), sp_ ? Tensor() : grad(l, b, G), dy, x);
  sp_bias_grad(grad(l, b, G), dy);
}

// The row-parallel bias is added after the sum over the group. Under sequence parallelism that
// is on this rank's rows only, so its gradient sums dy over them (without it, over every row,
// with the weight's gradient).
void TransformerImpl::sp_bias_grad(Tensor db, Tensor dy) {
  if (!sp_ || db.data == nullptr) return;
  const int64_t r = tp_->rank();
  ops::linear_backward_weight(Tensor(), db, dy.slice0(r * Ns_, (r + 1) * Ns_), Tensor());
}

// Column-parallel linear (w: (out_l, C)) reading the norm output `ln` (Ns, C) through
// column_input: dln (Ns, C) = its input gradient, through that mapping's backward half (summed
// over the group; reduce-scattered under SP).
void TransformerImpl::column_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G,
                                               Tensor dy, void* ln, void* dln, bool fuse) {
  const Tensor dfull = full(sp_ ? part_ : dln);
  if (fuse) {
    ops::linear_backward(dfull, grad(l, w, G), grad(l, b, G), dy, column_input(ln),
                         param(l, w, P, pt_));
  } else {
    ops::linear_backward_input(dfull, dy, param(l, w, P, pt_), false);
  }
  if (sp_) {
    gather_from_sp::backward(*tp_, hid(dln), dfull);
  } else {
    copy_to::backward(*tp_, dfull);
  }
}

// A norm (gain, bias; bias absent for rms): dres += its input gradient from dln (Ns, C); with
// fuse, dgain and dbias += the parameter gradients too.
void TransformerImpl::norm_backward(Tensor gain, Tensor dgain, Tensor dbias, void* dln,
                                    const void* x, const float* mean, const float* rstd,
                                    bool fuse) {
  const Tensor xin = hid(const_cast<void*>(x));
  const Tensor m = f32(const_cast<float*>(mean), Ns_), r = f32(const_cast<float*>(rstd), Ns_);
  if (fuse && gpt2_) {
    ops::layernorm_backward(hid(dres_), dgain, dbias, norm_scratch(), hid(dln), xin, gain, m, r);
  } else if (fuse) {
    ops::rmsnorm_backward(hid(dres_), dgain, norm_scratch(), hid(dln), xin, gain, r,
                          cfg_.norm_offset);
  } else if (gpt2_) {
    ops::layernorm_backward_input(hid(dres_), hid(dln), xin, gain, m, r);
  } else {
    ops::rmsnorm_backward_input(hid(dres_), hid(dln), xin, gain, r, cfg_.norm_offset);
  }
}

void TransformerImpl::norm_weight(Tensor dgain, Tensor dbias, void* dln, const void* x,
                                  const float* mean, const float* rstd) {
  const Tensor xin = hid(const_cast<void*>(x)), r = f32(const_cast<float*>(rstd), Ns_);
  if (gpt2_) {
    ops::layernorm_backward_weight(dgain, dbias, norm_scratch(), hid(dln), xin,
                                   f32(const_cast<float*>(mean), Ns_), r);
  } else {
    ops::rmsnorm_backward_weight(dgain, norm_scratch(), hid(dln), xin, r);
  }
}

// dres (Ns, C): on entry the gradient of the block's output; on exit that of the MLP's input
// res2 (the MLP branch's gradient plus, unchanged, the residual's).
void TransformerImpl::mlp_backward(Slot& s, int l, UnitHook* hook) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  const BlockStash& st = chunk_.defer_weight ? s.stash[size_t(l - l0_)] : fused_;
  const int um = mlp_[size_t(l)];
  using R = ParamRole;
  const bool fuse = !chunk_.defer_weight;
  void* dln2 = fuse ? dc_ : st.dln2;
  if (cfg_.moe_layer(l)) return moe_backward(s, l, hook, st, dln2, fuse);
  void* P = acquire(hook, um);
  void* G = nullptr;
  if (fuse) begin_partials(um), G = grads_of(hook, um);
  const Tensor d_act = mat(d_proj_in_, pt_, N_, Fl_);
  const Tensor dout = cfg_.post_norm() ? post_norm_backward(l, R::PostMlpNormW, P, G, a.mlp_out,
                                                            a.mlp_out_rstd, st.dpost_mlp, fuse)
                                       : hid(dres_);
  row_parallel_backward(l, R::Fc2W, R::Fc2B, P, G, st.dfc2, mat(a.fch_act, pt_, N_, Fl_), d_act,
                        dout, fuse);
  const Tensor dfch = mat(st.dfch, pt_, N_, FCHl_);
  if (gpt2_) {
    ops::gelu_backward(dfch, mat(a.fch, pt_, N_, FCHl_), d_act);
  } else if (cfg_.mlp_act == "gelu_tanh") {
    ops::geglu_backward(dfch, d_act, mat(a.fch, pt_, N_, FCHl_));
  } else {
    ops::swiglu_backward(dfch, d_act, mat(a.fch, pt_, N_, FCHl_));
  }
  column_parallel_backward(l, R::FcW, R::FcB, P, G, dfch, mlp_input(a), dln2, fuse);
  if (cfg_.pre_norm()) {
    norm_backward(param(l, R::Norm2W, P, pt_), grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), dln2,
                  a.res2, a.ln2_mean, a.ln2_rstd, fuse);
  } else {
    ops::add_inplace(hid(dres_), hid(dln2));
  }
  release(hook, um);
  if (fuse) {
    settle_partials(um, G);
    done(hook, um, true);
  }
}

void TransformerImpl::mlp_weight(Slot& s, int l, UnitHook* hook) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  const BlockStash& st = s.stash[size_t(l - l0_)];
  const int um = mlp_[size_t(l)];
  using R = ParamRole;
  if (cfg_.moe_layer(l)) return moe_weight(s, l, hook, st);
  begin_partials(um);
  void* G = grads_of(hook, um);
  if (cfg_.post_norm()) {
    ops::rmsnorm_backward_weight(grad(l, R::PostMlpNormW, G), norm_scratch(), hid(st.dpost_mlp),
                                 hid(a.mlp_out), f32(a.mlp_out_rstd, Ns_));
  }
  row_parallel_weight(l, R::Fc2W, R::Fc2B, G, full(st.dfc2), mat(a.fch_act, pt_, N_, Fl_));
  ops::linear_backward_weight(grad(l, R::FcW, G), grad(l, R::FcB, G), mat(st.dfch, pt_, N_, FCHl_),
                              column_input(mlp_input(a)));
  if (cfg_.pre_norm()) {
    norm_weight(grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), st.dln2, a.res2, a.ln2_mean,
                a.ln2_rstd);
  }
  settle_partials(um, G);
  done(hook, um, true);
}

// dres (Ns, C): on entry the gradient of res2; on exit that of the block's input x.
void TransformerImpl::attn_backward(Slot& s, int l, const void* x, UnitHook* hook) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  const BlockStash& st = chunk_.defer_weight ? s.stash[size_t(l - l0_)] : fused_;
  const int ua = attn_[size_t(l)];
  using R = ParamRole;
  const bool fuse = !chunk_.defer_weight;
  void* P = acquire(hook, ua);
  void* G = nullptr;
  if (fuse) begin_partials(ua), G = grads_of(hook, ua);
  const Tensor d_atty = mat(d_proj_in_, pt_, N_, Hl_);
  const Tensor dout = cfg_.post_norm() ? post_norm_backward(l, R::PostAttnNormW, P, G, a.attn_out,
                                                            a.attn_out_rstd, st.dpost_attn, fuse)
                                       : hid(dres_);
  row_parallel_backward(l, R::ProjW, R::ProjB, P, G, st.dproj, mat(a.atty, pt_, N_, Hl_), d_atty,
                        dout, fuse);
  const Tensor dqkv = mat(st.dqkv, pt_, N_, QKVl_);
  if (chunk_.recompute.selective && !full_recompute(l)) recompute_attention(a, l);
  // The gradient of the attention's input: of the projection's output, or of the q/k norms'.
  const Tensor dqk = qk_norm_ ? mat(d_qk_, pt_, N_, QKVl_) : dqkv;
  attention_core_backward(a, l, d_atty, dqk);
  if (cfg_.rope(l)) ops::rope_backward(dqk, att_shape_, rope_of(l));
  if (qk_norm_ && fuse) {
    qk_norm_backward(a, l, P, grad(l, R::QNormW, G), grad(l, R::KNormW, G), dqk, dqkv);
  } else if (qk_norm_) {  // the gains' gradients wait in the stash for the weight half
    // The query gains' part, then the key gains'.
    const int64_t qn = cfg_.qk_norm == "whole"
                           ? int64_t(tp_layout_.groups) * tp_layout_.rep * att_shape_.hd
                           : att_shape_.hd;
    ops::fill_zero(vec(st.dqk_gains, gt_, qk_gains()));
    qk_norm_backward(a, l, P, vec(st.dqk_gains, gt_, qn),
                     vec(at(st.dqk_gains, gt_, qn), gt_, qk_gains() - qn), dqk, dqkv);
  }
  void* dln1 = fuse ? dc_ : st.dln1;
  column_parallel_backward(l, R::QkvW, R::QkvB, P, G, dqkv, attn_input(a, x), dln1, fuse);
  if (cfg_.pre_norm()) {
    norm_backward(param(l, R::Norm1W, P, pt_), grad(l, R::Norm1W, G), grad(l, R::Norm1B, G), dln1,
                  x, a.ln1_mean, a.ln1_rstd, fuse);
  } else {
    ops::add_inplace(hid(dres_), hid(dln1));
  }
  release(hook, ua);
  if (fuse) {
    settle_partials(ua, G);
    done(hook, ua, true);
  }
}

void TransformerImpl::attn_weight(Slot& s, int l, const void* x, UnitHook* hook) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  const BlockStash& st = s.stash[size_t(l - l0_)];
  const int ua = attn_[size_t(l)];
  using R = ParamRole;
  begin_partials(ua);
  void* G = grads_of(hook, ua);
  if (cfg_.post_norm()) {
    ops::rmsnorm_backward_weight(grad(l, R::PostAttnNormW, G), norm_scratch(), hid(st.dpost_attn),
                                 hid(a.attn_out), f32(a.attn_out_rstd, Ns_));
  }
  row_parallel_weight(l, R::ProjW, R::ProjB, G, full(st.dproj), mat(a.atty, pt_, N_, Hl_));
  if (qk_norm_) {  // the q/k norms' gains, from the input half's stash
    const Tensor dwq = grad(l, R::QNormW, G), dwk = grad(l, R::KNormW, G);
    ops::add_inplace(dwq, vec(st.dqk_gains, gt_, dwq.numel()));
    ops::add_inplace(dwk, vec(at(st.dqk_gains, gt_, dwq.numel()), gt_, dwk.numel()));
  }
  ops::linear_backward_weight(grad(l, R::QkvW, G), grad(l, R::QkvB, G),
                              mat(st.dqkv, pt_, N_, QKVl_), column_input(attn_input(a, x)));
  if (cfg_.pre_norm()) {
    norm_weight(grad(l, R::Norm1W, G), grad(l, R::Norm1B, G), st.dln1, x, a.ln1_mean, a.ln1_rstd);
  }
  settle_partials(ua, G);
  done(hook, ua, true);
}

// The embedding reads no parameters: its whole backward is weight gradients. dres holds the
// gradient of the embedding's output (Ns, C).
void TransformerImpl::embed_backward(Slot& s, UnitHook* hook) {
  if (cfg_.embed_scale) ops::scale_inplace(hid(dres_), embed_scale_);
  if (chunk_.defer_weight) {
    ops::copy(hid(s.denc), hid(dres_));
    return;
  }
  embed_weight(s, hid(dres_), hook);
}

void TransformerImpl::embed_weight(Slot& s, Tensor denc, UnitHook* hook) {
  // Position (the higher offsets) first, then the vocabulary units in descending order.
  if (position_ >= 0) {
    begin_partials(position_);
    void* g = grads_of(hook, position_);
    void* gb = partials_[size_t(position_)].empty() ? g : scratch_;
    ops::position_backward(mat(gb, gt_, cfg_.seq_len, C_), denc, T_, sp_ ? tp_->rank() * Ns_ : 0,
                           pos_.empty() ? nullptr : pos_.data(), documents(s), seq_);
    settle_partials(position_, g);
    done(hook, position_, true);
  }
  // The embedding's sum over the group (embed_forward), backward: every rank's rows.
  const Tensor d = sp_ ? reduce_scatter_to_sp::backward(*tp_, full(part_), denc)
                       : reduce_from::backward(*tp_, denc);
  const Tensor tokens = ids(s.tokens);
  for (size_t k = vocab_.size(); k-- > 0;) {
    const int u = vocab_[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::embedding_backward(mat(grads_of(hook, u), gt_, rows, C_), d, tokens,
                            tp_layout_.vocab_begin + unit.row_begin,
                            tp_layout_.vocab_begin + unit.row_end);
    done(hook, u, true);
  }
}

}  // namespace strata::model_detail
