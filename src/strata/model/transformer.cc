#include "strata/model/transformer.h"

#include <algorithm>
#include <array>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/ops.h"

namespace strata {

namespace {

// Carves views out of one allocation, each 64-byte aligned. Laid out twice: once to size the
// allocation, once to point into it.
class Arena {
 public:
  void* take(int64_t n, size_t elem) {
    char* at = static_cast<char*>(buffer_.data()) + used_;
    used_ += (size_t(n) * elem + 63) / 64 * 64;
    return buffer_.data() != nullptr ? at : nullptr;
  }
  void allocate(MemCategory c, Device d) { buffer_ = Buffer(c, used_, d); }
  void rewind() { used_ = 0; }

 private:
  Buffer buffer_;
  size_t used_ = 0;
};

void* at(void* base, DType t, int64_t elems) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + size_t(elems) * dtype_size(t);
}
// Where each of one block's parameters sits: the unit holding it (its attention or MLP sublayer)
// and its element offset from that unit's first element; unit -1 where the family has none.
struct ParamPlace {
  int unit = -1;
  int64_t offset = 0;
  int param = -1;  // index into ModelSpec::params
};
using BlockPlaces = std::array<ParamPlace, kNumParamRoles>;

// Saved activations of one block for one micro-batch. Rows: N = B·T inside the tensor-parallel
// regions, Ns (= N, or N/tp under sequence parallelism) outside them.
struct BlockActs {
  void* ln1;        // (Ns, C)
  float* ln1_mean;  // (Ns)
  float* ln1_rstd;  // (Ns)
  void* qkv;        // (N, QKVl)  after RoPE for llama
  void* att;        // (B, heads_l, T, T)
  void* atty;       // (N, Hl)
  void* res2;       // (Ns, C)  residual after attention
  void* ln2;        // (Ns, C)
  float* ln2_mean;
  float* ln2_rstd;
  void* fch;      // (N, FCHl) gpt2 pre-GELU; llama gate|up interleaved
  void* fch_act;  // (N, Fl)
  void* res3;     // (Ns, C)  block output
};

// The output gradients a deferred weight-gradient backward needs, per block.
struct BlockStash {
  void* dproj;  // (N, C) gradient of the attention projection's output (all rows)
  void* dqkv;   // (N, QKVl)
  void* dln1;   // (Ns, C) gradient of the first norm's output
  void* dfc2;   // (N, C)
  void* dfch;   // (N, FCHl)
  void* dln2;   // (Ns, C)
};

struct Slot {
  int mb = -1;              // micro-batch held, -1: free
  bool eval = false;        // held by an evaluation forward: free for the next forward
  bool input_done = false;  // backward_input ran (defer_weight)
  int32_t *tokens = nullptr, *targets = nullptr;  // (N)
  void* encoded = nullptr;                        // (Ns, C) the chunk's input hidden states
  std::vector<BlockActs> blocks;                  // the chunk's blocks
  void* lnf = nullptr;                            // (Ns, C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  void* logits = nullptr;   // (N, Vl)
  float* losses = nullptr;  // (N)
  int64_t counted = 0;
  // defer_weight only
  std::vector<BlockStash> stash;
  void* dlnf = nullptr;  // (Ns, C) gradient of the final norm's output
  void* denc = nullptr;  // (Ns, C) gradient of the embedding's output
};

class TransformerImpl final : public Transformer {
 public:
  TransformerImpl(const ModelSpec& spec, DType pt, DType gt, void* params, void* grads, int B,
                  int T, const ChunkOptions& chunk, tp::Group* tp);

  double forward(int mb, const int32_t* tokens, Tensor hidden, const int32_t* targets, float dloss,
                 bool train, UnitHook* hook) override;
  Tensor output(int mb) const override;
  Tensor backward_input(int mb, Tensor dout, UnitHook* hook) override;
  void backward_weight(int mb, UnitHook* hook) override;
  Tensor logits(int mb) const override { return mat(slot_of(mb).logits, pt_, N_, Vl_); }
  int64_t counted_tokens(int mb) const override { return slot_of(mb).counted; }
  double take_tp_seconds() override {
    const double s = tp_->seconds();
    tp_->reset_seconds();
    return s;
  }

 private:
  void places();
  void layout(bool allocate);
  Slot& slot_of(int mb);
  const Slot& slot_of(int mb) const { return const_cast<TransformerImpl*>(this)->slot_of(mb); }
  // Views of the chunk's memory, on its device.
  Tensor mat(void* p, DType t, int64_t rows, int64_t cols) const {
    return Tensor(p, t, {rows, cols}, dev_);
  }
  Tensor vec(void* p, DType t, int64_t n) const {
    return p == nullptr ? Tensor() : Tensor(p, t, {n}, dev_);
  }
  Tensor f32(float* p, int64_t n) const { return Tensor(p, DType::F32, {n}, dev_); }
  Tensor ids(int32_t* p) const { return Tensor(p, DType::I32, {N_}, dev_); }
  // Vocabulary columns [row_begin, Vl) of every row of the logits (row stride Vl).
  Tensor logit_cols(const Slot& s, int64_t row_begin) const {
    return Tensor(at(s.logits, pt_, row_begin), pt_, {N_ * Vl_ - row_begin}, dev_);
  }
  Tensor hid(void* p) const { return mat(p, pt_, Ns_, C_); }  // (Ns, C)
  Tensor full(void* p) const { return mat(p, pt_, N_, C_); }  // (N, C)
  // Parameters and gradients of units: the hook's or the flat buffers.
  void* acquire(UnitHook* hook, int unit);
  void release(UnitHook* hook, int unit) {
    if (hook) hook->release_params(unit);
  }
  void* grads_of(UnitHook* hook, int unit);
  void done(UnitHook* hook, int unit, bool final) {
    if (hook) hook->unit_done(unit, final);
  }
  // A block parameter (role) given its unit's base pointer; empty if the family has none.
  Tensor param(int l, ParamRole r, void* unit_base, DType t) const;
  Tensor grad(int l, ParamRole r, void* unit_grads) const;  // partial ones: the scratch
  void begin_partials(int unit);
  void settle_partials(int unit, void* unit_grads);

  void embed_forward(Slot& s, UnitHook* hook);
  void attn_forward(Slot& s, int l, const void* x, UnitHook* hook);
  void mlp_forward(Slot& s, int l, UnitHook* hook);
  double head_forward(Slot& s, const void* x, float dloss, bool train, UnitHook* hook);
  // Input-gradient halves; each runs its weight half too unless the chunk defers it.
  void head_backward(Slot& s, UnitHook* hook);
  void mlp_backward(Slot& s, int l, UnitHook* hook);
  void attn_backward(Slot& s, int l, const void* x, UnitHook* hook);
  void embed_backward(Slot& s, UnitHook* hook);
  // Weight halves from the tensors the input halves leave.
  void head_weight(Slot& s, UnitHook* hook);
  void final_norm_weight(Slot& s, const void* x, void* dy, UnitHook* hook);
  void mlp_weight(Slot& s, int l, UnitHook* hook);
  void attn_weight(Slot& s, int l, const void* x, UnitHook* hook);
  Tensor row_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G, void* stash,
                               Tensor x, Tensor dx, bool fuse);
  void row_parallel_weight(int l, ParamRole w, ParamRole b, void* G, Tensor dy, Tensor x);
  void column_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G, Tensor dy,
                                void* ln, void* dln, bool fuse);
  void row_parallel_forward(void* out, Tensor x, Tensor w, Tensor b);
  void norm_forward(void* out, float* mean, float* rstd, const void* x, Tensor gain, Tensor bias);
  void norm_backward(Tensor gain, Tensor dgain, Tensor dbias, void* dln, const void* x,
                     const float* mean, const float* rstd, bool fuse);
  void norm_weight(Tensor dgain, Tensor dbias, void* dln, const void* x, const float* mean,
                   const float* rstd);
  // The final norm's gain and bias (bias empty for rms) at a unit's parameters or gradients.
  Tensor final_gain(void* base, DType t) const { return vec(at(base, t, o_lnf_w_), t, C_); }
  Tensor final_bias(void* base, DType t) const {
    return gpt2_ ? vec(at(base, t, o_lnf_b_), t, C_) : Tensor();
  }
  void* final_grads(void* unit_grads) const {  // partial ones: the scratch
    return partials_[size_t(final_)].empty() ? unit_grads : scratch_;
  }
  Tensor norm_scratch() const {
    return f32(norm_scratch_, int64_t(ops::norm_backward_scratch_floats(Ns_, C_)));
  }
  void embed_weight(Slot& s, Tensor denc, UnitHook* hook);
  const void* block_input(const Slot& s, int l) const {
    return l > l0_ ? s.blocks[size_t(l - 1 - l0_)].res3 : s.encoded;
  }
  // The (N, C) rows of a (Ns, C) tensor: gathered into `into` under sequence parallelism.
  Tensor gathered(void* shard, void* into);
  const std::vector<int>& output_units() const { return tied_ ? vocab_ : output_; }

  const ModelSpec& spec_;
  const ModelConfig& cfg_;
  const TpLayout& tpl_;
  DType pt_, gt_;
  Device dev_;
  tp::Group own_tp_;
  tp::Group* tp_;
  bool sp_ = false;
  int B_, T_;
  int64_t N_, Ns_;
  bool gpt2_ = true, tied_ = true;
  int64_t C_ = 0, Vl_ = 0, Fl_ = 0, FCHl_ = 0, QKVl_ = 0, Hl_ = 0;
  ops::AttentionShape ash_;
  ChunkOptions chunk_;
  bool has_embed_ = false, has_head_ = false;
  int l0_ = 0, l1_ = 0;  // the chunk's blocks [l0, l1)

  void* P_;  // flat parameters, or nullptr (every pass places them through its hook)
  void* D_;  // flat gradients, or nullptr
  std::vector<int> vocab_, output_, attn_, mlp_;
  int position_ = -1, final_ = -1;
  std::vector<BlockPlaces> places_;
  int64_t o_lnf_w_ = -1, o_lnf_b_ = -1;  // inside the final-norm unit
  // Partial gradients (replicated parameters whose gradient each rank only has a part of):
  // per unit, the ranges (element offset in the unit, count, group) summed over tp before they
  // are added to the unit's gradients; such parameters accumulate into scratch_ first.
  struct Partial {
    int64_t offset = 0, numel = 0;
    comm::Communicator* over = nullptr;
  };
  std::vector<std::vector<Partial>> partials_;     // by unit
  std::vector<std::vector<char>> partial_params_;  // by unit, by param index: computed in scratch
  int scratch_unit_ = -1;

  Arena acts_, work_;
  std::vector<Slot> slots_;
  // Workspace (shared by every slot).
  void *dres_ = nullptr, *dc_ = nullptr, *dbig_ = nullptr, *dbig2_ = nullptr;
  void *gath_ = nullptr, *part_ = nullptr;  // (N, C) each
  float* dlnf32_ = nullptr;                 // (N, C) fp32 output gradient of the final norm
  float *norm_scratch_ = nullptr, *att_scratch_ = nullptr;
  float *ce_max_ = nullptr, *ce_all_ = nullptr, *ce_sums_ = nullptr;  // (N), (tp, N), (2, N)
  void* scratch_ = nullptr;  // (largest unit) gradients of partial parameters, grad dtype
  // Fused-mode output gradients (defer_weight off): one set reused by every block.
  BlockStash fused_;
};

TransformerImpl::TransformerImpl(const ModelSpec& spec, DType pt, DType gt, void* params,
                                 void* grads, int B, int T, const ChunkOptions& chunk,
                                 tp::Group* tp)
    : spec_(spec),
      cfg_(spec.config),
      tpl_(spec.tp),
      pt_(pt),
      gt_(gt),
      dev_(chunk.device),
      tp_(tp != nullptr ? tp : &own_tp_),
      B_(B),
      T_(T),
      N_(int64_t(B) * T),
      chunk_(chunk),
      P_(params),
      D_(grads) {
  STRATA_CHECK(T <= cfg_.seq_len, "micro-batch sequence length ", T, " exceeds model.seq_len ",
               cfg_.seq_len);
  STRATA_CHECK(tp_->size() == tpl_.size && tp_->rank() == tpl_.rank,
               "the model spec was built for tensor-parallel rank ", tpl_.rank, " of ", tpl_.size,
               " but the group is rank ", tp_->rank(), " of ", tp_->size());
  STRATA_CHECK(chunk_.slots >= 1, "a model chunk needs at least one activation slot");
  sp_ = tp_->sequence_parallel();
  STRATA_CHECK(!sp_ || N_ % tp_->size() == 0, "sequence parallelism splits the ", N_,
               " token rows of a micro-batch over ", tp_->size(), " ranks: they must divide");
  Ns_ = sp_ ? N_ / tp_->size() : N_;
  gpt2_ = cfg_.family == "gpt2";
  tied_ = cfg_.tied_embeddings;
  C_ = cfg_.hidden;
  const int64_t hd = C_ / cfg_.heads;
  Vl_ = tpl_.vocab_rows, Fl_ = tpl_.ffn, FCHl_ = gpt2_ ? Fl_ : 2 * Fl_;
  QKVl_ = tpl_.qkv_rows, Hl_ = int64_t(tpl_.heads) * hd;
  ash_ = {B_, T_, tpl_.groups, tpl_.rep, int(hd)};
  places();
  layout(false);
  acts_.allocate(MemCategory::Activations, dev_);
  work_.allocate(MemCategory::Workspace, dev_);
  layout(true);
}

void TransformerImpl::places() {
  vocab_ = spec_.units_of(UnitKind::Vocab);
  output_ = spec_.units_of(UnitKind::Output);
  attn_ = spec_.units_of(UnitKind::Attention);
  mlp_ = spec_.units_of(UnitKind::Mlp);
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
  STRATA_CHECK(u1 == U || u1 <= final_, "a chunk cannot end inside the head");
  has_embed_ = u0 == 0;
  has_head_ = u1 == U;
  l0_ = L, l1_ = 0;
  for (int l = 0; l < L; ++l) {
    const bool a = attn_[size_t(l)] >= u0 && attn_[size_t(l)] < u1;
    const bool m = mlp_[size_t(l)] >= u0 && mlp_[size_t(l)] < u1;
    STRATA_CHECK(a == m, "a chunk boundary splits block ", l, "; chunks hold whole blocks");
    if (a) l0_ = std::min(l0_, l), l1_ = std::max(l1_, l + 1);
  }
  if (l0_ > l1_) l0_ = l1_ = has_embed_ ? 0 : L;
  STRATA_CHECK(has_embed_ || has_head_ || l1_ > l0_, "a chunk holds no units");

  places_.assign(size_t(L), BlockPlaces{});
  partials_.assign(size_t(U), {});
  partial_params_.assign(size_t(U), std::vector<char>(spec_.params.size(), 0));
  const bool multi = tp_->size() > 1;
  for (int u = 0; u < U; ++u) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    for (int i : unit.params) {
      const ParamSpec& p = spec_.params[size_t(i)];
      const int64_t off = std::max<int64_t>(p.offset - unit.offset, 0);
      if (unit.kind == UnitKind::Attention || unit.kind == UnitKind::Mlp) {
        places_[size_t(p.layer)][size_t(p.role)] = {u, off, i};
      } else if (p.role == ParamRole::FinalNormW) {
        o_lnf_w_ = off;
      } else if (p.role == ParamRole::FinalNormB) {
        o_lnf_b_ = off;
      }
      if (!multi) continue;
      // Replicated parameters are partial under sequence parallelism (each rank sees its rows);
      // replicated key/value rows always (each rank sees its query heads).
      if (p.split_axis < 0 && sp_ && p.role != ParamRole::TokenEmbedding) {
        partials_[size_t(u)].push_back({off, p.numel(), tp_->comm()});
        partial_params_[size_t(u)][size_t(i)] = 1;
      }
      if (p.split_axis == 0 && p.ranges.size() == 2 && p.ranges[1].replicas > 1) {
        const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
        STRATA_CHECK(tp_->kv() != nullptr, "replicated key/value heads need the kv group");
        partials_[size_t(u)].push_back(
            {off + p.ranges[0].count * cols, p.ranges[1].count * cols, tp_->kv()});
        partial_params_[size_t(u)][size_t(i)] = 1;
      }
    }
  }
}

void TransformerImpl::layout(bool allocate) {
  acts_.rewind();
  work_.rewind();
  const size_t ps = dtype_size(pt_), f4 = sizeof(float);
  const int64_t N = N_, Ns = Ns_, C = C_;
  auto act = [&](int64_t n, size_t e) { return acts_.take(n, e); };
  auto wk = [&](int64_t n, size_t e) { return work_.take(n, e); };
  const int nb = l1_ - l0_;
  slots_.resize(size_t(chunk_.slots));
  for (Slot& s : slots_) {
    s.tokens = static_cast<int32_t*>(act(N, 4));
    s.targets = static_cast<int32_t*>(act(N, 4));
    s.encoded = act(Ns * C, ps);
    s.blocks.resize(size_t(nb));
    for (BlockActs& a : s.blocks) {
      a.ln1 = act(Ns * C, ps);
      a.ln1_mean = static_cast<float*>(act(Ns, f4));
      a.ln1_rstd = static_cast<float*>(act(Ns, f4));
      a.qkv = act(N * QKVl_, ps);
      a.att = act(int64_t(B_) * tpl_.heads * T_ * T_, ps);
      a.atty = act(N * Hl_, ps);
      a.res2 = act(Ns * C, ps);
      a.ln2 = act(Ns * C, ps);
      a.ln2_mean = static_cast<float*>(act(Ns, f4));
      a.ln2_rstd = static_cast<float*>(act(Ns, f4));
      a.fch = act(N * FCHl_, ps);
      a.fch_act = act(N * Fl_, ps);
      a.res3 = act(Ns * C, ps);
    }
    if (has_head_) {
      s.lnf = act(Ns * C, ps);
      s.lnf_mean = static_cast<float*>(act(Ns, f4));
      s.lnf_rstd = static_cast<float*>(act(Ns, f4));
      s.logits = act(N * Vl_, ps);
      s.losses = static_cast<float*>(act(N, f4));
    }
    if (chunk_.defer_weight) {
      s.stash.resize(size_t(nb));
      for (BlockStash& b : s.stash) {
        b = {act(N * C, ps), act(N * QKVl_, ps), act(Ns * C, ps),
             act(N * C, ps), act(N * FCHl_, ps), act(Ns * C, ps)};
      }
      if (has_head_) s.dlnf = act(Ns * C, ps);
      if (has_embed_) s.denc = act(Ns * C, ps);
    }
  }
  const int64_t big = std::max<int64_t>({QKVl_, FCHl_, C});
  dres_ = wk(Ns * C, ps);
  dc_ = wk(N * C, ps);
  dbig_ = wk(N * big, ps);
  dbig2_ = wk(N * std::max<int64_t>({Fl_, Hl_, C}), ps);
  if (sp_) gath_ = wk(N * C, ps);  // a norm's output, gathered
  if (sp_) part_ = wk(N * C, ps);  // a row-parallel layer's partial output, all rows
  if (has_head_) dlnf32_ = static_cast<float*>(wk(N * C, f4));
  norm_scratch_ = static_cast<float*>(wk(int64_t(ops::norm_backward_scratch_floats(N, C)), f4));
  att_scratch_ = static_cast<float*>(wk(int64_t(ops::attention_backward_scratch_floats(ash_)), f4));
  if (has_head_ && tp_->size() > 1) {
    ce_max_ = static_cast<float*>(wk(N, f4));
    ce_all_ = static_cast<float*>(wk(N * tp_->size(), f4));
    ce_sums_ = static_cast<float*>(wk(2 * N, f4));
  }
  int64_t largest = 0;
  for (const std::vector<Partial>& p : partials_) {
    if (!p.empty()) largest = 1;
  }
  if (largest > 0) {
    for (const UnitSpec& u : spec_.units) largest = std::max(largest, u.numel);
    scratch_ = wk(largest, dtype_size(gt_));
  }
  // The row-parallel output gradients are dres itself but under sequence parallelism, where they
  // are gathered into part_.
  fused_ = {part_, dbig_, dc_, part_, dbig_, dc_};
  (void)allocate;
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
  const bool partial = partial_params_[size_t(pl.unit)][size_t(pl.param)] != 0;
  return param(l, r, partial ? scratch_ : unit_grads, gt_);
}

// Partial parameters accumulate in the scratch: zero it for the unit's params.
void TransformerImpl::begin_partials(int unit) {
  if (partials_[size_t(unit)].empty()) return;
  ops::fill_zero(vec(scratch_, gt_, spec_.units[size_t(unit)].numel));
}

// Sums the unit's partial ranges over their groups and adds every scratch parameter into the
// unit's gradients.
void TransformerImpl::settle_partials(int unit, void* unit_grads) {
  if (partials_[size_t(unit)].empty()) return;
  for (const Partial& p : partials_[size_t(unit)]) {
    tp_->all_reduce(vec(at(scratch_, gt_, p.offset), gt_, p.numel), p.over);
  }
  const UnitSpec& u = spec_.units[size_t(unit)];
  for (int i : u.params) {
    if (!partial_params_[size_t(unit)][size_t(i)]) continue;
    const ParamSpec& p = spec_.params[size_t(i)];
    const int64_t off = p.offset - u.offset;
    ops::add_inplace(vec(at(unit_grads, gt_, off), gt_, p.numel()),
                     vec(at(scratch_, gt_, off), gt_, p.numel()));
  }
}

Tensor TransformerImpl::gathered(void* shard, void* into) {
  if (!sp_) return full(shard);
  tp_->all_gather(full(into), hid(shard));
  return full(into);
}

// --- forward ------------------------------------------------------------------------------------

// Row-parallel linear: out (Ns, C) = x (N, in_l) · wᵀ summed over the group, + b. Each rank's
// partial sum over its heads or hidden units is all-reduced (under sequence parallelism
// reduce-scattered: each rank keeps its block of rows); the bias is added after the sum.
void TransformerImpl::row_parallel_forward(void* out, Tensor x, Tensor w, Tensor b) {
  if (tp_->size() == 1) return ops::linear_forward(hid(out), x, w, b);
  ops::linear_forward(full(sp_ ? part_ : out), x, w, Tensor());
  if (sp_) {
    tp_->reduce_scatter(hid(out), full(part_));
  } else {
    tp_->all_reduce(hid(out));
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
    ops::rmsnorm_forward(hid(out), f32(rstd, Ns_), xin, gain, cfg_.norm_eps);
  }
}

void TransformerImpl::embed_forward(Slot& s, UnitHook* hook) {
  const Tensor tokens(s.tokens, DType::I32, {N_});
  // Vocabulary-parallel: each rank writes the rows of the tokens it owns, the rest stay zero,
  // and the sum over the group is the embedding (under SP, each rank keeps its block of rows).
  const bool multi = tp_->size() > 1;
  void* out = sp_ ? part_ : s.encoded;
  if (multi) ops::fill_zero(full(out));
  for (int u : vocab_) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::embedding_forward(full(out), tokens, mat(acquire(hook, u), pt_, rows, C_),
                           tpl_.vocab_begin + unit.row_begin, tpl_.vocab_begin + unit.row_end);
    release(hook, u);
  }
  if (multi) {
    if (sp_) {
      tp_->reduce_scatter(hid(s.encoded), full(out));
    } else {
      tp_->all_reduce(full(out));
    }
  }
  if (position_ >= 0) {
    ops::position_forward(hid(s.encoded), mat(acquire(hook, position_), pt_, cfg_.seq_len, C_), T_,
                          sp_ ? tp_->rank() * Ns_ : 0);
    release(hook, position_);
  }
}

void TransformerImpl::attn_forward(Slot& s, int l, const void* x, UnitHook* hook) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  const int ua = attn_[size_t(l)];
  void* P = acquire(hook, ua);
  using R = ParamRole;
  const Tensor xin = hid(const_cast<void*>(x));
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(l, R::Norm1W, P, pt_),
               param(l, R::Norm1B, P, pt_));
  // Column-parallel QKV (this rank's heads), attention, row-parallel projection.
  const Tensor ln1 = gathered(a.ln1, gath_);
  ops::linear_forward(mat(a.qkv, pt_, N_, QKVl_), ln1, param(l, R::QkvW, P, pt_),
                      param(l, R::QkvB, P, pt_));
  if (!gpt2_) ops::rope_forward(mat(a.qkv, pt_, N_, QKVl_), ash_, cfg_.rope_theta);
  ops::attention_forward(mat(a.atty, pt_, N_, Hl_),
                         vec(a.att, pt_, int64_t(B_) * tpl_.heads * T_ * T_),
                         mat(a.qkv, pt_, N_, QKVl_), ash_);
  const Tensor atty = mat(a.atty, pt_, N_, Hl_);
  row_parallel_forward(a.res2, atty, param(l, R::ProjW, P, pt_), param(l, R::ProjB, P, pt_));
  release(hook, ua);
  ops::add_inplace(hid(a.res2), xin);
}

void TransformerImpl::mlp_forward(Slot& s, int l, UnitHook* hook) {
  BlockActs& a = s.blocks[size_t(l - l0_)];
  const int um = mlp_[size_t(l)];
  void* P = acquire(hook, um);
  using R = ParamRole;
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, param(l, R::Norm2W, P, pt_),
               param(l, R::Norm2B, P, pt_));
  const Tensor ln2 = gathered(a.ln2, gath_);
  ops::linear_forward(mat(a.fch, pt_, N_, FCHl_), ln2, param(l, R::FcW, P, pt_),
                      param(l, R::FcB, P, pt_));
  if (gpt2_) {
    ops::gelu_forward(mat(a.fch_act, pt_, N_, Fl_), mat(a.fch, pt_, N_, FCHl_));
  } else {
    ops::swiglu_forward(mat(a.fch_act, pt_, N_, Fl_), mat(a.fch, pt_, N_, FCHl_));
  }
  const Tensor act = mat(a.fch_act, pt_, N_, Fl_);
  row_parallel_forward(a.res3, act, param(l, R::Fc2W, P, pt_), param(l, R::Fc2B, P, pt_));
  release(hook, um);
  ops::add_inplace(hid(a.res3), hid(a.res2));
}

double TransformerImpl::head_forward(Slot& s, const void* x, float dloss, bool train,
                                     UnitHook* hook) {
  void* pf = acquire(hook, final_);
  norm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, final_gain(pf, pt_), final_bias(pf, pt_));
  release(hook, final_);
  // logits[:, rows] (N, rows) = lnf (N, C) · W[rows]ᵀ, one vocabulary unit at a time: this
  // rank's vocabulary columns only (column-parallel over the vocabulary).
  const Tensor lnf = gathered(s.lnf, gath_);
  for (int u : output_units()) {
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::Gemm g;
    g.M = N_, g.N = rows, g.K = C_, g.trans_b = true, g.lda = C_, g.ldb = C_, g.ldc = Vl_;
    ops::gemm(logit_cols(s, unit.row_begin), lnf, mat(acquire(hook, u), pt_, rows, C_), g);
    release(hook, u);
  }
  const Tensor logits = mat(s.logits, pt_, N_, Vl_), targets(s.targets, DType::I32, {N_});
  const Tensor losses = f32(s.losses, N_);
  if (tp_->size() == 1) {
    if (train) {
      ops::cross_entropy_forward_backward(losses, logits, targets, dloss);
    } else {
      ops::cross_entropy_forward(losses, logits, targets);
    }
  } else {
    // Vocabulary-parallel cross-entropy: the full logits never exist on one rank.
    const int64_t v0 = tpl_.vocab_begin, valid = tpl_.vocab_valid;
    ops::vocab_ce_max(f32(ce_max_, N_), logits, valid);
    tp_->all_gather(mat(ce_all_, DType::F32, tp_->size(), N_), mat(ce_max_, DType::F32, 1, N_));
    ops::max_rows(f32(ce_max_, N_), mat(ce_all_, DType::F32, tp_->size(), N_));
    ops::vocab_ce_sums(mat(ce_sums_, DType::F32, 2, N_), logits, targets, f32(ce_max_, N_), v0,
                       valid);
    tp_->all_reduce(f32(ce_sums_, 2 * N_));
    ops::vocab_ce_finish(losses, logits, targets, f32(ce_max_, N_),
                         mat(ce_sums_, DType::F32, 2, N_), v0, valid, train, dloss);
  }
  return ops::sum(losses);
}

double TransformerImpl::forward(int mb, const int32_t* tokens, Tensor hidden,
                                const int32_t* targets, float dloss, bool train, UnitHook* hook) {
  Slot* free = nullptr;
  for (Slot& s : slots_) {
    if (s.eval) s.mb = -1, s.eval = false;
    STRATA_CHECK(s.mb != mb, "micro-batch ", mb, " is already in flight in this chunk");
    if (s.mb < 0 && free == nullptr) free = &s;
  }
  STRATA_CHECK(free != nullptr, "all ", slots_.size(), " activation slots of the chunk are in ",
               "use: run a backward before the next forward, or give the chunk more slots");
  Slot& s = *free;
  if (has_embed_) {
    STRATA_CHECK(tokens != nullptr, "the first chunk needs token ids");
    std::copy(tokens, tokens + N_, s.tokens);  // host ids; a device backend uploads here
  } else {
    STRATA_CHECK(hidden.data != nullptr && hidden.numel() == Ns_ * C_ && hidden.dtype == pt_,
                 "chunk input must be (", Ns_, ", ", C_, ") ", dtype_name(pt_), ", got ",
                 hidden.shape_str());
    ops::copy(hid(s.encoded), hidden);
  }
  if (has_head_) {
    STRATA_CHECK(targets != nullptr, "the last chunk needs targets");
    std::copy(targets, targets + N_, s.targets);
  }
  const Tensor tk(s.tokens, DType::I32, {N_}), tg(s.targets, DType::I32, {N_});
  const int64_t counted =
      ops::check_tokens(has_embed_ ? tk : Tensor(), has_head_ ? tg : Tensor(), cfg_.vocab);
  s.counted = has_head_ ? counted : 0;
  s.mb = mb;
  s.eval = !train;
  s.input_done = false;
  if (hook) hook->begin_pass(UnitHook::Pass::Forward);
  if (has_embed_) embed_forward(s, hook);
  for (int l = l0_; l < l1_; ++l) {
    attn_forward(s, l, block_input(s, l), hook);
    mlp_forward(s, l, hook);
  }
  if (!has_head_) return 0.0;
  return head_forward(s, block_input(s, l1_), dloss, train, hook);
}

Tensor TransformerImpl::output(int mb) const {
  const Slot& s = slot_of(mb);
  STRATA_CHECK(!has_head_, "the last chunk's output is its loss");
  return hid(const_cast<void*>(block_input(s, l1_)));
}

// --- backward -----------------------------------------------------------------------------------

// dres (Ns, C) fp? : on exit the gradient of the final norm's input.
void TransformerImpl::head_backward(Slot& s, UnitHook* hook) {
  // dlnf (N, C) fp32 = Σ_units dlogits[:, rows] · W[rows] (this rank's vocabulary columns: a
  // partial sum over the group), rounded once.
  const std::vector<int>& out = output_units();
  const Tensor lnf = chunk_.defer_weight ? Tensor() : gathered(s.lnf, gath_);
  for (size_t k = out.size(); k-- > 0;) {
    const int u = out[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    const void* w = acquire(hook, u);
    ops::Gemm g;
    g.M = N_, g.N = C_, g.K = rows, g.lda = Vl_, g.ldb = C_, g.ldc = C_;
    g.accumulate = k + 1 != out.size();
    ops::gemm(mat(dlnf32_, DType::F32, N_, C_), logit_cols(s, unit.row_begin),
              mat(const_cast<void*>(w), pt_, rows, C_), g);
    release(hook, u);
    if (!chunk_.defer_weight) {
      // dW[rows] += dlogits[:, rows]ᵀ · lnf
      void* dw = grads_of(hook, u);
      ops::Gemm gw;
      gw.M = rows, gw.N = C_, gw.K = N_, gw.trans_a = true, gw.lda = Vl_, gw.ldb = C_, gw.ldc = C_,
      gw.accumulate = true;
      ops::gemm(mat(dw, gt_, rows, C_), logit_cols(s, unit.row_begin), lnf, gw);
      done(hook, u, !tied_);
    }
  }
  const Tensor d32 = mat(dlnf32_, DType::F32, N_, C_);
  if (tp_->size() > 1) {
    if (sp_) {
      tp_->reduce_scatter(mat(dlnf32_, DType::F32, Ns_, C_), d32);
    } else {
      tp_->all_reduce(d32);
    }
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
  const Tensor lnf = gathered(s.lnf, gath_);
  for (size_t k = out.size(); k-- > 0;) {
    const int u = out[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::Gemm gw;
    gw.M = rows, gw.N = C_, gw.K = N_, gw.trans_a = true, gw.lda = Vl_, gw.ldb = C_, gw.ldc = C_,
    gw.accumulate = true;
    ops::gemm(mat(grads_of(hook, u), gt_, rows, C_), logit_cols(s, unit.row_begin), lnf, gw);
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

// Row-parallel linear (w: (C, in_l)): its output gradient is dres on every row (gathered into
// `stash` under sequence parallelism, copied there for a deferred weight half). dx (N, in_l).
Tensor TransformerImpl::row_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G,
                                              void* stash, Tensor x, Tensor dx, bool fuse) {
  Tensor dy = sp_ ? gathered(dres_, stash) : hid(dres_);
  if (!fuse && !sp_) ops::copy(full(stash), dy), dy = full(stash);
  if (fuse && tp_->size() == 1) {
    ops::linear_backward(dx, grad(l, w, G), grad(l, b, G), dy, x, param(l, w, P, pt_));
    return dy;
  }
  ops::linear_backward_input(dx, dy, param(l, w, P, pt_), false);
  if (fuse) row_parallel_weight(l, w, b, G, dy, x);
  return dy;
}

// The bias was added after the sum over the group, on this rank's rows: its gradient is the sum
// of dy over them.
void TransformerImpl::row_parallel_weight(int l, ParamRole w, ParamRole b, void* G, Tensor dy,
                                          Tensor x) {
  ops::linear_backward_weight(grad(l, w, G), Tensor(), dy, x);
  const Tensor db = grad(l, b, G);
  if (db.data == nullptr) return;
  const int64_t r = tp_->rank();
  ops::linear_backward_weight(Tensor(), db, sp_ ? dy.slice0(r * Ns_, (r + 1) * Ns_) : dy, Tensor());
}

// Column-parallel linear (w: (out_l, C)) reading the norm output `ln` (Ns, C; gathered under SP):
// dln (Ns, C) = its input gradient, summed over the group (reduce-scattered under SP).
void TransformerImpl::column_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G,
                                               Tensor dy, void* ln, void* dln, bool fuse) {
  const Tensor dfull = full(sp_ ? part_ : dln);
  if (fuse) {
    ops::linear_backward(dfull, grad(l, w, G), grad(l, b, G), dy, gathered(ln, gath_),
                         param(l, w, P, pt_));
  } else {
    ops::linear_backward_input(dfull, dy, param(l, w, P, pt_), false);
  }
  if (sp_) {
    tp_->reduce_scatter(hid(dln), dfull);
  } else if (tp_->size() > 1) {
    tp_->all_reduce(dfull);
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
    ops::rmsnorm_backward(hid(dres_), dgain, norm_scratch(), hid(dln), xin, gain, r);
  } else if (gpt2_) {
    ops::layernorm_backward_input(hid(dres_), hid(dln), xin, gain, m, r);
  } else {
    ops::rmsnorm_backward_input(hid(dres_), hid(dln), xin, gain, r);
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
  void* P = acquire(hook, um);
  void* G = nullptr;
  if (fuse) begin_partials(um), G = grads_of(hook, um);
  const Tensor d_act = mat(dbig2_, pt_, N_, Fl_);
  row_parallel_backward(l, R::Fc2W, R::Fc2B, P, G, st.dfc2, mat(a.fch_act, pt_, N_, Fl_), d_act,
                        fuse);
  const Tensor dfch = mat(st.dfch, pt_, N_, FCHl_);
  if (gpt2_) {
    ops::gelu_backward(dfch, mat(a.fch, pt_, N_, FCHl_), d_act);
  } else {
    ops::swiglu_backward(dfch, d_act, mat(a.fch, pt_, N_, FCHl_));
  }
  void* dln2 = fuse ? dc_ : st.dln2;
  column_parallel_backward(l, R::FcW, R::FcB, P, G, dfch, a.ln2, dln2, fuse);
  norm_backward(param(l, R::Norm2W, P, pt_), grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), dln2,
                a.res2, a.ln2_mean, a.ln2_rstd, fuse);
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
  begin_partials(um);
  void* G = grads_of(hook, um);
  row_parallel_weight(l, R::Fc2W, R::Fc2B, G, full(st.dfc2), mat(a.fch_act, pt_, N_, Fl_));
  ops::linear_backward_weight(grad(l, R::FcW, G), grad(l, R::FcB, G), mat(st.dfch, pt_, N_, FCHl_),
                              gathered(a.ln2, gath_));
  norm_weight(grad(l, R::Norm2W, G), grad(l, R::Norm2B, G), st.dln2, a.res2, a.ln2_mean,
              a.ln2_rstd);
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
  const Tensor d_atty = mat(dbig2_, pt_, N_, Hl_);
  row_parallel_backward(l, R::ProjW, R::ProjB, P, G, st.dproj, mat(a.atty, pt_, N_, Hl_), d_atty,
                        fuse);
  const Tensor dqkv = mat(st.dqkv, pt_, N_, QKVl_);
  const int64_t att_n = int64_t(B_) * tpl_.heads * T_ * T_;
  ops::attention_backward(dqkv,
                          f32(att_scratch_, int64_t(ops::attention_backward_scratch_floats(ash_))),
                          d_atty, mat(a.qkv, pt_, N_, QKVl_), vec(a.att, pt_, att_n), ash_);
  if (!gpt2_) ops::rope_backward(dqkv, ash_, cfg_.rope_theta);
  void* dln1 = fuse ? dc_ : st.dln1;
  column_parallel_backward(l, R::QkvW, R::QkvB, P, G, dqkv, a.ln1, dln1, fuse);
  norm_backward(param(l, R::Norm1W, P, pt_), grad(l, R::Norm1W, G), grad(l, R::Norm1B, G), dln1, x,
                a.ln1_mean, a.ln1_rstd, fuse);
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
  row_parallel_weight(l, R::ProjW, R::ProjB, G, full(st.dproj), mat(a.atty, pt_, N_, Hl_));
  ops::linear_backward_weight(grad(l, R::QkvW, G), grad(l, R::QkvB, G),
                              mat(st.dqkv, pt_, N_, QKVl_), gathered(a.ln1, gath_));
  norm_weight(grad(l, R::Norm1W, G), grad(l, R::Norm1B, G), st.dln1, x, a.ln1_mean, a.ln1_rstd);
  settle_partials(ua, G);
  done(hook, ua, true);
}

// The embedding reads no parameters: its whole backward is weight gradients. dres holds the
// gradient of the embedding's output (Ns, C).
void TransformerImpl::embed_backward(Slot& s, UnitHook* hook) {
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
    ops::position_backward(mat(gb, gt_, cfg_.seq_len, C_), denc, T_, sp_ ? tp_->rank() * Ns_ : 0);
    settle_partials(position_, g);
    done(hook, position_, true);
  }
  const Tensor d = sp_ ? gathered(denc.data, part_) : denc;
  const Tensor tokens(s.tokens, DType::I32, {N_});
  for (size_t k = vocab_.size(); k-- > 0;) {
    const int u = vocab_[k];
    const UnitSpec& unit = spec_.units[size_t(u)];
    const int64_t rows = unit.row_end - unit.row_begin;
    ops::embedding_backward(mat(grads_of(hook, u), gt_, rows, C_), d, tokens,
                            tpl_.vocab_begin + unit.row_begin, tpl_.vocab_begin + unit.row_end);
    done(hook, u, true);
  }
}

Tensor TransformerImpl::backward_input(int mb, Tensor dout, UnitHook* hook) {
  Slot& s = slot_of(mb);
  STRATA_CHECK(!s.input_done && !s.eval, "micro-batch ", mb,
               " has no training forward waiting for its input-gradient backward");
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
    mlp_backward(s, l, hook);
    attn_backward(s, l, block_input(s, l), hook);
  }
  if (has_embed_) embed_backward(s, hook);
  s.input_done = true;
  if (!chunk_.defer_weight) s.mb = -1;
  return has_embed_ ? Tensor() : hid(dres_);
}

void TransformerImpl::backward_weight(int mb, UnitHook* hook) {
  STRATA_CHECK(chunk_.defer_weight, "this chunk computes weight gradients in backward_input");
  Slot& s = slot_of(mb);
  STRATA_CHECK(s.input_done, "micro-batch ", mb, "'s weight-gradient backward before its ",
               "input-gradient backward");
  if (has_head_) head_weight(s, hook);
  for (int l = l1_ - 1; l >= l0_; --l) {
    mlp_weight(s, l, hook);
    attn_weight(s, l, block_input(s, l), hook);
  }
  if (has_embed_) embed_weight(s, hid(s.denc), hook);
  s.mb = -1;
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
