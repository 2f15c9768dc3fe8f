#include "strata/model/transformer.h"

#include <chrono>
#include <cmath>

#include "strata/comm/communicator.h"
#include "strata/model/rope.h"
#include "strata/model/transformer_impl.h"

namespace strata {

namespace model_detail {

TransformerImpl::TransformerImpl(const ModelSpec& spec, DType pt, DType gt, void* params,
                                 void* grads, int B, int T, const ChunkOptions& chunk,
                                 tp::Group* tp, bool count_only)
    : spec_(spec),
      cfg_(spec.config),
      tp_layout_(spec.tp),
      pt_(pt),
      gt_(gt),
      dev_(chunk.device),
      tp_(tp != nullptr ? tp : &own_tp_),
      B_(B),
      T_(T),
      seq_(T * std::max(chunk.context.size, 1)),
      N_(int64_t(B) * T),
      chunk_(chunk),
      count_only_(count_only),
      P_(params),
      D_(grads) {
  STRATA_CHECK(T <= cfg_.seq_len, "micro-batch sequence length ", T, " exceeds model.seq_len ",
               cfg_.seq_len);
  STRATA_CHECK(tp_->size() == tp_layout_.size && tp_->rank() == tp_layout_.rank,
               "the model spec was built for tensor-parallel rank ", tp_layout_.rank, " of ",
               tp_layout_.size, " but the group is rank ", tp_->rank(), " of ", tp_->size());
  STRATA_CHECK(chunk_.slots >= 1, "a model chunk needs at least one activation slot");
  sp_ = tp_->sequence_parallel();
  STRATA_CHECK(!sp_ || N_ % tp_->size() == 0, "sequence parallelism splits the ", N_,
               " token rows of a micro-batch over ", tp_->size(), " ranks: they must divide");
  Ns_ = sp_ ? N_ / tp_->size() : N_;
  gpt2_ = cfg_.gpt2_block();
  tied_ = cfg_.tied_embeddings;
  qk_norm_ = cfg_.qk_norm != "none";
  if (!gpt2_) rope_ = rope_table(cfg_);
  if (cfg_.rope_local_theta > 0) rope_local_ = ops::rope_default(cfg_.hd(), cfg_.rope_local_theta);
  if (cfg_.embed_scale) {  // as transformers: sqrt(hidden) in the parameters' dtype
    const float scale = std::sqrt(float(cfg_.hidden));
    uint16_t half = 0;
    if (pt_ == DType::F32) {
      embed_scale_ = scale;
    } else {
      convert(&half, pt_, &scale, DType::F32, 1);
      convert(&embed_scale_, DType::F32, &half, pt_, 1);
    }
  }
  C_ = cfg_.hidden;
  const int64_t hd = cfg_.hd();
  Vl_ = tp_layout_.vocab_rows, Fl_ = tp_layout_.ffn, FCHl_ = gpt2_ ? Fl_ : 2 * Fl_;
  QKVl_ = tp_layout_.qkv_rows, Hl_ = int64_t(tp_layout_.heads) * hd;
  att_shape_ = {B_, T_, tp_layout_.groups, tp_layout_.rep, int(hd)};
  att_shape_.scale = cfg_.attn_scale();
  att_shape_.softcap = cfg_.attn_logit_softcapping;
  core_att_shape_ = att_shape_;
  const ContextOptions& cx = chunk_.context;
  if (cx.on()) {
    STRATA_CHECK(dev_ == Device::CPU, "context parallelism runs on the CPU backend only");
    STRATA_CHECK(int64_t(T_) * cx.size == cfg_.seq_len, "context parallelism over ", cx.size,
                 " ranks: a chunk holds T/", cx.size, " = ", cfg_.seq_len / cx.size,
                 " rows of every sequence, not ", T_);
    pos_ = cx.positions(cfg_.seq_len);
    att_shape_.pos = pos_.data();
    for (int r = 0; r < cx.size && ring(); ++r) {
      ContextOptions other = cx;
      other.rank = r;
      ring_pos_.push_back(other.positions(cfg_.seq_len));
    }
    if (ulysses()) {
      STRATA_CHECK(tp_layout_.groups % cx.size == 0, "Ulysses over ", cx.size,
                   " ranks needs whole ", "key/value groups on each: this tensor rank has ",
                   tp_layout_.groups);
      core_att_shape_ = {B_, cfg_.seq_len, tp_layout_.groups / cx.size, tp_layout_.rep, int(hd)};
      core_att_shape_.scale = cfg_.attn_scale();
      core_att_shape_.softcap = cfg_.attn_logit_softcapping;
    }
  }
  if (cfg_.moe.experts > 0) {
    const MoeConfig& m = cfg_.moe;
    moe_ = true;
    STRATA_CHECK(dev_ == Device::CPU, "a mixture of experts runs on the CPU backend only");
    STRATA_CHECK(!cfg_.post_norm(), "a mixture of experts after pre norms only");
    E_ = m.experts, K_ = m.top_k;
    whole_experts_ = spec_.ep.whole;
    STRATA_CHECK(!whole_experts_ || sp_,
                 "whole experts beside tensor parallelism route each rank's "
                 "sequence-parallel rows: sequence parallelism is needed");
    Fel_ = whole_experts_ ? m.ffn_hidden : m.ffn_hidden / tp_->size();
    Fsl_ = m.shared_ffn_hidden / tp_->size();
    NK_ = N_ * K_;
    Nm_ = whole_experts_ ? Ns_ : N_, mr0_ = whole_experts_ ? tp_->rank() * Ns_ : 0, NKm_ = Nm_ * K_;
    ep_size_ = spec_.ep.size, El_ = int(spec_.ep.experts), e0_ = spec_.ep.first;
    ep_ = chunk_.experts;
    STRATA_CHECK(ep_ == nullptr || (ep_->size() == ep_size_ && ep_->rank() == spec_.ep.rank),
                 "the model spec was built for expert-parallel rank ", spec_.ep.rank, " of ",
                 ep_size_, " but the group is rank ", ep_->rank(), " of ", ep_->size());
    // Each token goes to at most min(k, El) of this rank's experts, from every rank of the group.
    R_ = ep_size_ > 1 ? int64_t(ep_size_) * Nm_ * std::min<int64_t>(K_, El_) : NKm_;
    ep_gather_ = spec_.ep.all_gather && ep_size_ > 1;
    if (ep_gather_) {
      ep_pos_host_.assign(size_t(ep_size_) * NKm_, 0);
      ep_gathered_counts_.assign(size_t(ep_size_) * E_, 0);
      ep_first_.assign(size_t(ep_size_) * El_, 0);
      ep_off_.assign(size_t(E_) + 1, 0);
    }
    if (ep_size_ > 1) {
      ep_idx_host_.assign(size_t(R_), 0);
      ep_counts32_.assign(size_t(ep_size_) * El_, 0);
      ep_v_counts_.assign(size_t(2 * ep_size_), 0);
    }
    route_ = {E_,        K_,           m.norm_topk_prob,       m.router == "sigmoid",
              m.n_group, m.topk_group, m.routed_scaling_factor};
    if (m.capacity_factor > 0) {  // over each sequence's rows, or all this chunk routes
      capacity_.group = m.capacity_scope == "sequence" ? T_ : Nm_;
      STRATA_CHECK(m.capacity_scope != "sequence" || !chunk_.context.on(),
                   "a capacity per sequence under context parallelism");
      STRATA_CHECK(Nm_ % capacity_.group == 0,
                   "a capacity per sequence with whole experts: ", "this rank's ", Nm_,
                   " rows hold no whole number of sequences of ", T_);
      capacity_.capacity =
          int64_t(std::ceil(double(capacity_.group) * K_ * double(m.capacity_factor) / E_));
      capacity_.by_probs = m.drop_policy == "probs";
    }
    counts32_.assign(size_t(E_), 0);
    coef_host_.assign(size_t(B_) * E_, 0.0f);
  }
  att_saved_ = ring() ? ops::AttentionSaved{DType::F32, int64_t(B_) * tp_layout_.heads * T_}
                      : ops::attention_saved(dev_, pt_, core_att_shape_);
  places();
  expert_tokens_.assign(size_t(l1_ - l0_) * E_, 0);
  const RecomputeOptions& rc = chunk_.recompute;
  STRATA_CHECK(rc.full.empty() || int(rc.full.size()) == cfg_.layers,
               "full recompute is chosen per model block: ", rc.full.size(), " flags for ",
               cfg_.layers, " blocks");
  ckpt_.assign(size_t(l1_ - l0_), 0);
  bool any = false;
  for (int l = l0_; l < l1_; ++l) any |= (ckpt_[size_t(l - l0_)] = rc.is_full(l) ? 1 : 0) != 0;
  shard_ = any && rc.partition && tp_->size() > 1 && !sp_;
  shard_elems_ = (Ns_ * C_ + tp_->size() - 1) / tp_->size();
  rc_seconds_.assign(size_t(l1_ - l0_), 0.0);
  layout();  // sizes the arenas
  if (count_only) return;
  acts_.allocate(MemCategory::Activations, dev_);
  work_.allocate(MemCategory::Workspace, dev_);
  if (rc.host) {
    ckpts_.allocate(MemCategory::HostCheckpoints, Device::CPU, true);
  } else {
    ckpts_.allocate(MemCategory::CheckpointedActivations, dev_);
  }
  layout();  // points into them
}

void TransformerImpl::places() {
  vocab_ = spec_.units_of(UnitKind::Vocab);
  output_ = spec_.units_of(UnitKind::Output);
  attn_ = spec_.units_of(UnitKind::Attention);
  mlp_ = spec_.units_of(UnitKind::Mlp);
  experts_.assign(size_t(cfg_.layers), -1);
  for (int u : spec_.units_of(UnitKind::Experts))
    experts_[size_t(spec_.units[size_t(u)].layer)] = u;
  const std::vector<int> pos = spec_.units_of(UnitKind::Position);
  position_ = pos.empty() ? -1 : pos.front();
  final_ = spec_.units_of(UnitKind::FinalNorm).front();
  const int L = cfg_.layers, U = int(spec_.units.size());
  STRATA_CHECK(int(attn_.size()) == L && int(mlp_.size()) == L && !vocab_.empty() &&
                   (tied_ || output_.size() == vocab_.size()),
               "the model spec's units do not match the model config");
  // The chunk: whole embedding, whole blocks, whole head.
  const int u0 = chunk_.unit_begin, u1 = chunk_.unit_end < 0 ? U : chunk_.unit_end;
  STRATA_CHECK(0 <= u0 && u0 < u1 && u1 <= U, "chunk units [", u0, ", ", u1, ") outside the ", U,
               " units of the model");
  const int first_block = L > 0 ? attn_.front() : final_;
  STRATA_CHECK(u0 == 0 || u0 >= first_block, "a chunk cannot start inside the embedding");
  STRATA_CHECK(u1 >= first_block, "a chunk cannot end inside the embedding");
  STRATA_CHECK(u0 <= final_, "a chunk cannot start inside the head");
  STRATA_CHECK(u1 == U || u1 <= final_, "a chunk cannot end inside the head");
  has_embed_ = u0 == 0;
  has_head_ = u1 == U;
  l0_ = L, l1_ = 0;
  for (int l = 0; l < L; ++l) {
    const bool a = attn_[size_t(l)] >= u0 && attn_[size_t(l)] < u1;
    const bool m = mlp_[size_t(l)] >= u0 && mlp_[size_t(l)] < u1;
    const int ue = experts_[size_t(l)];
    STRATA_CHECK(a == m && (ue < 0 || a == (ue >= u0 && ue < u1)), "a chunk boundary splits block ",
                 l, "; chunks hold whole blocks");
    if (a) l0_ = std::min(l0_, l), l1_ = std::max(l1_, l + 1);
  }
  if (l0_ > l1_) l0_ = l1_ = has_embed_ ? 0 : L;
  STRATA_CHECK(has_embed_ || has_head_ || l1_ > l0_, "a chunk holds no units");

  places_.assign(size_t(L), BlockPlaces{});
  partials_.assign(size_t(U), {});
  partial_params_.assign(spec_.params.size(), 0);
  const bool multi = tp_->size() > 1;
  // Sizing alone (count_only) needs the chunk's own units; a model that runs places them all.
  for (int u = count_only_ ? u0 : 0; u < (count_only_ ? u1 : U); ++u) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    for (int i : unit.params) {
      const ParamSpec& p = spec_.params[size_t(i)];
      const int64_t off = std::max<int64_t>(p.offset - unit.offset, 0);
      if (unit.kind == UnitKind::Attention || unit.kind == UnitKind::Mlp ||
          unit.kind == UnitKind::Experts) {
        places_[size_t(p.layer)][size_t(p.role)] = {u, off, i};
      } else if (p.role == ParamRole::FinalNormW) {
        o_lnf_w_ = off;
      } else if (p.role == ParamRole::FinalNormB) {
        o_lnf_b_ = off;
      }
      if (!multi) continue;
      // Replicated parameters are partial under sequence parallelism (each rank sees its rows),
      // and the q/k norms' gains always (each rank sees its heads); replicated key/value rows
      // always (each rank sees its query heads).
      const bool head_gain = p.role == ParamRole::QNormW || p.role == ParamRole::KNormW;
      if (p.split_axis < 0 && (sp_ || head_gain) && p.role != ParamRole::TokenEmbedding) {
        partials_[size_t(u)].push_back({off, p.numel(), tp_->comm()});
        partial_params_[size_t(i)] = 1;
      }
      if (p.split_axis == 0 && p.ranges.size() == 2 && p.ranges[1].replicas > 1) {
        const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
        STRATA_CHECK(tp_->kv() != nullptr || ops::dry_run(),
                     "replicated key/value heads need the kv group");
        partials_[size_t(u)].push_back(
            {off + p.ranges[0].count * cols, p.ranges[1].count * cols, tp_->kv()});
        partial_params_[size_t(i)] = 1;
      }
    }
  }
}

void TransformerImpl::layout() {
  acts_.rewind();
  work_.rewind();
  ckpts_.rewind();
  const size_t ps = dtype_size(pt_), f4 = sizeof(float);
  const int64_t N = N_, Ns = Ns_, C = C_;
  auto act = [&](int64_t n, size_t e) { return acts_.take(n, e); };
  auto wk = [&](int64_t n, size_t e) { return work_.take(n, e); };
  const int nb = l1_ - l0_;
  const int64_t att_n = att_saved_.numel;
  const size_t att_e = dtype_size(att_saved_.dtype);
  const bool selective = chunk_.recompute.selective;
  // The MLP's widths: the dense layers', or the shared expert's where wider.
  const int64_t Fmax = std::max(Fl_, Fsl_), FCHmax = std::max(FCHl_, 2 * Fsl_);
  bool any = false;
  for (char c : ckpt_) any |= c != 0;
  // What a block keeps per slot besides QKV, probabilities, pre-activation and output.
  auto carve = [&](BlockActs& a) {
    a.ln1 = act(Ns * C, ps);
    a.ln1_mean = static_cast<float*>(act(Ns, f4));
    a.ln1_rstd = static_cast<float*>(act(Ns, f4));
    a.atty = act(N * Hl_, ps);
    a.res2 = act(Ns * C, ps);
    a.ln2 = act(Ns * C, ps);
    a.ln2_mean = static_cast<float*>(act(Ns, f4));
    a.ln2_rstd = static_cast<float*>(act(Ns, f4));
    a.fch_act = act(N * Fmax, ps);
    if (qk_norm_) {
      a.qkv_in = act(N * QKVl_, ps);
      a.qk_rstd =
          static_cast<float*>(act(N * std::max(2, tp_layout_.groups * (tp_layout_.rep + 1)), f4));
    }
    if (cfg_.post_norm()) {
      a.attn_out = act(Ns * C, ps);
      a.attn_out_rstd = static_cast<float*>(act(Ns, f4));
      a.mlp_out = act(Ns * C, ps);
      a.mlp_out_rstd = static_cast<float*>(act(Ns, f4));
    }
  };
  // A MoE block's own (BlockActs), after what carve gives every block.
  auto carve_moe = [&](BlockActs& a) {
    const int64_t E = E_, k = K_;
    a.router_probs = static_cast<float*>(act(N * E, f4));
    a.router_lse = static_cast<float*>(act(N, f4));
    a.moe_top = static_cast<int32_t*>(act(N * k, 4));
    a.moe_gates = static_cast<float*>(act(N * k, f4));
    a.moe_counts = static_cast<int32_t*>(act(E, 4));
    a.moe_pos = static_cast<int32_t*>(act(N * k, 4));
    a.moe_rows = static_cast<int32_t*>(act(NKm_, 4));
    a.xp = act(R_ * C, ps);
    a.efch = act(R_ * 2 * Fel_, ps);
    a.eact = act(R_ * Fel_, ps);
    a.ey = act((ep_gather_ ? R_ : NKm_) * C, ps);
    if (ep_gather_) {
      a.ag_pos = static_cast<int32_t*>(act(ep_size_ * NKm_, 4));
      a.ag_gates = static_cast<float*>(act(ep_size_ * NKm_, f4));
    }
    if (Fsl_ > 0) a.sout = act(N * C, ps);
    if (cfg_.moe.shared_gate) a.sgate = static_cast<float*>(act(N, f4));
  };
  auto moe_block = [&](int b) { return moe_ && cfg_.moe_layer(l0_ + b); };
  // The recompute set: one block's activations, shared by every fully recomputed block (and the
  // attention probabilities by every block under selective recompute).
  rc_ = BlockActs{};
  if (any) carve(rc_), rc_.qkv = act(N * QKVl_, ps), rc_.fch = act(N * FCHmax, ps);
  for (int b = 0; b < nb; ++b) {
    if (ckpt_[size_t(b)] && moe_block(b)) {
      carve_moe(rc_);
      break;
    }
  }
  if (any || selective) rc_.att = act(att_n, att_e);
  if (shard_) {
    for (void*& w : whole_) w = act(shard_elems_ * tp_->size(), ps);
  }
  // Where a block's input lives: kept whole in the checkpoint pool (a fully recomputed block),
  // sharded there with its whole in one of the two buffers in turn, or among the activations.
  auto input_at = [&](Slot& s, int b) -> void* {
    if (b >= nb || !ckpt_[size_t(b)]) return act(Ns * C, ps);
    if (!shard_) return ckpts_.take(Ns * C, ps);
    s.shard[size_t(b)] = ckpts_.take(shard_elems_, ps);
    return whole_[size_t(b + 1) % 2];
  };
  input_slots_.resize(size_t(chunk_.input_slots > 0 ? chunk_.input_slots : chunk_.slots));
  for (InputSlot& in : input_slots_) {
    in.blocks.resize(size_t(nb));
    for (size_t b = 0; b < size_t(nb); ++b) {
      if (ckpt_[b]) {
        in.blocks[b] = {};
        continue;
      }
      in.blocks[b] = {act(N * QKVl_, ps), selective ? rc_.att : act(att_n, att_e),
                      act(N * FCHmax, ps)};
    }
  }
  slots_.resize(size_t(chunk_.slots));
  for (Slot& s : slots_) {
    s.tokens = static_cast<int32_t*>(act(N, 4));
    s.targets = static_cast<int32_t*>(act(N, 4));
    s.doc_begin = static_cast<int32_t*>(act(int64_t(B_) * seq_, 4));
    s.shard.assign(size_t(nb), nullptr);
    s.encoded = input_at(s, 0);
    s.blocks.resize(size_t(nb));
    for (size_t b = 0; b < size_t(nb); ++b) {
      BlockActs& a = s.blocks[b];
      if (ckpt_[b]) {
        a = rc_;
      } else {
        carve(a);
        if (moe_block(int(b))) carve_moe(a);
      }
      a.res3 = input_at(s, int(b) + 1);
    }
    if (moe_) {
      s.expert_counts.assign(size_t(nb), std::vector<int64_t>(size_t(E_), 0));
      s.ep_counts.assign(size_t(nb), std::vector<int64_t>(size_t(ep_size_) * El_, 0));
      s.ep_rows.assign(size_t(nb), std::vector<int64_t>(size_t(El_), 0));
      s.moe_stats.assign(size_t(nb), std::vector<float>(size_t(B_) * 2 * E_, 0.0f));
      s.moe_lse.assign(size_t(nb), std::vector<float>(cfg_.moe.z_loss_coef > 0 ? size_t(N) : 0));
    }
    if (has_head_) {
      s.lnf = act(Ns * C, ps);
      s.lnf_mean = static_cast<float*>(act(Ns, f4));
      s.lnf_rstd = static_cast<float*>(act(Ns, f4));
      s.logits = act(N * Vl_, ps);
      s.losses = static_cast<float*>(act(N, f4));
      s.ce = static_cast<float*>(act(3 * N, f4));
    }
    if (chunk_.defer_weight) {
      s.stash.resize(size_t(nb));
      for (BlockStash& b : s.stash) {
        b = {act(N * C, ps),
             act(N * QKVl_, ps),
             act(Ns * C, ps),
             act(N * C, ps),
             act(N * FCHmax, ps),
             act(Ns * C, ps),
             nullptr,
             nullptr,
             nullptr,
             nullptr,
             nullptr,
             nullptr,
             nullptr};
        if (moe_block(int(&b - s.stash.data()))) {
          b.dey = act(R_ * C, ps);
          b.defch = act(R_ * 2 * Fel_, ps);
          b.dlogits = static_cast<float*>(act(N * E_, f4));
          if (cfg_.moe.shared_gate) b.dsgate = static_cast<float*>(act(N, f4));
        }
        if (qk_norm_) b.dqk_gains = act(qk_gains(), dtype_size(gt_));
        if (cfg_.post_norm()) b.dpost_attn = act(Ns * C, ps), b.dpost_mlp = act(Ns * C, ps);
      }
      if (has_head_) s.dlnf = act(Ns * C, ps);
      if (has_embed_) s.denc = act(Ns * C, ps);
    }
  }
  dres_ = wk(Ns * C, ps);
  dc_ = wk(Ns * C, ps);
  d_wide_out_ = wk(N * std::max(QKVl_, FCHmax), ps);
  d_proj_in_ = wk(N * std::max(Fmax, Hl_), ps);
  if (moe_) {
    moe_part_ = wk(N * C, ps);
    dxp_ = wk(R_ * C, ps);
    deact_ = wk(R_ * Fel_, ps);
    dey_ = wk(R_ * C, ps);
    defch_ = wk(R_ * 2 * Fel_, ps);
    if (ep_gather_) {
      ep_all_ = wk(int64_t(ep_size_) * Nm_ * C, ps);
      ep_dgates_ = static_cast<float*>(wk(int64_t(ep_size_) * NKm_, f4));
      ep_idx_ = static_cast<int32_t*>(wk(R_, 4));
    } else if (ep_size_ > 1) {
      ep_send_ = wk(NKm_ * C, ps);
      ep_recv_ = wk(R_ * C, ps);
      ep_out_ = wk(R_ * C, ps);
      ep_idx_ = static_cast<int32_t*>(wk(R_, 4));
    }
    if (Fsl_ > 0) dshared_ = wk(N * C, ps);
    dgw_ = static_cast<float*>(wk(NK_ + N, f4));
    dlogits_ = static_cast<float*>(wk(N * E_, f4));
    moe_coef_ = static_cast<float*>(wk(int64_t(B_) * E_, f4));
    moe_stats_ = static_cast<float*>(wk(int64_t(B_) * 2 * E_, f4));
    if (route_.sigmoid) moe_bias_ = static_cast<float*>(wk(E_, f4));
  }
  if (qk_norm_) d_qk_ = wk(N * QKVl_, ps);
  if (cfg_.qk_norm == "whole") qk_sums_ = static_cast<float*>(wk(2 * N, f4));
  if (cfg_.post_norm()) d_post_ = wk(Ns * C, ps);
  if (sp_) gath_ = wk(N * C, ps);  // a norm's output, gathered
  if (sp_) part_ = wk(N * C, ps);  // a row-parallel layer's partial output, all rows
  if (has_head_) dlnf32_ = static_cast<float*>(wk(N * C, f4));
  norm_scratch_ = static_cast<float*>(wk(int64_t(ops::norm_backward_scratch_floats(N, C)), f4));
  att_scratch_ = static_cast<float*>(
      wk(ring() ? 0 : int64_t(ops::attention_backward_scratch_floats(dev_, pt_, core_att_shape_)),
         f4));
  if (ulysses()) ulysses_send_ = wk(N * QKVl_, ps), ulysses_recv_ = wk(N * QKVl_, ps);
  if (ring()) {
    const int64_t kv = N * tp_layout_.groups * 2 * core_att_shape_.hd;
    for (int i = 0; i < 2; ++i) {
      kv_[i] = wk(kv, ps);
      dkv_[i] = static_cast<float*>(wk(kv, f4));
    }
    o32_ = static_cast<float*>(wk(N * Hl_, f4));
    dq32_ = static_cast<float*>(wk(N * Hl_, f4));
    delta_ = static_cast<float*>(wk(int64_t(B_) * tp_layout_.heads * T_, f4));
  }
  if (has_head_ && tp_->size() > 1) ce_all_ = static_cast<float*>(wk(N * tp_->size(), f4));
  if (has_head_) {
    // Each unit's dlogits feed two products: of N rows (dlnf) and of the unit's rows (dW).
    int64_t rows = 0, fewest = N;
    for (int u : output_units()) {
      const int64_t r = spec_.units[size_t(u)].row_end - spec_.units[size_t(u)].row_begin;
      rows = std::max(rows, r), fewest = std::min(fewest, r);
    }
    widen_dlogits_ = ops::gemm_widens(dev_, pt_, fewest);
    if (widen_dlogits_) dlogits32_ = static_cast<float*>(wk(N * rows, f4));
  }
  // Partial gradients anywhere in the model (sizing alone sees only its chunk's units): under
  // sequence parallelism the norms, with replicated key/value heads the QKV rows.
  int64_t largest = 0;
  for (const std::vector<Partial>& p : partials_) {
    if (!p.empty()) largest = 1;
  }
  if (count_only_ && tp_->size() > 1 && (sp_ || spec_.tp.kv_replicated || qk_norm_)) largest = 1;
  if (largest > 0) {
    for (const UnitSpec& u : spec_.units) largest = std::max(largest, u.numel);
    scratch_ = wk(largest, dtype_size(gt_));
  }
  // The row-parallel output gradients are dres itself but under sequence parallelism, where they
  // are gathered into part_.
  fused_ = {part_,   d_wide_out_, dc_,     part_,   d_wide_out_, dc_,    nullptr,
            nullptr, nullptr,     nullptr, nullptr, nullptr,     nullptr};
}

Slot& TransformerImpl::slot_of(int mb) {
  for (Slot& s : slots_) {
    if (s.mb == mb) return s;
  }
  STRATA_FAIL("micro-batch ", mb, " has no activations in this chunk (no forward ran for it, or ",
              "its backward already freed them)");
}

void* TransformerImpl::acquire(UnitHook* hook, int unit) {
  if (hook) {
    if (const void* p = hook->acquire_params(unit)) return const_cast<void*>(p);
  }
  STRATA_CHECK(P_ != nullptr, "the model has no parameter buffer and its hook placed none for ",
               spec_.units[size_t(unit)].name);
  return at(P_, pt_, spec_.units[size_t(unit)].offset);
}

void* TransformerImpl::grads_of(UnitHook* hook, int unit) {
  if (hook) {
    if (void* g = hook->grads_for(unit)) return g;
  }
  STRATA_CHECK(D_ != nullptr, "the model has no gradient buffer and its hook placed none for ",
               spec_.units[size_t(unit)].name);
  return at(D_, gt_, spec_.units[size_t(unit)].offset);
}

Tensor TransformerImpl::param(int l, ParamRole r, void* base, DType t) const {
  const ParamPlace& pl = places_[size_t(l)][size_t(r)];
  if (pl.unit < 0 || base == nullptr) return Tensor();
  const ParamSpec& p = spec_.params[size_t(pl.param)];
  void* ptr = at(base, t, pl.offset);
  return p.shape.size() == 1 ? vec(ptr, t, p.shape[0]) : mat(ptr, t, p.shape[0], p.shape[1]);
}

Tensor TransformerImpl::grad(int l, ParamRole r, void* unit_grads) const {
  const ParamPlace& pl = places_[size_t(l)][size_t(r)];
  if (pl.unit < 0) return Tensor();
  const bool partial = partial_params_[size_t(pl.param)] != 0;
  return param(l, r, partial ? scratch_ : unit_grads, gt_);
}

// Partial parameters accumulate in the scratch: zero it for the unit's params.
void TransformerImpl::begin_partials(int unit) {
  if (partials_[size_t(unit)].empty()) return;
  ops::fill_zero(vec(scratch_, gt_, spec_.units[size_t(unit)].numel));
}

// Sums the unit's partial ranges over their groups and adds every scratch parameter into the
// unit's gradients. A plain all-reduce, no mapping's half: it sums parameter gradients of a
// replicated parameter (as Megatron's finalize_model_grads does for sequence-parallel norms), and
// no activation crosses a region.
void TransformerImpl::settle_partials(int unit, void* unit_grads) {
  if (partials_[size_t(unit)].empty()) return;
  for (const Partial& p : partials_[size_t(unit)]) {
    tp_->all_reduce(vec(at(scratch_, gt_, p.offset), gt_, p.numel), p.over);
  }
  const UnitSpec& u = spec_.units[size_t(unit)];
  for (int i : u.params) {
    if (!partial_params_[size_t(i)]) continue;
    const ParamSpec& p = spec_.params[size_t(i)];
    const int64_t off = p.offset - u.offset;
    ops::add_inplace(vec(at(unit_grads, gt_, off), gt_, p.numel()),
                     vec(at(scratch_, gt_, off), gt_, p.numel()));
  }
}

Tensor TransformerImpl::column_input(void* ln) {
  if (!sp_) return copy_to::forward(*tp_, full(ln));
  return gather_from_sp::forward(*tp_, full(gath_), hid(ln));
}

void TransformerImpl::take_input_slot(Slot& s) {
  for (size_t k = 0; k < input_slots_.size(); ++k) {
    InputSlot& in = input_slots_[k];
    if (in.busy) continue;
    in.busy = true;
    s.input = int(k);
    for (size_t b = 0; b < s.blocks.size(); ++b) {
      if (ckpt_[b]) continue;  // the recompute set's
      s.blocks[b].qkv = in.blocks[b][0], s.blocks[b].att = in.blocks[b][1];
      s.blocks[b].fch = in.blocks[b][2];
    }
    return;
  }
  STRATA_FAIL("all ", input_slots_.size(), " input-gradient activation slots of the chunk are in ",
              "use: run an input-gradient backward before the next forward, or give the chunk "
              "more input_slots");
}

void TransformerImpl::free_input_slot(Slot& s) {
  if (s.input < 0) return;
  input_slots_[size_t(s.input)].busy = false;
  s.input = -1;
  for (size_t b = 0; b < s.blocks.size(); ++b) {
    if (!ckpt_[b]) s.blocks[b].qkv = s.blocks[b].att = s.blocks[b].fch = nullptr;
  }
}

// A partitioned checkpoint: this rank's k elements of the next block's input, which the previous
// block (or the embedding, l = l0 - 1) has just written whole.
void TransformerImpl::keep_shard(Slot& s, int l) {
  const size_t b = size_t(l + 1 - l0_);
  if (b >= s.shard.size() || s.shard[b] == nullptr) return;
  const int64_t total = Ns_ * C_, from = tp_->rank() * shard_elems_;
  const int64_t n = std::max<int64_t>(0, std::min(shard_elems_, total - from));
  const void* whole = l < l0_ ? s.encoded : s.blocks[size_t(l - l0_)].res3;
  if (n > 0) {
    ops::copy(vec(s.shard[b], pt_, n), vec(at(const_cast<void*>(whole), pt_, from), pt_, n));
  }
}

void TransformerImpl::sync_boundary() const {
  if (chunk_.recompute.synchronize) ops::synchronize(dev_);
}

// Block l's forward again, from its checkpoint (all-gathered when partitioned), through the
// MLP's activation: what its backward reads, bit for bit what the first forward computed. The
// gather is a plain one, no mapping's half (Megatron's gather_split_1d_tensor): it restores a
// replicated tensor that keep_shard split flat, and has no backward.
const void* TransformerImpl::recompute(Slot& s, int l, UnitHook* hook) {
  const auto t0 = std::chrono::steady_clock::now();
  sync_boundary();
  const size_t b = size_t(l - l0_);
  const void* x = block_input(s, l);
  if (s.shard[b] != nullptr) {
    void* whole = whole_[0];
    tp_->all_gather(vec(whole, pt_, shard_elems_ * tp_->size()),
                    vec(s.shard[b], pt_, shard_elems_));
    x = whole;
  }
  attn_forward(s, l, x, hook);
  mlp_forward(s, l, hook, false);
  sync_boundary();
  rc_seconds_[b] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return x;
}

void TransformerImpl::recompute_attention(const BlockActs& a, int l) {
  const auto t0 = std::chrono::steady_clock::now();
  sync_boundary();
  attention_core_forward(a, l, nullptr);
  sync_boundary();
  rc_seconds_[size_t(l - l0_)] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double TransformerImpl::take_recompute_seconds(std::vector<double>* per_block) {
  double sum = 0.0;
  if (per_block) per_block->resize(size_t(cfg_.layers), 0.0);
  for (size_t b = 0; b < rc_seconds_.size(); ++b) {
    sum += rc_seconds_[b];
    if (per_block) (*per_block)[size_t(l0_) + b] += rc_seconds_[b];
    rc_seconds_[b] = 0.0;
  }
  return sum;
}

void TransformerImpl::select_documents(const Slot& s) {
  for (ops::AttentionShape* shape : {&att_shape_, &core_att_shape_}) {
    shape->doc_begin = documents(s);
    shape->seq = seq_;
  }
}

namespace {

// doc_begin (B, seq) on the host: every position's document starts at or before it, and the
// starts do not decrease along a sequence.
void check_documents(const int32_t* doc_begin, int B, int seq) {
  for (int b = 0; b < B; ++b) {
    const int32_t* d = doc_begin + int64_t(b) * seq;  // (seq)
    for (int p = 0; p < seq; ++p) {
      STRATA_CHECK(d[p] >= 0 && d[p] <= p && (p == 0 || d[p] >= d[p - 1]), "sequence ", b,
                   "'s document at position ", p, " starts at ", d[p],
                   ": doc_begin holds, for every position of a sequence, where its document "
                   "starts (at or before it, never before the previous position's)");
    }
  }
}

}  // namespace

double TransformerImpl::forward(int mb, const int32_t* tokens, Tensor hidden,
                                const int32_t* targets, float dloss, bool train, UnitHook* hook,
                                const int32_t* doc_begin) {
  if (doc_begin != nullptr) check_documents(doc_begin, B_, seq_);
  Slot* free = nullptr;
  for (Slot& s : slots_) {
    if (s.eval) free_input_slot(s), s.mb = -1, s.eval = false;
    STRATA_CHECK(s.mb != mb, "micro-batch ", mb, " is already in flight in this chunk");
    if (s.mb < 0 && free == nullptr) free = &s;
  }
  STRATA_CHECK(free != nullptr, "all ", slots_.size(), " activation slots of the chunk are in ",
               "use: run a backward before the next forward, or give the chunk more slots");
  Slot& s = *free;
  take_input_slot(s);
  if (has_embed_) {
    STRATA_CHECK(tokens != nullptr, "the first chunk needs token ids");
    ops::copy_from_host(ids(s.tokens), tokens);
  } else {
    STRATA_CHECK(hidden.data != nullptr && hidden.numel() == Ns_ * C_ && hidden.dtype == pt_,
                 "chunk input must be (", Ns_, ", ", C_, ") ", dtype_name(pt_), ", got ",
                 hidden.shape_str());
    ops::copy(hid(s.encoded), hidden);
  }
  if (has_head_) {
    STRATA_CHECK(targets != nullptr, "the last chunk needs targets");
    ops::copy_from_host(ids(s.targets), targets);
  }
  s.documents = doc_begin != nullptr;
  if (s.documents) {
    ops::copy_from_host(Tensor(s.doc_begin, DType::I32, {int64_t(B_) * seq_}, dev_), doc_begin);
  }
  select_documents(s);
  const Tensor tk = ids(s.tokens), tg = ids(s.targets);
  const int64_t counted =
      ops::check_tokens(has_embed_ ? tk : Tensor(), has_head_ ? tg : Tensor(), cfg_.vocab);
  s.counted = has_head_ ? counted : 0;
  s.mb = mb;
  s.eval = !train;
  s.input_done = false;
  s.aux_scale = aux_scale_;
  if (hook) hook->begin_pass(UnitHook::Pass::Forward);
  if (has_embed_) embed_forward(s, hook);
  keep_shard(s, l0_ - 1);
  for (int l = l0_; l < l1_; ++l) {
    const bool full = full_recompute(l);
    if (full) sync_boundary();
    attn_forward(s, l, block_input(s, l), hook);
    mlp_forward(s, l, hook);
    if (full) sync_boundary();
    keep_shard(s, l);
  }
  if (moe_ && train) {
    aux_sum_ += moe_aux_loss(s);
    for (int l = l0_; l < l1_; ++l) {
      if (!cfg_.moe_layer(l)) continue;
      const std::vector<int64_t>& n = s.expert_counts[size_t(l - l0_)];
      for (int e = 0; e < E_; ++e) expert_tokens_[size_t((l - l0_) * E_ + e)] += n[size_t(e)];
    }
  }
  if (!has_head_) return 0.0;
  return head_forward(s, block_input(s, l1_), dloss, train, hook);
}

Tensor TransformerImpl::output(int mb) const {
  const Slot& s = slot_of(mb);
  STRATA_CHECK(!has_head_, "the last chunk's output is its loss");
  return hid(const_cast<void*>(block_input(s, l1_)));
}

Tensor TransformerImpl::backward_input(int mb, Tensor dout, UnitHook* hook) {
  Slot& s = slot_of(mb);
  STRATA_CHECK(!s.input_done && !s.eval, "micro-batch ", mb,
               " has no training forward waiting for its input-gradient backward");
  select_documents(s);
  if (hook) hook->begin_pass(UnitHook::Pass::Backward);
  if (has_head_) {
    head_backward(s, hook);
  } else {
    STRATA_CHECK(dout.data != nullptr && dout.numel() == Ns_ * C_ && dout.dtype == pt_,
                 "the output gradient must be (", Ns_, ", ", C_, ") ", dtype_name(pt_), ", got ",
                 dout.shape_str());
    ops::copy(hid(dres_), dout);
  }
  for (int l = l1_ - 1; l >= l0_; --l) {
    const void* x = full_recompute(l) ? recompute(s, l, hook) : block_input(s, l);
    mlp_backward(s, l, hook);
    attn_backward(s, l, x, hook);
  }
  if (has_embed_) embed_backward(s, hook);
  s.input_done = true;
  free_input_slot(s);
  if (!chunk_.defer_weight) s.mb = -1;
  return has_embed_ ? Tensor() : hid(dres_);
}

void TransformerImpl::backward_weight(int mb, UnitHook* hook) {
  STRATA_CHECK(chunk_.defer_weight, "this chunk computes weight gradients in backward_input");
  Slot& s = slot_of(mb);
  STRATA_CHECK(s.input_done, "micro-batch ", mb, "'s weight-gradient backward before its ",
               "input-gradient backward");
  select_documents(s);
  if (has_head_) head_weight(s, hook);
  for (int l = l1_ - 1; l >= l0_; --l) {
    // A fully recomputed block recomputes again: the input-gradient backward's recompute set
    // has served other blocks since.
    const void* x = full_recompute(l) ? recompute(s, l, hook) : block_input(s, l);
    mlp_weight(s, l, hook);
    attn_weight(s, l, x, hook);
  }
  if (has_embed_) embed_weight(s, hid(s.denc), hook);
  s.mb = -1;
}

}  // namespace model_detail

using model_detail::TransformerImpl;

std::vector<int> param_trace(const ModelSpec& spec, UnitHook::Pass pass,
                             const RecomputeOptions& recompute) {
  // The model's own passes, run dry (no kernel or collective touches memory) over one token row,
  // with a hook that records what they acquire: the order is the code's, not a copy of it.
  struct Recorder final : UnitHook {
    Pass want, now = Pass::Forward;
    std::vector<int> seen;
    alignas(64) char nowhere[64] = {};  // non-null placements; a dry run reads none of them
    explicit Recorder(Pass p) : want(p) {}
    void begin_pass(Pass p) override { now = p; }
    const void* acquire_params(int unit) override {
      if (now == want) seen.push_back(unit);
      return nowhere;
    }
    void* grads_for(int) override { return nowhere; }
  } rec(pass);
  const ops::DryRun dry;
  // Whole experts route sequence-parallel rows: a one-token sequence for each tensor rank.
  tp::Group shape(spec.tp.size, spec.tp.rank, spec.ep.whole);
  ChunkOptions chunk;
  chunk.recompute = recompute;
  chunk.recompute.partition = false, chunk.recompute.host = false;
  const std::unique_ptr<Transformer> m =
      make_transformer(spec, DType::F32, DType::F32, nullptr, nullptr,
                       spec.ep.whole ? spec.tp.size : 1, 1, chunk, &shape);
  const std::vector<int32_t> token(size_t(spec.tp.size), 0);
  m->forward(0, token.data(), Tensor(), token.data(), 1.0f, true, &rec);
  if (pass == UnitHook::Pass::Backward) m->backward(&rec);
  return rec.seen;
}

ArenaBytes transformer_arena_bytes(const ModelSpec& spec, DType param_dtype, DType grad_dtype,
                                   int B, int T, const ChunkOptions& chunk,
                                   bool sequence_parallel) {
  const ops::DryRun dry;  // no communicators: the kv group is not needed to size the arenas
  tp::Group shape(spec.tp.size, spec.tp.rank, sequence_parallel);
  const TransformerImpl m(spec, param_dtype, grad_dtype, nullptr, nullptr, B, T, chunk, &shape,
                          true);
  return m.arena_bytes();
}

std::unique_ptr<Transformer> make_transformer(const ModelSpec& spec, DType param_dtype,
                                              DType grad_dtype, void* params, void* grads, int B,
                                              int T, const ChunkOptions& chunk, tp::Group* tp) {
  const bool ok = grad_dtype == DType::F32 || grad_dtype == param_dtype;
  STRATA_INPUT_CHECK(ok, "parameters in ", dtype_name(param_dtype),
                     " with gradients accumulated in ", dtype_name(grad_dtype),
                     " is not supported; set data_types.grad_accum_dtype to fp32 or to the "
                     "parameter dtype");
  return std::make_unique<TransformerImpl>(spec, param_dtype, grad_dtype, params, grads, B, T,
                                           chunk, tp);
}

}  // namespace strata
