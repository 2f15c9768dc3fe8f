// A mixture-of-experts MLP (model_config.h MoeConfig): the router, the experts (grouped linear
// layers over the rows routed to each, in the plan's order), the optional shared expert and its
// gate, and the balancing losses. The experts and the shared expert are split over the
// tensor-parallel group as a dense MLP is (each expert's gate|up by rows, its down projection by
// columns); the router and the shared gate are replicated and read every row (the norm's output
// as column_input gives it), so every rank routes alike. Each rank's partial output, the
// gate-weighted sum of its share of the experts, leaves the region through the row-parallel
// mapping; the gates' gradients, partial sums over the ranks' columns, are summed over the group
// before the router's backward.
#include <algorithm>

#include "strata/model/transformer_impl.h"

namespace strata::model_detail {

namespace {

// Rows [r0, r1) of a (rows, cols) view.
Tensor row_range(const Tensor& t, int64_t r0, int64_t r1) {
  const int64_t cols = t.numel() / t.dim(0);
  return Tensor(static_cast<char*>(t.data) + size_t(r0 * cols) * dtype_size(t.dtype), t.dtype,
                {r1 - r0, cols}, t.device);
}

}  // namespace

// The rows whose replicated-parameter gradients this rank computes, and those whose input
// gradients from the router and the shared gate it adds: under sequence parallelism its own
// block of rows for both (the gradients are then partial, summed with the norms'); otherwise
// every row for the weights, and the input gradients on the first rank only (every rank holds
// them whole, and the column-parallel input's backward sums the ranks').
std::pair<int64_t, int64_t> TransformerImpl::moe_weight_rows() const {
  if (sp_) return {tp_->rank() * Ns_, (tp_->rank() + 1) * Ns_};
  return {0, N_};
}
std::pair<int64_t, int64_t> TransformerImpl::moe_input_rows() const {
  if (sp_) return moe_weight_rows();
  return tp_->rank() == 0 ? std::pair<int64_t, int64_t>{0, N_} : std::pair<int64_t, int64_t>{0, 0};
}

void TransformerImpl::moe_forward(Slot& s, int l, void* P, bool project) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  using R = ParamRole;
  const Tensor x = column_input(mlp_input(a));  // (N, C), every row
  // The router in fp32: logits (N, E) into probs, then the choices and the plan.
  const Tensor probs = mat(a.router_probs, DType::F32, N_, E_);
  ops::Gemm g;
  g.M = N_, g.N = E_, g.K = C_, g.trans_b = true, g.lda = C_, g.ldb = C_, g.ldc = E_;
  ops::gemm(probs, x, param(l, R::RouterW, P, pt_), g);
  const Tensor top = mat(a.moe_top, DType::I32, N_, K_),
               gates = mat(a.moe_gates, DType::F32, N_, K_);
  ops::moe_route_forward(probs, f32(a.router_lse, N_), top, gates, probs, route_);
  const Tensor counts = Tensor(a.moe_counts, DType::I32, {int64_t(E_)}, dev_);
  const Tensor plan = mat(a.moe_pos, DType::I32, N_, K_);
  ops::moe_plan(counts, plan, Tensor(a.moe_rows, DType::I32, {NK_}, dev_), top, probs, E_,
                capacity_);
  ops::copy_to_host(counts32_.data(), counts);
  std::vector<int64_t>& n = s.expert_counts[size_t(l - l0_)];
  int64_t kept = 0;  // the rows the experts take (all N·k but those dropped)
  for (int e = 0; e < E_; ++e) kept += n[size_t(e)] = counts32_[size_t(e)];
  if (balanced()) {  // the balancing statistics of each sequence, summed over its context ranks
    const Tensor stats = f32(moe_stats_, int64_t(B_) * 2 * E_);
    ops::moe_balance_stats(stats, probs, top, T_);
    if (chunk_.context.on() && chunk_.context.comm != nullptr) {
      tp_->all_reduce(stats, chunk_.context.comm);
    }
    ops::copy_to_host(s.moe_stats[size_t(l - l0_)].data(), stats);
  }
  if (cfg_.moe.z_loss_coef > 0) {  // each row's logsumexp, for the z-loss's value
    ops::copy_to_host(s.moe_lse[size_t(l - l0_)].data(), f32(a.router_lse, N_));
  }
  // The experts: their rows gathered in the plan's order, gate|up, SwiGLU, down.
  const int64_t* rows = n.data();
  const Tensor xp = mat(a.xp, pt_, kept, C_), efch = mat(a.efch, pt_, kept, 2 * Fel_);
  const Tensor eact = mat(a.eact, pt_, kept, Fel_), ey = mat(a.ey, pt_, kept, C_);
  ops::gather_rows(xp, x, Tensor(a.moe_rows, DType::I32, {kept}, dev_));
  ops::grouped_linear_forward(efch, xp, param(l, R::ExpertGateUpW, P, pt_), rows, E_);
  ops::swiglu_forward(eact, efch);
  ops::grouped_linear_forward(ey, eact, param(l, R::ExpertDownW, P, pt_), rows, E_);
  if (Fsl_ > 0) {  // the shared expert, every row; its gate's logits
    const Tensor fch = mat(a.fch, pt_, N_, 2 * Fsl_), act = mat(a.fch_act, pt_, N_, Fsl_);
    ops::linear_forward(fch, x, param(l, R::SharedFcW, P, pt_), Tensor());
    ops::swiglu_forward(act, fch);
    ops::linear_forward(full(a.sout), act, param(l, R::SharedFc2W, P, pt_), Tensor());
    if (cfg_.moe.shared_gate) {
      ops::Gemm gg;
      gg.M = N_, gg.N = 1, gg.K = C_, gg.trans_b = true, gg.lda = C_, gg.ldb = C_, gg.ldc = 1;
      ops::gemm(mat(a.sgate, DType::F32, N_, 1), x, param(l, R::SharedGateW, P, pt_), gg);
    }
  }
  // This rank's partial output: the gate-weighted experts plus the (gated) shared expert, summed
  // over the group into res3. A recompute needs only the gate's sigmoid of it (res3 is kept).
  void* out = project ? a.res3 : moe_part_;
  const bool partial = tp_->size() > 1 && project;
  const Tensor o = full(partial && sp_ ? moe_part_ : out);
  ops::moe_combine(o, mat(a.ey, pt_, NK_, C_), plan, gates);
  if (Fsl_ > 0 && cfg_.moe.shared_gate) {
    ops::moe_gate_forward(o, full(a.sout), f32(a.sgate, N_));
  } else if (Fsl_ > 0) {
    ops::add_inplace(o, full(a.sout));
  }
  if (!partial) return;
  if (sp_) {
    reduce_scatter_to_sp::forward(*tp_, hid(out), o);
  } else {
    reduce_from::forward(*tp_, hid(out));
  }
}

int64_t TransformerImpl::kept_rows(const Slot& s, int l) const {
  int64_t kept = 0;
  for (int64_t n : s.expert_counts[size_t(l - l0_)]) kept += n;
  return kept;
}

void TransformerImpl::take_expert_tokens(std::vector<double>& tokens) {
  STRATA_CHECK(int64_t(tokens.size()) == int64_t(cfg_.layers) * E_,
               "take_expert_tokens: ", tokens.size(), " values for ", cfg_.layers, " layers of ",
               E_, " experts");
  for (size_t i = 0; i < expert_tokens_.size(); ++i) {
    tokens[size_t(l0_) * size_t(E_) + i] += double(expert_tokens_[i]);
    expert_tokens_[i] = 0;
  }
}

// The balancing loss of a sequence of T tokens is this factor times Σ_e c_e·P_e, c_e the choices
// of expert e and P_e the sum of its probability over the rows: pooled over the L MoE layers
// (transformers'), E/(L·T)²; per layer (Megatron's), E/(k·T²).
double TransformerImpl::balance_norm() const {
  const double T = double(seq_), E = double(E_), L = double(cfg_.moe_layers());
  return cfg_.moe.aux_loss == "pooled" ? E / (L * T * L * T) : E / (double(K_) * T * T);
}

// After a micro-batch's forward through the chunk: its balancing and z-losses, weighted, summed
// over its sequences (the balancing part once per context-parallel group, the z-loss for this
// rank's rows).
double TransformerImpl::moe_aux_loss(const Slot& s) const {
  const MoeConfig& m = cfg_.moe;
  const double Tf = double(seq_);
  double sum = 0.0;
  if (balanced() && chunk_.context.rank == 0) {
    const double norm = balance_norm();
    const bool pooled = m.aux_loss == "pooled";
    for (int b = 0; b < B_; ++b) {
      for (int e = 0; e < E_; ++e) {
        double c = 0.0, p = 0.0;  // pooled: over every MoE layer
        for (int l = l0_; l < l1_; ++l) {
          if (!cfg_.moe_layer(l)) continue;
          const float* st = s.moe_stats[size_t(l - l0_)].data() + int64_t(b) * 2 * E_;
          if (!pooled) sum += m.router_aux_loss_coef * norm * st[e] * st[E_ + e];
          c += st[e], p += st[E_ + e];
        }
        if (pooled) sum += m.router_aux_loss_coef * norm * c * p;
      }
    }
  }
  if (m.z_loss_coef > 0) {
    for (int l = l0_; l < l1_; ++l) {
      if (!cfg_.moe_layer(l)) continue;
      for (float v : s.moe_lse[size_t(l - l0_)]) sum += m.z_loss_coef * double(v) * v / Tf;
    }
  }
  return sum;
}

// The balancing loss's gradient with respect to block l's probabilities, per sequence and
// expert, into moe_coef_ (B, E); returns nothing when there is no balancing loss.
Tensor TransformerImpl::moe_coef(const Slot& s, int l) {
  if (!balanced()) return Tensor();
  const MoeConfig& m = cfg_.moe;
  const bool pooled = m.aux_loss == "pooled";
  const double w = double(s.aux_scale) * m.router_aux_loss_coef * balance_norm();
  for (int b = 0; b < B_; ++b) {
    for (int e = 0; e < E_; ++e) {
      double c = 0.0;  // the choices of expert e: this layer's, or every MoE layer's (pooled)
      for (int k = pooled ? l0_ : l; k < (pooled ? l1_ : l + 1); ++k) {
        if (cfg_.moe_layer(k)) c += s.moe_stats[size_t(k - l0_)][size_t(int64_t(b) * 2 * E_ + e)];
      }
      coef_host_[size_t(b * E_ + e)] = float(w * c);
    }
  }
  const Tensor coef = mat(moe_coef_, DType::F32, B_, E_);
  ops::copy_from_host(coef, coef_host_.data());
  return coef;
}

// dres (Ns, C): on entry the gradient of the block's output; the MoE MLP's input gradient goes to
// dln (Ns, C). fuse: the weight gradients too (G: the unit's), else the stash keeps what the
// weight half needs.
void TransformerImpl::moe_backward(Slot& s, int l, void* P, void* G, const BlockStash& st,
                                   void* dln, bool fuse) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  using R = ParamRole;
  const int64_t* rows = s.expert_counts[size_t(l - l0_)].data();
  // The output's gradient on every row, through the row-parallel mapping's backward half.
  const Tensor dy = sp_ ? reduce_scatter_to_sp::backward(*tp_, full(part_), hid(dres_))
                        : reduce_from::backward(*tp_, hid(dres_));
  const Tensor gates = mat(a.moe_gates, DType::F32, N_, K_);
  const Tensor plan = mat(a.moe_pos, DType::I32, N_, K_);
  const Tensor dey = mat(fuse ? dey_ : st.dey, pt_, NK_, C_);
  const Tensor dgates = f32(dgw_, N_ * K_), dsgate = f32(dgw_ + N_ * K_, N_);
  ops::moe_combine_backward(dey, dgates, dy, mat(a.ey, pt_, NK_, C_), plan, gates);
  const Tensor ds = full(fuse ? dshared_ : st.dfc2);
  if (Fsl_ > 0 && cfg_.moe.shared_gate) {
    ops::moe_gate_backward(ds, dsgate, dy, full(a.sout), f32(a.sgate, N_));
  } else if (Fsl_ > 0) {
    ops::copy(ds, dy);
  }
  // The gates' gradients are partial sums over the ranks' experts' columns: summed once (with the
  // shared gate's), a plain collective (no activation crosses a region).
  if (tp_->size() > 1) tp_->all_reduce(f32(dgw_, N_ * K_ + (cfg_.moe.shared_gate ? N_ : 0)));
  const Tensor dlogits = mat(fuse ? dlogits_ : st.dlogits, DType::F32, N_, E_);
  const float z =
      cfg_.moe.z_loss_coef > 0 ? float(double(s.aux_scale) * cfg_.moe.z_loss_coef / seq_) : 0.0f;
  ops::moe_route_backward(dlogits, dgates, mat(a.router_probs, DType::F32, N_, E_),
                          f32(a.router_lse, N_), mat(a.moe_top, DType::I32, N_, K_), gates,
                          moe_coef(s, l), T_, z, route_);
  if (!fuse && cfg_.moe.shared_gate) ops::copy(f32(st.dsgate, N_), dsgate);
  // The experts, backward: down, SwiGLU, gate|up.
  // The experts' rows: the N·k choices but those dropped.
  const int64_t kept = kept_rows(s, l);
  const Tensor dek = mat(dey.data, pt_, kept, C_);
  const Tensor deact = mat(deact_, pt_, kept, Fel_);
  const Tensor defch = mat(fuse ? defch_ : st.defch, pt_, kept, 2 * Fel_);
  const Tensor wdown = param(l, R::ExpertDownW, P, pt_), wgu = param(l, R::ExpertGateUpW, P, pt_);
  ops::grouped_linear_backward_input(deact, dek, wdown, rows, E_);
  if (fuse) {
    ops::grouped_linear_backward_weight(grad(l, R::ExpertDownW, G), dek,
                                        mat(a.eact, pt_, kept, Fel_), rows, E_);
  }
  ops::swiglu_backward(defch, deact, mat(a.efch, pt_, kept, 2 * Fel_));
  ops::grouped_linear_backward_input(mat(dxp_, pt_, kept, C_), defch, wgu, rows, E_);
  const Tensor x = fuse ? column_input(mlp_input(a)) : Tensor();
  if (fuse) {
    ops::grouped_linear_backward_weight(grad(l, R::ExpertGateUpW, G), defch,
                                        mat(a.xp, pt_, kept, C_), rows, E_);
  }
  // The input gradient (N, C), a partial sum over the group: the experts' rows summed back to
  // their tokens, the shared expert's, the gate's and the router's (these two where
  // moe_input_rows says).
  const Tensor dfull = full(sp_ ? part_ : dln);
  ops::moe_combine(dfull, mat(dxp_, pt_, NK_, C_), plan, Tensor());
  if (Fsl_ > 0) {
    const Tensor dact = mat(d_proj_in_, pt_, N_, Fsl_);
    const Tensor dfch = mat(fuse ? d_wide_out_ : st.dfch, pt_, N_, 2 * Fsl_);
    const Tensor wsd = param(l, R::SharedFc2W, P, pt_), wsu = param(l, R::SharedFcW, P, pt_);
    ops::linear_backward_input(dact, ds, wsd, false);
    if (fuse) {
      ops::linear_backward_weight(grad(l, R::SharedFc2W, G), Tensor(), ds,
                                  mat(a.fch_act, pt_, N_, Fsl_));
    }
    ops::swiglu_backward(dfch, dact, mat(a.fch, pt_, N_, 2 * Fsl_));
    ops::linear_backward_input(dfull, dfch, wsu, true);
    if (fuse) ops::linear_backward_weight(grad(l, R::SharedFcW, G), Tensor(), dfch, x);
  }
  const auto [i0, i1] = moe_input_rows();
  if (i1 > i0) {
    ops::Gemm g;
    g.M = i1 - i0, g.N = C_, g.K = E_, g.lda = E_, g.ldb = C_, g.ldc = C_, g.accumulate = true;
    ops::gemm(row_range(dfull, i0, i1), row_range(dlogits, i0, i1), param(l, R::RouterW, P, pt_),
              g);
    if (cfg_.moe.shared_gate) {
      g.K = 1, g.lda = 1;
      ops::gemm(row_range(dfull, i0, i1), row_range(mat(dsgate.data, DType::F32, N_, 1), i0, i1),
                param(l, R::SharedGateW, P, pt_), g);
    }
  }
  if (fuse) moe_replicated_weight(l, G, dlogits, mat(dsgate.data, DType::F32, N_, 1), x);
  // The column-parallel input's backward half.
  if (sp_) {
    gather_from_sp::backward(*tp_, hid(dln), dfull);
  } else {
    copy_to::backward(*tp_, dfull);
  }
}

// The router's and the shared gate's weight gradients: dW += dlogitsᵀ · x over moe_weight_rows.
void TransformerImpl::moe_replicated_weight(int l, void* G, Tensor dlogits, Tensor dsgate,
                                            Tensor x) {
  using R = ParamRole;
  const auto [w0, w1] = moe_weight_rows();
  ops::Gemm g;
  g.M = E_, g.N = C_, g.K = w1 - w0, g.trans_a = true, g.lda = E_, g.ldb = C_, g.ldc = C_;
  g.accumulate = true;
  ops::gemm(grad(l, R::RouterW, G), row_range(dlogits, w0, w1), row_range(x, w0, w1), g);
  if (cfg_.moe.shared_gate) {
    g.M = 1, g.lda = 1;
    ops::gemm(grad(l, R::SharedGateW, G), row_range(dsgate, w0, w1), row_range(x, w0, w1), g);
  }
}

void TransformerImpl::moe_weight(Slot& s, int l, void* G, const BlockStash& st) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  using R = ParamRole;
  const int64_t* rows = s.expert_counts[size_t(l - l0_)].data();
  const Tensor x = column_input(mlp_input(a));
  const int64_t kept = kept_rows(s, l);
  ops::grouped_linear_backward_weight(grad(l, R::ExpertDownW, G), mat(st.dey, pt_, kept, C_),
                                      mat(a.eact, pt_, kept, Fel_), rows, E_);
  ops::grouped_linear_backward_weight(grad(l, R::ExpertGateUpW, G),
                                      mat(st.defch, pt_, kept, 2 * Fel_), mat(a.xp, pt_, kept, C_),
                                      rows, E_);
  if (Fsl_ > 0) {
    ops::linear_backward_weight(grad(l, R::SharedFc2W, G), Tensor(), full(st.dfc2),
                                mat(a.fch_act, pt_, N_, Fsl_));
    ops::linear_backward_weight(grad(l, R::SharedFcW, G), Tensor(), mat(st.dfch, pt_, N_, 2 * Fsl_),
                                x);
  }
  moe_replicated_weight(l, G, mat(st.dlogits, DType::F32, N_, E_),
                        mat(st.dsgate, DType::F32, N_, 1), x);
}

}  // namespace strata::model_detail
