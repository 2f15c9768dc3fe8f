// A mixture-of-experts MLP (model_config.h MoeConfig): the router, the experts (grouped linear
// layers over the rows routed to each, in the plan's order), the optional shared expert and its
// gate, and the balancing losses. The experts and the shared expert are split over the
// tensor-parallel group as a dense MLP is (each expert's gate|up by rows, its down projection by
// columns); the router and the shared gate are replicated and read every row (the norm's output
// as column_input gives it), so every rank routes alike. Each rank's partial output, the
// gate-weighted sum of its share of the experts, leaves the region through the row-parallel
// mapping; the gates' gradients, partial sums over the ranks' columns, are summed over the group
// before the router's backward.
//
// Expert parallelism (spec_.ep, over the group ep_): each rank holds El of the E experts and
// routes its own rows. After the plan the ranks exchange how many rows each sends to each expert
// (an all-to-all of counts), then the rows themselves (an all-to-all-v: the plan's order is by
// expert, so the rows for each rank's experts are one block); each rank regroups what it received
// by expert (the order the senders' ranks give within each expert), runs its experts, and sends the
// outputs back the same way, where the combine sums each token's k outputs in its fixed order. The
// backward sends the outputs' gradients the same way and the inputs' gradients back. Under tensor
// parallelism every rank of a tensor-parallel group dispatches every row to the ranks of its
// expert-parallel group with its tensor coordinate, which hold its column share of their experts.
//
// The all-gather dispatch (spec_.ep.all_gather) moves whole tokens instead: every rank gathers
// the group's tokens, plans and gates, takes the rows its experts were chosen for (in the
// all-to-all's order, so its experts compute the same rows alike), and sums, for every token of
// the group, the gate-weighted outputs of the choices its experts took; a reduce-scatter sums
// the ranks' sums into each rank's own tokens. Backward: the output's gradient gathered, the
// gates' and the inputs' gradients reduce-scattered. A token's k outputs are then summed per rank
// and over the ranks, not in its fixed choice order: equal to the one-process sum to rounding.
//
// Whole experts beside tensor parallelism (spec_.ep.whole, expert_tensor 1, under sequence
// parallelism): the router still reads every row, so the balancing statistics and the router's
// backward are the split experts' alike, but each rank plans, dispatches and combines only its
// own sequence-parallel rows (mine(): rows [mr0_, mr0_ + Nm_)) through whole experts, over an
// expert-parallel group drawn from the stage's tp × dp × cp ranks. Its output rows are then
// complete: without a shared expert they are the block's output as they stand; with one they
// join its partial sums (zeros on the other rows) in the reduce-scatter. The gates' gradients of
// the other ranks' rows are zero here and summed over the group like the split experts' partial
// ones.
#include <algorithm>
#include <chrono>

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

Tensor TransformerImpl::mine(const Tensor& t) const {
  return row_range(t, mr0_, mr0_ + Nm_);
}

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

void TransformerImpl::moe_forward(Slot& s, int l, void* P, UnitHook* hook, bool project) {
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
  Tensor bias;  // the sigmoid router's, this block's
  if (route_.sigmoid && expert_bias_ != nullptr) {
    bias = f32(moe_bias_, E_);
    ops::copy_from_host(bias, expert_bias_ + int64_t(l) * E_);
  }
  ops::moe_route_forward(probs, f32(a.router_lse, N_), top, gates, probs, route_, bias);
  // The plan of the rows this rank dispatches (every row, or with whole experts its own).
  const Tensor counts = Tensor(a.moe_counts, DType::I32, {int64_t(E_)}, dev_);
  const Tensor plan = mine(mat(a.moe_pos, DType::I32, N_, K_));
  ops::moe_plan(counts, plan, Tensor(a.moe_rows, DType::I32, {NKm_}, dev_), mine(top), mine(probs),
                E_, capacity_);
  ops::copy_to_host(counts32_.data(), counts);
  std::vector<int64_t>& n = s.expert_counts[size_t(l - l0_)];
  for (int e = 0; e < E_; ++e) n[size_t(e)] = counts32_[size_t(e)];
  const int64_t kept = kept_rows(s, l);  // the rows the experts take (all N·k but those dropped)
  if (balanced()) {  // the balancing statistics of each sequence, summed over its context ranks
    const Tensor stats = f32(moe_stats_, int64_t(B_) * 2 * E_);
    ops::moe_balance_stats(stats, probs, top, T_, route_.sigmoid);
    if (chunk_.context.on() && chunk_.context.comm != nullptr) {
      tp_->all_reduce(stats, chunk_.context.comm);
    }
    ops::copy_to_host(s.moe_stats[size_t(l - l0_)].data(), stats);
  }
  if (cfg_.moe.z_loss_coef > 0) {  // each row's logsumexp, for the z-loss's value
    ops::copy_to_host(s.moe_lse[size_t(l - l0_)].data(), f32(a.router_lse, N_));
  }
  // The experts' rows gathered in the plan's order; under expert parallelism sent to their ranks
  // (the counts' exchange, a few integers, first), the shared expert running meanwhile where
  // spec_.ep.overlap says.
  const Tensor moe_rows = Tensor(a.moe_rows, DType::I32, {kept}, dev_);
  const Tensor xm = mine(x);
  comm::Handle in_flight;
  if (ep_gather_) {
    in_flight = ep_gather_start(a, xm);
  } else if (ep_size_ > 1) {
    ops::gather_rows(mat(ep_send_, pt_, kept, C_), xm, moe_rows);
    ep_exchange_counts(s, l);
    in_flight = ep_send(s, l, ep_send_, C_);
  } else {
    ops::gather_rows(mat(a.xp, pt_, kept, C_), xm, moe_rows);
  }
  const auto arrive = [&] {
    if (ep_gather_) {
      ep_gather_finish(s, l, in_flight);
    } else if (ep_size_ > 1) {
      ep_receive(s, l, in_flight, a.xp, C_);
    }
  };
  if (!spec_.ep.overlap) arrive();
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
  release(hook, mlp_[size_t(l)]);
  if (spec_.ep.overlap) arrive();
  // The experts: gate|up, SwiGLU, down (and the outputs sent back).
  const int ue = experts_[size_t(l)];
  void* PE = acquire(hook, ue);
  const int64_t rows = local_rows(s, l);
  const int64_t* per = local_counts(s, l);
  const Tensor xp = mat(a.xp, pt_, rows, C_), efch = mat(a.efch, pt_, rows, 2 * Fel_);
  const Tensor eact = mat(a.eact, pt_, rows, Fel_);
  const Tensor ey = mat(ep_size_ > 1 && !ep_gather_ ? ep_out_ : a.ey, pt_, rows, C_);
  ops::grouped_linear_forward(efch, xp, param(l, R::ExpertGateUpW, PE, pt_), per, El_);
  ops::swiglu_forward(eact, efch);
  ops::grouped_linear_forward(ey, eact, param(l, R::ExpertDownW, PE, pt_), per, El_);
  release(hook, ue);
  if (ep_size_ > 1 && !ep_gather_) ep_from_experts(s, l, ep_out_, a.ey, C_);
  // This rank's partial output: the gate-weighted experts plus the (gated) shared expert, summed
  // over the group into res3. A recompute needs only the gate's sigmoid of it (res3 is kept).
  // Whole experts give this rank's own rows complete (zeros elsewhere before the shared
  // expert's partial sums join them); without a shared expert nothing is summed.
  void* out = project ? a.res3 : moe_part_;
  const bool partial = tp_->size() > 1 && project, own = whole_experts_ && Fsl_ == 0;
  const Tensor o =
      own ? (project ? hid(out) : mine(full(moe_part_))) : full(partial && sp_ ? moe_part_ : out);
  if (whole_experts_ && !own) ops::fill_zero(o);
  const Tensor om = own ? o : mine(o);
  if (ep_gather_) {
    ep_gather_combine(a, rows, a.ey, a.ag_gates, om);
  } else {
    ops::moe_combine(om, mat(a.ey, pt_, NKm_, C_), plan, mine(gates));
  }
  if (Fsl_ > 0 && cfg_.moe.shared_gate) {
    ops::moe_gate_forward(o, full(a.sout), f32(a.sgate, N_));
  } else if (Fsl_ > 0) {
    ops::add_inplace(o, full(a.sout));
  }
  if (!partial || own) return;
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

// Runs an expert-parallel collective, its time added to ep_seconds_.
template <typename F>
void TransformerImpl::timed_ep(F&& collective) {
  const auto t0 = std::chrono::steady_clock::now();
  collective();
  ep_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t TransformerImpl::local_rows(const Slot& s, int l) const {
  if (ep_size_ == 1) return kept_rows(s, l);
  int64_t rows = 0;
  for (int64_t n : s.ep_rows[size_t(l - l0_)]) rows += n;
  return rows;
}

const int64_t* TransformerImpl::local_counts(const Slot& s, int l) const {
  return ep_size_ > 1 ? s.ep_rows[size_t(l - l0_)].data() : s.expert_counts[size_t(l - l0_)].data();
}

// Each rank sends rank j the counts of j's experts (the plan's counts are by global expert, so
// block j of them); what arrives is, per sender, the rows it routes to each of this rank's experts.
void TransformerImpl::ep_exchange_counts(Slot& s, int l) {
  const size_t b = size_t(l - l0_);
  std::vector<int64_t>& got = s.ep_counts[b];
  std::vector<int64_t>& rows = s.ep_rows[b];
  if (ep_ != nullptr) {
    timed_ep(
        [&] { ep_->all_to_all(counts32_.data(), ep_counts32_.data(), size_t(El_), DType::I32); });
  } else {  // a dry run: no rows arrive
    STRATA_CHECK(ops::dry_run(), "expert parallelism over ", ep_size_,
                 " ranks needs its group (ChunkOptions::experts)");
    std::fill(ep_counts32_.begin(), ep_counts32_.end(), 0);
  }
  std::fill(rows.begin(), rows.end(), 0);
  for (size_t i = 0; i < got.size(); ++i) {
    got[i] = ep_counts32_[i];
    rows[i % size_t(El_)] += got[i];
  }
  STRATA_CHECK(local_rows(s, l) <= R_, "expert-parallel rank ", spec_.ep.rank, " received ",
               local_rows(s, l), " rows for its experts, more than the ", R_, " it holds room for");
}

// The all-to-all-v's counts, in elements of `width` per row: to the experts' ranks (each rank's
// block of the plan's counts out, the senders' rows to this rank's experts in), or back.
void TransformerImpl::ep_set_counts(const Slot& s, int l, int64_t width, bool to_experts) {
  const size_t b = size_t(l - l0_), P = size_t(ep_size_);
  for (size_t j = 0; j < P; ++j) {
    int64_t mine = 0, theirs = 0;  // rows this rank routes to j's experts; rows j routes here
    for (size_t e = 0; e < size_t(El_); ++e) {
      mine += s.expert_counts[b][j * size_t(El_) + e];
      theirs += s.ep_counts[b][j * size_t(El_) + e];
    }
    ep_v_counts_[to_experts ? j : P + j] = size_t(mine * width);
    ep_v_counts_[to_experts ? P + j : j] = size_t(theirs * width);
  }
}

// Rows received from the ranks in turn (each rank's rows by expert) against the same rows grouped
// by expert (each expert's rows by sending rank): the gather index from the first order into the
// second (to_experts), or back.
Tensor TransformerImpl::ep_permutation(const Slot& s, int l, bool to_experts) {
  const std::vector<int64_t>& got = s.ep_counts[size_t(l - l0_)];
  const int64_t rows = local_rows(s, l);
  int32_t* idx = ep_idx_host_.data();
  int64_t at = 0;  // position in the expert order
  for (int e = 0; e < El_; ++e) {
    int64_t from = 0;  // the first row of sender r's rows for expert e, in the senders' order
    for (int r = 0; r < ep_size_; ++r) {
      const int64_t* sent = got.data() + size_t(r) * size_t(El_);
      int64_t base = from;
      for (int k = 0; k < e; ++k) base += sent[k];
      for (int64_t i = 0; i < sent[e]; ++i, ++at) {
        if (to_experts) {
          idx[at] = int32_t(base + i);
        } else {
          idx[base + i] = int32_t(at);
        }
      }
      for (int k = 0; k < El_; ++k) from += sent[k];
    }
  }
  const Tensor t(ep_idx_, DType::I32, {rows}, dev_);
  ops::copy_from_host(t, idx);
  return t;
}

comm::Handle TransformerImpl::ep_send(const Slot& s, int l, const void* plan_rows, int64_t width) {
  ep_set_counts(s, l, width, true);
  if (ep_ == nullptr) return {};
  return ep_->all_to_all_v_async(plan_rows, ep_recv_, ep_v_counts_.data(), pt_,
                                 ops::record(ops::compute_stream()));
}

void TransformerImpl::ep_receive(const Slot& s, int l, comm::Handle& sent, void* local,
                                 int64_t width) {
  const int64_t rows = local_rows(s, l);
  const ops::Event arrived = sent.event();
  timed_ep([&] { sent.wait(); });
  ops::wait(ops::compute_stream(), arrived);
  ops::gather_rows(mat(local, pt_, rows, width), mat(ep_recv_, pt_, rows, width),
                   ep_permutation(s, l, true));
}

void TransformerImpl::ep_to_experts(const Slot& s, int l, const void* plan_rows, void* local,
                                    int64_t width) {
  comm::Handle sent = ep_send(s, l, plan_rows, width);
  ep_receive(s, l, sent, local, width);
}

void TransformerImpl::ep_from_experts(const Slot& s, int l, const void* local, void* plan_rows,
                                      int64_t width) {
  const int64_t rows = local_rows(s, l);
  ops::gather_rows(mat(ep_recv_, pt_, rows, width), mat(const_cast<void*>(local), pt_, rows, width),
                   ep_permutation(s, l, false));
  ep_set_counts(s, l, width, false);
  if (ep_ != nullptr) {
    timed_ep([&] { ep_->all_to_all_v(ep_recv_, plan_rows, ep_v_counts_.data(), pt_); });
  }
}

// Every rank's counts (by global expert), tokens, plan and gates gathered (issued here; the
// handle of the last).
comm::Handle TransformerImpl::ep_gather_start(const BlockActs& a, const Tensor& x) {
  if (ep_ == nullptr) {  // a dry run: no rows arrive
    STRATA_CHECK(ops::dry_run(), "expert parallelism over ", ep_size_,
                 " ranks needs its group (ChunkOptions::experts)");
    std::fill(ep_gathered_counts_.begin(), ep_gathered_counts_.end(), 0);
    return {};
  }
  const ops::Event written = ops::record(ops::compute_stream());
  ep_->all_gather_async(counts32_.data(), ep_gathered_counts_.data(), size_t(E_), DType::I32);
  ep_->all_gather_async(x.data, ep_all_, size_t(Nm_ * C_), pt_, written);
  ep_->all_gather_async(a.moe_pos + mr0_ * K_, a.ag_pos, size_t(NKm_), DType::I32, written);
  return ep_->all_gather_async(a.moe_gates + mr0_ * K_, a.ag_gates, size_t(NKm_), DType::F32,
                               written);
}

// After the gathers: the rows each rank routes to this rank's experts (s.ep_counts, s.ep_rows,
// as the all-to-all's count exchange gives them); the gathered plans turned into each choice's
// row among this rank's experts' rows (a.ag_pos, -1 where another rank's expert or none takes
// it), those rows in the all-to-all's order (by expert, then sending rank, then the sender's
// plan order), gathered into a.xp.
void TransformerImpl::ep_gather_finish(Slot& s, int l, comm::Handle& gathered) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  const size_t b = size_t(l - l0_), P = size_t(ep_size_), E = size_t(E_), El = size_t(El_);
  const int64_t all_rows = int64_t(P) * Nm_;
  const ops::Event arrived = gathered.event();
  timed_ep([&] { gathered.wait(); });  // and every gather issued before it
  ops::wait(ops::compute_stream(), arrived);
  const std::vector<int32_t>& counts = ep_gathered_counts_;  // (ep, E)
  std::vector<int64_t>& got = s.ep_counts[b];
  std::vector<int64_t>& per = s.ep_rows[b];
  std::fill(per.begin(), per.end(), 0);
  for (size_t r = 0; r < P; ++r) {
    for (size_t e = 0; e < El; ++e) {
      got[r * El + e] = counts[r * E + size_t(e0_) + e];
      per[e] += got[r * El + e];
    }
  }
  const int64_t rows = local_rows(s, l);
  STRATA_CHECK(rows <= R_, "expert-parallel rank ", spec_.ep.rank, " takes ", rows,
               " rows for its experts, more than the ", R_, " it holds room for");
  if (ops::dry_run()) return;
  // first[r·El + e]: the row of sender r's first row for local expert e; off: a sender's plan
  // rows by global expert (its counts' prefix sums).
  std::vector<int64_t>& first = ep_first_;
  std::vector<int64_t>& off = ep_off_;
  for (size_t e = 0, at = 0; e < El; ++e) {
    for (size_t r = 0; r < P; ++r) first[r * El + e] = int64_t(at), at += size_t(got[r * El + e]);
  }
  const Tensor pos(a.ag_pos, DType::I32, {all_rows * K_}, dev_);
  int32_t* p = ep_pos_host_.data();
  int32_t* idx = ep_idx_host_.data();
  ops::copy_to_host(p, pos);
  for (size_t r = 0; r < P; ++r) {
    off[0] = 0;
    for (size_t g = 0; g < E; ++g) off[g + 1] = off[g] + counts[r * E + g];
    for (int64_t i = 0; i < NKm_; ++i) {
      int32_t& q = p[int64_t(r) * NKm_ + i];
      if (q < 0) continue;
      const auto g = size_t(std::upper_bound(off.begin(), off.end(), int64_t(q)) - off.begin() - 1);
      if (g < size_t(e0_) || g >= size_t(e0_) + El) {
        q = -1;
        continue;
      }
      const int64_t row = first[r * El + (g - size_t(e0_))] + (q - off[g]);
      idx[row] = int32_t(int64_t(r) * Nm_ + i / K_);
      q = int32_t(row);
    }
  }
  ops::copy_from_host(pos, p);
  const Tensor order(ep_idx_, DType::I32, {rows}, dev_);
  ops::copy_from_host(order, idx);
  ops::gather_rows(mat(a.xp, pt_, rows, C_), mat(ep_all_, pt_, all_rows, C_), order);
}

// out (Nm, C) = the sum over the group of each rank's rows of y (`rows` of this rank's experts'
// rows) for this rank's tokens, each weighted by its gate (gates nullptr: unweighted, the input
// gradient's sum): each rank sums the choices its experts took for every token of the group,
// then a reduce-scatter sums the ranks' sums.
void TransformerImpl::ep_gather_combine(const BlockActs& a, int64_t rows, void* y,
                                        const float* gates, Tensor out) {
  const int64_t all_rows = int64_t(ep_size_) * Nm_;
  ops::moe_combine(
      mat(ep_all_, pt_, all_rows, C_), mat(y, pt_, rows, C_),
      mat(a.ag_pos, DType::I32, all_rows, K_),
      gates != nullptr ? mat(const_cast<float*>(gates), DType::F32, all_rows, K_) : Tensor());
  if (ep_ != nullptr) {
    timed_ep([&] { ep_->reduce_scatter(ep_all_, out.data, size_t(Nm_ * C_), pt_, pt_); });
  }
}

// The combine's backward: the output's gradient dy (Nm, C) gathered from every rank; this rank's
// experts' rows' gradients (dey, in their order) and the gates' gradients of the choices they
// took (0 elsewhere), summed over the group into each rank's dgates (Nm·k): one rank's value and
// zeros, exact.
void TransformerImpl::ep_gather_combine_backward(const Slot& s, int l, const Tensor& dy, void* dey,
                                                 const Tensor& dgates) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  const int64_t all_rows = int64_t(ep_size_) * Nm_, rows = local_rows(s, l);
  if (ep_ != nullptr) {
    timed_ep([&] { ep_->all_gather(dy.data, ep_all_, size_t(Nm_ * C_), pt_); });
  }
  ops::moe_combine_backward(mat(dey, pt_, rows, C_), f32(ep_dgates_, all_rows * K_),
                            mat(ep_all_, pt_, all_rows, C_), mat(a.ey, pt_, rows, C_),
                            mat(a.ag_pos, DType::I32, all_rows, K_),
                            mat(a.ag_gates, DType::F32, all_rows, K_));
  if (ep_ != nullptr) {
    timed_ep([&] {
      ep_->reduce_scatter(ep_dgates_, dgates.data, size_t(NKm_), DType::F32, DType::F32);
    });
  }
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

// dres (Ns, C): on entry the gradient of the block's output; on exit that of the MLP's input res2
// (the MLP branch's gradient plus the residual's); dln (Ns, C) receives the gradient of the norm's
// output on the way. fuse: the weight gradients too (each unit's reported done), else the stash
// keeps what the weight half needs.
void TransformerImpl::moe_backward(Slot& s, int l, UnitHook* hook, const BlockStash& st, void* dln,
                                   bool fuse) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  using R = ParamRole;
  const int um = mlp_[size_t(l)], ue = experts_[size_t(l)];
  // The output's gradient on every row, through the row-parallel mapping's backward half (whole
  // experts without a shared expert need only this rank's own rows).
  const bool own = whole_experts_ && Fsl_ == 0;
  const Tensor dy = own   ? hid(dres_)
                    : sp_ ? reduce_scatter_to_sp::backward(*tp_, full(part_), hid(dres_))
                          : reduce_from::backward(*tp_, hid(dres_));
  const Tensor dym = own ? dy : mine(dy);
  const Tensor gates = mat(a.moe_gates, DType::F32, N_, K_);
  const Tensor plan = mine(mat(a.moe_pos, DType::I32, N_, K_));
  // The experts' output gradients in the plan's order (this rank's rows), then grouped by expert
  // on the rows this rank's experts took: one buffer without expert parallelism.
  void* dey_local = fuse ? dey_ : st.dey;
  void* dey_plan = ep_size_ > 1 && !ep_gather_ ? ep_send_ : dey_local;
  // The gates' gradients of this rank's choices; with whole experts those of the other ranks'
  // rows are theirs, zero here, and the sum over the group below gives every row's.
  const Tensor dgates = f32(dgw_, N_ * K_), dsgate = f32(dgw_ + N_ * K_, N_);
  if (whole_experts_) ops::fill_zero(dgates);
  const Tensor dgm = mine(mat(dgw_, DType::F32, N_, K_));
  if (ep_gather_) {
    ep_gather_combine_backward(s, l, dym, dey_local, dgm);
  } else {
    ops::moe_combine_backward(mat(dey_plan, pt_, NKm_, C_), dgm, dym, mat(a.ey, pt_, NKm_, C_),
                              plan, mine(gates));
  }
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
  // The experts, backward: down, SwiGLU, gate|up; their unit first (it follows the MLP's in the
  // flat order, so it is reported done first).
  if (ep_size_ > 1 && !ep_gather_) ep_to_experts(s, l, dey_plan, dey_local, C_);
  const int64_t rows = local_rows(s, l);
  const int64_t* per = local_counts(s, l);
  void* PE = acquire(hook, ue);
  void* GE = fuse ? grads_of(hook, ue) : nullptr;
  const Tensor dek = mat(dey_local, pt_, rows, C_);
  const Tensor deact = mat(deact_, pt_, rows, Fel_);
  const Tensor defch = mat(fuse ? defch_ : st.defch, pt_, rows, 2 * Fel_);
  ops::grouped_linear_backward_input(deact, dek, param(l, R::ExpertDownW, PE, pt_), per, El_);
  if (fuse) {
    ops::grouped_linear_backward_weight(grad(l, R::ExpertDownW, GE), dek,
                                        mat(a.eact, pt_, rows, Fel_), per, El_);
  }
  ops::swiglu_backward(defch, deact, mat(a.efch, pt_, rows, 2 * Fel_));
  ops::grouped_linear_backward_input(mat(dxp_, pt_, rows, C_), defch,
                                     param(l, R::ExpertGateUpW, PE, pt_), per, El_);
  if (fuse) {
    ops::grouped_linear_backward_weight(grad(l, R::ExpertGateUpW, GE), defch,
                                        mat(a.xp, pt_, rows, C_), per, El_);
  }
  release(hook, ue);
  if (fuse) done(hook, ue, true);
  if (ep_size_ > 1 && !ep_gather_) ep_from_experts(s, l, dxp_, ep_send_, C_);
  // The MLP unit: the input gradient (N, C), a partial sum over the group: the experts' rows
  // summed back to their tokens, the shared expert's, the gate's and the router's (these two
  // where moe_input_rows says).
  void* P = acquire(hook, um);
  void* G = nullptr;
  if (fuse) begin_partials(um), G = grads_of(hook, um);
  const Tensor x = fuse ? column_input(mlp_input(a)) : Tensor();
  // With whole experts, the experts' input gradients of this rank's own rows (and zeros elsewhere
  // where the shared expert's partial sums join them; without one, straight into dln).
  const Tensor dfull = own ? Tensor() : full(sp_ ? part_ : dln);
  const Tensor dmine = own ? hid(dln) : mine(dfull);
  if (whole_experts_ && !own) ops::fill_zero(dfull);
  if (ep_gather_) {
    ep_gather_combine(a, rows, dxp_, nullptr, dmine);
  } else {
    ops::moe_combine(dmine, mat(ep_size_ > 1 ? ep_send_ : dxp_, pt_, NKm_, C_), plan, Tensor());
  }
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
    const Tensor din = own ? dmine : row_range(dfull, i0, i1);  // own: the same rows
    ops::Gemm g;
    g.M = i1 - i0, g.N = C_, g.K = E_, g.lda = E_, g.ldb = C_, g.ldc = C_, g.accumulate = true;
    ops::gemm(din, row_range(dlogits, i0, i1), param(l, R::RouterW, P, pt_), g);
    if (cfg_.moe.shared_gate) {
      g.K = 1, g.lda = 1;
      ops::gemm(din, row_range(mat(dsgate.data, DType::F32, N_, 1), i0, i1),
                param(l, R::SharedGateW, P, pt_), g);
    }
  }
  if (fuse) moe_replicated_weight(l, G, dlogits, mat(dsgate.data, DType::F32, N_, 1), x);
  // The column-parallel input's backward half, then the norm's.
  if (sp_ && !own) {  // (own: dln holds this rank's rows already)
    gather_from_sp::backward(*tp_, hid(dln), dfull);
  } else if (!sp_) {
    copy_to::backward(*tp_, dfull);
  }
  norm_backward(param(l, R::Norm2W, P, pt_), grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), dln,
                a.res2, a.ln2_mean, a.ln2_rstd, fuse);
  release(hook, um);
  if (fuse) {
    settle_partials(um, G);
    done(hook, um, true);
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

void TransformerImpl::moe_weight(Slot& s, int l, UnitHook* hook, const BlockStash& st) {
  const BlockActs& a = s.blocks[size_t(l - l0_)];
  using R = ParamRole;
  const int um = mlp_[size_t(l)], ue = experts_[size_t(l)];
  const int64_t rows = local_rows(s, l);
  const int64_t* per = local_counts(s, l);
  void* GE = grads_of(hook, ue);
  ops::grouped_linear_backward_weight(grad(l, R::ExpertDownW, GE), mat(st.dey, pt_, rows, C_),
                                      mat(a.eact, pt_, rows, Fel_), per, El_);
  ops::grouped_linear_backward_weight(grad(l, R::ExpertGateUpW, GE),
                                      mat(st.defch, pt_, rows, 2 * Fel_), mat(a.xp, pt_, rows, C_),
                                      per, El_);
  done(hook, ue, true);
  begin_partials(um);
  void* G = grads_of(hook, um);
  const Tensor x = column_input(mlp_input(a));
  if (Fsl_ > 0) {
    ops::linear_backward_weight(grad(l, R::SharedFc2W, G), Tensor(), full(st.dfc2),
                                mat(a.fch_act, pt_, N_, Fsl_));
    ops::linear_backward_weight(grad(l, R::SharedFcW, G), Tensor(), mat(st.dfch, pt_, N_, 2 * Fsl_),
                                x);
  }
  moe_replicated_weight(l, G, mat(st.dlogits, DType::F32, N_, E_),
                        mat(st.dsgate, DType::F32, N_, 1), x);
  norm_weight(grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), st.dln2, a.res2, a.ln2_mean,
              a.ln2_rstd);
  settle_partials(um, G);
  done(hook, um, true);
}

}  // namespace strata::model_detail
