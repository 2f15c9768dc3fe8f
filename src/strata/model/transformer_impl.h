// The model's implementation, shared by transformer.cc (the chunk: memory, slots, the passes'
// order) and transformer_layers.cc (each sublayer's forward and backward halves). Private to
// src/strata/model.
#pragma once

#include <algorithm>
#include <array>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/ops.h"
#include "strata/model/transformer.h"

namespace strata::model_detail {

// The tensor-parallel mappings, each call naming the half it is (tensor_parallel/mappings.h).
namespace copy_to = tp::copy_to_region;
namespace reduce_from = tp::reduce_from_region;
namespace gather_from_sp = tp::gather_from_sp_region;
namespace reduce_scatter_to_sp = tp::reduce_scatter_to_sp_region;

// Carves views out of one allocation, each 64-byte aligned. Laid out twice: once to size the
// allocation, once to point into it.
class Arena {
 public:
  void* take(int64_t n, size_t elem) {
    char* at = static_cast<char*>(buffer_.data()) + used_;
    used_ += (size_t(n) * elem + 63) / 64 * 64;
    return buffer_.data() != nullptr ? at : nullptr;
  }
  // Device memory of d, or host memory (host-resident activation checkpoints).
  void allocate(MemCategory c, Device d, bool host = false) {
    buffer_ = host ? Buffer::host(c, used_) : Buffer(c, used_, d);
  }
  void rewind() { used_ = 0; }
  size_t used() const { return used_; }

 private:
  Buffer buffer_;
  size_t used_ = 0;
};

inline void* at(void* base, DType t, int64_t elems) {
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
// regions, Ns (= N, or N/tp under sequence parallelism) outside them. A fully recomputed block's
// views point into the chunk's one recompute set (every one but res3); under selective recompute
// every block's att does.
struct BlockActs {
  void* ln1;        // (Ns, C)
  float* ln1_mean;  // (Ns)
  float* ln1_rstd;  // (Ns)
  void* qkv;        // (N, QKVl)  after the q/k norms and RoPE (the RoPE families)
  void* qkv_in;     // (N, QKVl)  the projection's output before the q/k norms (qk_norm only)
  float* qk_rstd;   // (N, groups·(rep+1)), or (N, 2) "whole": the q/k norms' statistics
  // Post norms (norm_placement sandwich, post): each sublayer's output before its norm, (Ns, C),
  // and the norm's statistics (Ns).
  void* attn_out;
  float* attn_out_rstd;
  void* mlp_out;
  float* mlp_out_rstd;
  void* att;   // the saved attention state (B, heads_l, T, T) on the CPU (att_view)
  void* atty;  // (N, Hl)
  void* res2;  // (Ns, C)  residual after attention
  void* ln2;   // (Ns, C)
  float* ln2_mean;
  float* ln2_rstd;
  void* fch;      // (N, FCHl) gpt2 pre-GELU; llama gate|up interleaved
  void* fch_act;  // (N, Fl)
  void* res3;     // (Ns, C)  block output
  // A MoE MLP (transformer_moe.cc; nullptr elsewhere), k = top_k, E experts, Fe (Fs) this rank's
  // units of an expert (of the shared expert): the router's fp32 probabilities (N, E) and each
  // row's logsumexp (N); the choices (N, k) int32 and their gates (N, k) fp32; the plan of the
  // Nm rows this rank dispatches (every row, or with whole experts its own, Nm_): counts (E), pos
  // (N, k; rows mr0_ on), rows (Nm·k) int32; the rows this rank's experts take (R: Nm·k, or the
  // most the expert-parallel group can send them), grouped by expert: their input (R, C), gate|up
  // (R, 2Fe) and activation (R, Fe); the experts' output for this rank's rows in the plan's order
  // (Nm·k, C), or under the all-gather dispatch the outputs of this rank's experts (R, C), with
  // the group's plans ag_pos (ep·Nm, k: each choice's row among them, -1 elsewhere) and gates
  // ag_gates (ep·Nm, k). The shared expert's gate|up and activation are
  // fch and fch_act (2Fs and Fs wide), its output sout (N, C); its gate sgate (N) fp32.
  float* router_probs;
  float* router_lse;
  int32_t *moe_top, *moe_counts, *moe_pos, *moe_rows;
  float* moe_gates;
  void *xp, *efch, *eact, *ey, *sout;
  float* sgate;
  int32_t* ag_pos;
  float* ag_gates;
};

// The output gradients a deferred weight-gradient backward needs, per block.
struct BlockStash {
  void* dproj;       // (N, C) gradient of the attention projection's output (all rows)
  void* dqkv;        // (N, QKVl)
  void* dln1;        // (Ns, C) gradient of the first norm's output
  void* dfc2;        // (N, C)
  void* dfch;        // (N, FCHl)
  void* dln2;        // (Ns, C)
  void* dqk_gains;   // the q/k norms' gains' gradients, grad dtype (qk_norm only)
  void* dpost_attn;  // (Ns, C) the post norms' output gradients (post norms only)
  void* dpost_mlp;
  // A MoE MLP: the experts' output and gate|up gradients (R, C) and (R, 2Fe) (the rows this
  // rank's experts take), the router logits' (N, E) and the shared gate's logits' (N), fp32; dfc2
  // holds the shared expert's output gradient, dfch its gate|up's.
  void *dey, *defch;
  float *dlogits, *dsgate;
};

// What only the input-gradient backward reads, per block: QKV (N, QKVl), the attention
// probabilities (B, heads_l, T, T) and the MLP's pre-activation (N, FCHl).
struct InputSlot {
  bool busy = false;
  std::vector<std::array<void*, 3>> blocks;
};

struct Slot {
  int mb = -1;              // micro-batch held, -1: free
  int input = -1;           // its InputSlot while the input-gradient backward has not run
  bool eval = false;        // held by an evaluation forward: free for the next forward
  bool input_done = false;  // backward_input ran (defer_weight)
  int32_t *tokens = nullptr, *targets = nullptr;  // (N)
  // Document masking: the forward's document starts (B, seq), in device memory; read by every
  // pass of the micro-batch where `documents` (select_documents).
  int32_t* doc_begin = nullptr;
  bool documents = false;
  void* encoded = nullptr;        // (Ns, C) the chunk's input hidden states
  std::vector<BlockActs> blocks;  // the chunk's blocks
  void* lnf = nullptr;            // (Ns, C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
  void* logits = nullptr;   // (N, Vl): logits; dlogits, in place, once the backward has run
  float* losses = nullptr;  // (N)
  float* ce = nullptr;      // (3, N) cross-entropy row max, Σ exp, target logit (for the backward)
  float dloss = 0;          // the forward's loss scale, for the backward's dlogits
  int64_t counted = 0;
  // defer_weight only
  std::vector<BlockStash> stash;
  void* dlnf = nullptr;  // (Ns, C) gradient of the final norm's output
  void* denc = nullptr;  // (Ns, C) gradient of the embedding's output
  // Partitioned checkpoints: per block, this rank's shard of the block's input (nullptr where
  // the input is kept whole).
  std::vector<void*> shard;
  // MoE blocks, on the host (sized at construction): the rows routed to each expert (E), the
  // balancing statistics (B, 2, E) (moe_balance_stats, summed over the context group) and the
  // router rows' logsumexp (N, for the z-loss); and the balancing gradient's weight per sequence.
  std::vector<std::vector<int64_t>> expert_counts;
  // Expert parallelism, per block: the rows each rank of the group sent to each of this rank's
  // experts (ep, El), and their sums per expert (El).
  std::vector<std::vector<int64_t>> ep_counts, ep_rows;
  std::vector<std::vector<float>> moe_stats, moe_lse;
  float aux_scale = 0;
};

class TransformerImpl final : public Transformer {
 public:
  // count_only: size the arenas and stop (arena_bytes() reads them): nothing is allocated.
  TransformerImpl(const ModelSpec& spec, DType pt, DType gt, void* params, void* grads, int B,
                  int T, const ChunkOptions& chunk, tp::Group* tp, bool count_only = false);
  ArenaBytes arena_bytes() const {
    return {acts_.used(), work_.used(), ckpts_.used(), chunk_.recompute.host};
  }

  double forward(int mb, const int32_t* tokens, Tensor hidden, const int32_t* targets, float dloss,
                 bool train, UnitHook* hook, const int32_t* doc_begin) override;
  Tensor output(int mb) const override;
  Tensor hidden_view(void* p) const override { return hid(p); }
  bool defers_weight() const override { return chunk_.defer_weight; }
  Tensor backward_input(int mb, Tensor dout, UnitHook* hook) override;
  void backward_weight(int mb, UnitHook* hook) override;
  Tensor logits(int mb) const override { return mat(slot_of(mb).logits, pt_, N_, Vl_); }
  int64_t counted_tokens(int mb) const override { return slot_of(mb).counted; }
  double take_tp_seconds() override {
    const double s = tp_->seconds();
    tp_->reset_seconds();
    return s;
  }
  double take_recompute_seconds(std::vector<double>* per_block) override;
  double take_ep_seconds() override {
    const double s = ep_seconds_;
    ep_seconds_ = 0.0;
    return s;
  }
  void set_aux_scale(float per_sequence) override { aux_scale_ = per_sequence; }
  double take_aux_loss() override {
    const double a = aux_sum_;
    aux_sum_ = 0.0;
    return a;
  }
  void take_expert_tokens(std::vector<double>& tokens) override;
  void set_expert_bias(const float* bias) override { expert_bias_ = bias; }

 private:
  void places();
  void layout();  // carves the arenas (twice: to size them, then to point into them)
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
  // A block's saved attention state: what the device's backend keeps (ops::attention_saved).
  Tensor att_view(void* p) const { return vec(p, att_saved_.dtype, att_saved_.numel); }
  Tensor ids(int32_t* p) const { return Tensor(p, DType::I32, {N_}, dev_); }
  // Vocabulary columns [row_begin, Vl) of every row of the logits (row stride Vl).
  Tensor logit_cols(const Slot& s, int64_t row_begin) const {
    return Tensor(at(s.logits, pt_, row_begin), pt_, {N_ * Vl_ - row_begin}, dev_);
  }
  // The dlogits of a vocabulary unit's columns, as the head's products read them, and their row
  // stride: computed (fresh, where they go to fp32) or, with `compute` false, those the input
  // backward left in place.
  std::pair<Tensor, int64_t> unit_dlogits(const Slot& s, const UnitSpec& unit, bool compute);
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
  // project: through the last projection and residual into res3 (a recompute stops before).
  void mlp_forward(Slot& s, int l, UnitHook* hook, bool project = true);
  // A MoE MLP (transformer_moe.cc), from its norm's output: forward into res3 (project) or, for
  // a recompute, what the backward reads only; backward into dln (the norm output's gradient);
  // the deferred weight half.
  // The MLP unit's parameters are P (acquired by the caller, released here before the experts'
  // unit is acquired); the backward acquires the experts' unit, then the MLP's, and runs the
  // norm's backward too; the weight half reports both units done.
  void moe_forward(Slot& s, int l, void* P, UnitHook* hook, bool project);
  void moe_backward(Slot& s, int l, UnitHook* hook, const BlockStash& st, void* dln, bool fuse);
  void moe_weight(Slot& s, int l, UnitHook* hook, const BlockStash& st);
  void moe_replicated_weight(int l, void* G, Tensor dlogits, Tensor dsgate, Tensor x);
  std::pair<int64_t, int64_t> moe_weight_rows() const;
  std::pair<int64_t, int64_t> moe_input_rows() const;
  double moe_aux_loss(const Slot& s) const;
  double balance_norm() const;
  int64_t kept_rows(const Slot& s, int l) const;  // this rank's rows block l's experts took
  // The rows this rank's experts took in block l, and per expert (El): kept_rows and the plan's
  // counts without expert parallelism.
  int64_t local_rows(const Slot& s, int l) const;
  const int64_t* local_counts(const Slot& s, int l) const;
  // Expert parallelism: the count exchange after block l's plan (fills s.ep_counts, s.ep_rows);
  // this rank's kept rows (plan order, `width` wide) to the experts' ranks, grouped by expert
  // into `local`; and back.
  void ep_exchange_counts(Slot& s, int l);
  void ep_to_experts(const Slot& s, int l, const void* plan_rows, void* local, int64_t width);
  void ep_from_experts(const Slot& s, int l, const void* local, void* plan_rows, int64_t width);
  Tensor ep_permutation(const Slot& s, int l, bool to_experts);
  // The all-to-all's two halves: plan_rows sent (issued; counts exchanged before), and received
  // into `local` grouped by expert.
  comm::Handle ep_send(const Slot& s, int l, const void* plan_rows, int64_t width);
  void ep_receive(const Slot& s, int l, comm::Handle& sent, void* local, int64_t width);
  // The all-gather dispatch (transformer_moe.cc): the group's counts, tokens, plans and gates
  // gathered (issued), then this rank's experts' rows (a.xp, a.ag_pos); the weighted sum back
  // over the group; its backward.
  comm::Handle ep_gather_start(const BlockActs& a, const Tensor& x);
  void ep_gather_finish(Slot& s, int l, comm::Handle& gathered);
  void ep_gather_combine(const BlockActs& a, int64_t rows, void* y, const float* gates, Tensor out);
  void ep_gather_combine_backward(const Slot& s, int l, const Tensor& dy, void* dey,
                                  const Tensor& dgates);
  void ep_set_counts(const Slot& s, int l, int64_t width, bool to_experts);
  Tensor moe_coef(const Slot& s, int l);
  bool balanced() const { return moe_ && cfg_.moe.router_aux_loss_coef > 0; }
  // Activation checkpointing (transformer.cc).
  bool full_recompute(int l) const { return ckpt_[size_t(l - l0_)] != 0; }
  // After block l's forward (or the embedding's, l = l0 - 1): the next block's checkpoint shard.
  void keep_shard(Slot& s, int l);
  // A fully recomputed block's forward again from its checkpoint; returns the block's input.
  const void* recompute(Slot& s, int l, UnitHook* hook);
  // Selective recompute: block l's attention probabilities again from its QKV.
  void recompute_attention(const BlockActs& a, int l);
  void sync_boundary() const;
  double head_forward(Slot& s, const void* x, float dloss, bool train, UnitHook* hook);
  // Input-gradient halves; each runs its weight half too unless the chunk defers it.
  void head_backward(Slot& s, UnitHook* hook);
  void mlp_backward(Slot& s, int l, UnitHook* hook);
  void attn_backward(Slot& s, int l, const void* x, UnitHook* hook);
  void embed_backward(Slot& s, UnitHook* hook);
  // The attention core (transformer_layers.cc): from a.qkv (after RoPE) the output out (N, Hl)
  // and the saved state a.att; out nullptr: the saved state only (selective recompute). Under
  // context parallelism its own path (transformer_context.cc): under Ulysses a.qkv has been
  // exchanged into the heads' layout in place (every row of this rank's share of the groups,
  // attn_forward), which the backward and a selective recompute read; under ring attention the
  // keys and values go around the group.
  // l: the block, whose layer kind (sliding or full attention) sets the window.
  void attention_core_forward(const BlockActs& a, int l, void* out);
  // dqkv (N, QKVl) from dout (N, Hl, overwritten under Ulysses) and the saved state.
  void attention_core_backward(const BlockActs& a, int l, Tensor dout, Tensor dqkv);
  // The attention shapes of block l (its window).
  void select_layer(int l);
  // The attention shapes of slot s's micro-batch (its documents, or none): at the start of each
  // of its passes, since the shapes are the chunk's and several micro-batches are in flight.
  void select_documents(const Slot& s);
  // The documents of slot s for the kernels: its doc_begin, or nullptr.
  const int32_t* documents(const Slot& s) const { return s.documents ? s.doc_begin : nullptr; }
  // The q/k norms (qk_norm "head"): a.qkv from a.qkv_in; and the input gradient dqkv (N, QKVl)
  // from dqk, the gradient of their output, with the gains' gradients into dwq, dwk (+=).
  void qk_norm_forward(const BlockActs& a, int l, void* P);
  void qk_norm_backward(const BlockActs& a, int l, void* P, Tensor dwq, Tensor dwk, Tensor dqk,
                        Tensor dqkv);
  ops::QkNorm qk_norm_options() const;
  // The input a sublayer's first projection reads: its norm's output, or (no pre norms) the
  // residual stream itself.
  void* attn_input(const BlockActs& a, const void* x) const {
    return cfg_.pre_norm() ? a.ln1 : const_cast<void*>(x);
  }
  void* mlp_input(const BlockActs& a) const { return cfg_.pre_norm() ? a.ln2 : a.res2; }
  // A post norm's backward (role r, its input x and statistics): the gradient of its input into
  // d_post_ from dres_ (the gradient of its output, which the residual also carries); with fuse
  // the gain's gradient too, else dres_ is kept in `stash` for the weight half.
  Tensor post_norm_backward(int l, ParamRole r, void* P, void* G, const void* x, const float* rstd,
                            void* stash, bool fuse);
  void context_attention_forward(const BlockActs& a, void* out);
  void context_attention_backward(const BlockActs& a, Tensor dout, Tensor dqkv);
  bool ring() const {
    return chunk_.context.on() && chunk_.context.impl == ContextOptions::Impl::Ring;
  }
  bool ulysses() const {
    return chunk_.context.on() && chunk_.context.impl == ContextOptions::Impl::Ulysses;
  }
  // Ulysses' exchanges, in place on p: (B, T/cp rows, groups × width) of this rank's rows ↔
  // (B, T rows, groups/cp × width) of its share of the groups. width: a group's elements.
  void ulysses_to_heads(void* p, int64_t width);
  void ulysses_to_rows(void* p, int64_t width);
  comm::Handle pass_kv(int s, int cur, int64_t kvn);  // a ring step's key/value exchange
  ops::AttentionShape ring_shape(int s) const;        // a ring step's (the keys' positions)
  void ring_forward(const BlockActs& a, void* out);
  void ring_backward(const BlockActs& a, Tensor dout, Tensor dqkv);
  // Weight halves from the tensors the input halves leave.
  void head_weight(Slot& s, UnitHook* hook);
  void final_norm_weight(Slot& s, const void* x, void* dy, UnitHook* hook);
  void mlp_weight(Slot& s, int l, UnitHook* hook);
  void attn_weight(Slot& s, int l, const void* x, UnitHook* hook);
  // dres: the gradient of the layer's output (Ns, C).
  Tensor row_parallel_backward(int l, ParamRole w, ParamRole b, void* P, void* G, void* stash,
                               Tensor x, Tensor dx, Tensor dres, bool fuse);
  void row_parallel_weight(int l, ParamRole w, ParamRole b, void* G, Tensor dy, Tensor x);
  void sp_bias_grad(Tensor db, Tensor dy);
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
  // A norm's output ln (Ns, C) as a column-parallel linear reads it, (N, C): copy_to_region's
  // forward (identity), or gather_from_sp_region's (all-gathered into gath_) under sequence
  // parallelism. The weight-gradient halves call it again rather than keep the gathered rows
  // (as Megatron's column-parallel linear re-gathers its input in backward): its backward half
  // is column_parallel_backward's (head_backward's for the head).
  Tensor column_input(void* ln);
  const std::vector<int>& output_units() const { return tied_ ? vocab_ : output_; }

  const ModelSpec& spec_;
  const ModelConfig& cfg_;
  const TpLayout& tp_layout_;
  DType pt_, gt_;
  Device dev_;
  tp::Group own_tp_;
  tp::Group* tp_;
  bool sp_ = false;
  int B_, T_;
  int seq_;  // the whole sequence's length: T, or T·cp under context parallelism
  int64_t N_, Ns_;
  bool gpt2_ = true, tied_ = true, qk_norm_ = false;
  ops::Rope rope_;        // the RoPE families' frequencies (model/rope.h)
  ops::Rope rope_local_;  // the sliding layers' where they have a base of their own (Gemma 3)
  const ops::Rope& rope_of(int l) const {
    return cfg_.rope_local_theta > 0 && cfg_.sliding(l) ? rope_local_ : rope_;
  }
  // The q/k norms' gain elements this rank holds: (hd) each per head; its heads' slices whole.
  int64_t qk_gains() const {
    const int64_t hd = att_shape_.hd;
    return cfg_.qk_norm == "whole" ? int64_t(tp_layout_.groups) * (tp_layout_.rep + 1) * hd
                                   : 2 * hd;
  }
  int64_t C_ = 0, Vl_ = 0, Fl_ = 0, FCHl_ = 0, QKVl_ = 0, Hl_ = 0;
  ops::AttentionShape att_shape_;  // this rank's rows (RoPE's positions under context parallelism)
  // What the attention kernels see: under Ulysses every row of T and groups/cp groups; otherwise
  // att_shape_.
  ops::AttentionShape core_att_shape_;
  ops::AttentionSaved att_saved_;
  std::vector<int32_t> pos_;  // context parallelism: the positions of this rank's T rows
  std::vector<std::vector<int32_t>> ring_pos_;  // ring attention: every context rank's positions
  ChunkOptions chunk_;
  bool count_only_ = false;
  bool has_embed_ = false, has_head_ = false;
  int l0_ = 0, l1_ = 0;  // the chunk's blocks [l0, l1)

  void* P_;  // flat parameters, or nullptr (every pass places them through its hook)
  void* D_;  // flat gradients, or nullptr
  std::vector<int> vocab_, output_, attn_, mlp_;
  std::vector<int> experts_;  // by block: its Experts unit, or -1
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
  std::vector<std::vector<Partial>> partials_;  // by unit
  std::vector<char> partial_params_;  // by param index (each in one unit): computed in scratch

  Arena acts_, work_;
  // Activation checkpointing: which of the chunk's blocks are fully recomputed; whether their
  // checkpoints are sharded over tp (k elements each) and where the checkpoints live.
  std::vector<char> ckpt_;
  bool shard_ = false;
  int64_t shard_elems_ = 0;
  Arena ckpts_;
  BlockActs rc_{};                       // the recompute set (shared by every slot)
  void* whole_[2] = {nullptr, nullptr};  // (tp·k) a partitioned checkpoint's whole, two in turn
  std::vector<double> rc_seconds_;       // by chunk block, since the last take

  std::vector<Slot> slots_;
  std::vector<InputSlot> input_slots_;
  void take_input_slot(Slot& s);
  void free_input_slot(Slot& s);
  // Workspace (shared by every slot). d_wide_out_ (N, max(QKVl, FCHl)): the gradient of a wide
  // projection's output (attn.qkv's, mlp.fc's or gate_up's); d_proj_in_ (N, max(Fl, Hl)): the
  // gradient of the input of attn.proj or mlp.down (the attention core's output, the MLP's
  // activation).
  void *dres_ = nullptr, *dc_ = nullptr, *d_wide_out_ = nullptr, *d_proj_in_ = nullptr;
  void* d_qk_ = nullptr;      // (N, QKVl) the q/k norms' output gradient (qk_norm)
  float* qk_sums_ = nullptr;  // (N, 2) the whole q/k norms' sums over the tensor-parallel group
  void* d_post_ = nullptr;    // (Ns, C) a post norm's input gradient
  float embed_scale_ = 1.0f;  // sqrt(hidden), rounded to the parameter dtype (embed_scale)
  void *gath_ = nullptr, *part_ = nullptr;  // (N, C) each
  float* dlnf32_ = nullptr;                 // (N, C) fp32 output gradient of the final norm
  float *norm_scratch_ = nullptr, *att_scratch_ = nullptr;
  float* ce_all_ = nullptr;  // (tp, N) the ranks' row maxima
  // Context parallelism. Ulysses: the all-to-all's send and receive buffers (N·QKVl each).
  // Ring: the keys and values in hand and those arriving (N, groups·2·hd each), their fp32
  // gradients likewise, the fp32 output and query gradients (N, Hl) and the rows' Σ dO∘O.
  void *ulysses_send_ = nullptr, *ulysses_recv_ = nullptr;
  void* kv_[2] = {nullptr, nullptr};
  float* dkv_[2] = {nullptr, nullptr};
  float *o32_ = nullptr, *dq32_ = nullptr, *delta_ = nullptr;
  // Where gemm would copy bf16/fp16 dlogits into fp32 (either product of a vocabulary unit too
  // small to widen them as it packs), the backward writes them in fp32 here instead, (N, the
  // largest unit's rows): the same values without conversion passes over N·Vl elements.
  bool widen_dlogits_ = false;
  float* dlogits32_ = nullptr;
  void* scratch_ = nullptr;  // (largest unit) gradients of partial parameters, grad dtype
  // Fused-mode output gradients (defer_weight off): one set reused by every block.
  BlockStash fused_;
  // A mixture of experts (cfg_.moe): E experts, top_k, this rank's units of each expert and of
  // the shared expert, and the N·k rows the experts take. Workspace: a partial output (N, C)
  // (a recompute's, or the row-parallel sum's under SP); the experts' input, activation, output
  // and gate|up gradients; the shared expert's output gradient (N, C); the gates' and the shared
  // gate's gradients (N·k + N) fp32, the router logits' (N, E) fp32, the balancing gradient
  // (B, E) and statistics (B, 2, E) fp32 (and their host copies).
  bool moe_ = false;
  int E_ = 0, K_ = 0;
  int64_t Fel_ = 0, Fsl_ = 0, NK_ = 0;
  // The rows this rank's routed experts' dispatch takes: every row (Nm_ = N), or with whole
  // experts beside tensor parallelism (spec_.ep.whole: whole_experts_) its own sequence-parallel
  // block, rows [mr0_, mr0_ + Nm_); NKm_ = Nm_·k.
  bool whole_experts_ = false;
  int64_t Nm_ = 0, mr0_ = 0, NKm_ = 0;
  Tensor mine(const Tensor& t) const;  // rows [mr0_, mr0_ + Nm_) of an (N, ...) view
  // Expert parallelism over ep_size_ ranks (comm ep_): this rank's El_ experts from e0_; R_ the
  // most rows they can take (Nm·k without it). Workspace: this rank's kept rows in the plan's
  // order (Nm·k, C) as sent and received back, the rows received (R, C) in the senders' order, the
  // experts' output (R, C); the permutation between the two orders (R) on the device and the
  // host, and the exchange's counts.
  int ep_size_ = 1;
  int El_ = 0;
  int64_t e0_ = 0, R_ = 0;
  comm::Communicator* ep_ = nullptr;
  void *ep_send_ = nullptr, *ep_recv_ = nullptr, *ep_out_ = nullptr;
  int32_t* ep_idx_ = nullptr;
  std::vector<int32_t> ep_idx_host_, ep_counts32_;
  // The all-gather dispatch (spec_.ep.all_gather): every rank's tokens (or the output's
  // gradient), then the partial outputs (or input gradients) of every rank's tokens (ep·Nm, C);
  // the gates' gradients of every rank's choices (ep·Nm·k); the group's plans on the host.
  bool ep_gather_ = false;
  void* ep_all_ = nullptr;
  float* ep_dgates_ = nullptr;
  std::vector<int32_t> ep_pos_host_, ep_gathered_counts_;
  std::vector<int64_t> ep_first_, ep_off_;  // ep_gather_finish's (ep·El) and (E + 1)
  std::vector<size_t> ep_v_counts_;
  // Exposed time in the expert-parallel collectives since take_ep_seconds: blocking calls, and
  // the waits for those issued ahead.
  double ep_seconds_ = 0.0;
  template <typename F>
  void timed_ep(F&& collective);        // an expert-parallel collective, timed into ep_seconds_
  const float* expert_bias_ = nullptr;  // set_expert_bias; copied to moe_bias_ (E) per forward
  float* moe_bias_ = nullptr;
  ops::MoeRoute route_;
  ops::MoeCapacity capacity_;
  float aux_scale_ = 0.0f;              // set_aux_scale
  double aux_sum_ = 0.0;                // take_aux_loss
  std::vector<int64_t> expert_tokens_;  // take_expert_tokens: (chunk blocks, E)
  void *moe_part_ = nullptr, *dxp_ = nullptr, *deact_ = nullptr, *dey_ = nullptr;
  void *defch_ = nullptr, *dshared_ = nullptr;
  float *dgw_ = nullptr, *dlogits_ = nullptr, *moe_coef_ = nullptr, *moe_stats_ = nullptr;
  std::vector<int32_t> counts32_;
  std::vector<float> coef_host_;
};

}  // namespace strata::model_detail
