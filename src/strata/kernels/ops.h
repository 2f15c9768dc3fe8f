// The one kernel interface of strata (DESIGN.md §10): the model, ZeRO, the optimizer and the
// engine reach every computation through these functions, never a backend directly. Each takes
// typed views (core/tensor.h) and dispatches on their device, then on their dtypes, to a backend:
// kernels/cpu, or kernels/cuda for views on a GPU (where it is built).
//
// Conventions. Matrices are row-major; a weight is (out_features, in_features). "+=" means the
// kernel accumulates into its output; everything else overwrites. A view may be empty
// (data == nullptr) where an argument is marked optional. All views of one call live on one
// device. S is the activation/parameter dtype (fp32, bf16, fp16); gradients of parameters are in
// G (fp32 or S); statistics (mean, rstd, losses, scratch) are fp32. Results never depend on the
// thread count.
//
// Layouts the model fixes (param_spec.h):
// - fused QKV rows, per key/value group g: the group's `rep` query heads, then its key head,
//   then its value head, each hd wide; the attention input is (N, groups·(rep+2)·hd).
// - llama's fused gate|up rows interleave gate and up: row 2f is gate f, row 2f+1 is up f; the
//   SwiGLU input is (N, 2F) with columns (gate f, up f) adjacent.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/stream.h"
#include "strata/core/tensor.h"

namespace strata::ops {

// --- dry runs -------------------------------------------------------------------------------
// While a DryRun exists on this thread, every call below returns at once without touching memory
// (a value it returns is 0), and so do the tensor-parallel collectives (tensor_parallel/
// mappings.h). Code above the interface then runs for its control flow alone: ZeRO-3 learns the
// order in which the model's passes read its units by running them so (model/transformer.h
// param_trace), instead of keeping a second copy of that order by hand.
class DryRun {
 public:
  DryRun();
  ~DryRun();
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;
};
bool dry_run();

// --- devices --------------------------------------------------------------------------------
// The number of devices of this kind visible to this process: 1 for the CPU; for CUDA the visible
// GPUs (0 where strata is built without the CUDA backend, or no driver or GPU is present).
int device_count(Device device);
// Makes device `ordinal` of its kind the one this process computes on (one rank per GPU: the
// local rank's), creating its streams; before the first allocation on it. Nothing to do for the
// CPU. An error naming the fix where the device does not exist or no such backend is built.
void init_device(Device device, int ordinal);

// --- memory ---------------------------------------------------------------------------------
// Waits until every operation issued on `device` has finished (the CPU backend runs each one to
// completion before it returns: nothing to wait for).
void synchronize(Device device);
void fill_zero(Tensor t);
// dst = src, converting dtypes (same numel).
void copy(Tensor dst, Tensor src);
// rows × cols elements, row r of dst at element r·dst_ld and of src at r·src_ld (same dtype,
// apart): blocks of rows and columns moved between layouts (Ulysses' exchanges).
void copy_2d(Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows, int64_t cols);
// dst = dst.nbytes() bytes at host address src (same dtype): host data (token ids) onto dst's
// device.
void copy_from_host(Tensor dst, const void* src);
// dst = src.nbytes() bytes of src's device memory, at host address dst (same dtype): results,
// checkpoints and exports read back, pipeline messages staged for the wire.
void copy_to_host(void* dst, Tensor src);
// t's address for host code where its device's memory is the host's (the plain CPU device), so
// that file and network I/O may read and write it in place; nullptr where it is not (a GPU, the
// guarded test device): stage through host memory with the copies above.
void* host_address(Tensor t);
// y += x (same numel and dtype): the residual connection; accumulation in fp32, rounded once.
void add_inplace(Tensor y, Tensor x);
// y (M, N) += b (N) on every row, in fp32, rounded once (as linear_forward adds its bias).
void add_bias(Tensor y, Tensor b);
// t *= s.
void scale_inplace(Tensor t, float s);
// Σ t[i]² in fp64 (any float dtype); +inf/NaN propagate.
double sum_squares(Tensor t);
// Σ t[i] in fp64 of an fp32 tensor.
double sum(Tensor t);

// --- matmul ---------------------------------------------------------------------------------
// BLAS-style general product, row-major: C (M, N) = alpha · op(A) · op(B) (+ C when accumulate),
// op(X) = X or Xᵀ; lda/ldb/ldc are the row strides of A, B, C as stored. C's dtype may be fp32
// with half operands (fp32 accumulation, result kept in fp32).
struct Gemm {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f;
  bool accumulate = false;
};
void gemm(Tensor c, Tensor a, Tensor b, const Gemm& g);
// Whether a gemm of `rows` rows on `device` converts operands of dtype t into an fp32 copy first
// (on the CPU: half precision where it has no native kernel, in a product too small to widen them
// as it packs; never on a GPU, whose products take half operands as they are): a caller that can
// produce them in fp32 directly saves that pass.
bool gemm_widens(Device device, DType t, int64_t rows);

// y (M, N) = x (M, K) · wᵀ (w: (N, K)) + b (N, optional).
void linear_forward(Tensor y, Tensor x, Tensor w, Tensor b);
// dx (M, K) = dy (M, N) · w (N, K) (+= dx when accumulate).
void linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate);
// dw (N, K) += dyᵀ · x; db (N) += Σ_rows dy. Either may be absent (x too, without dw).
void linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x);
// Both at once (dx overwritten; dx optional): the same results as the two above, faster where
// dy is widened once for both products.
void linear_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w);

// --- normalisation ----------------------------------------------------------------------------
// out, x (N, C); w, b (C); mean, rstd (N) fp32 saved for backward.
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                       float eps);
// RMSNorm's gain is (w_offset + w): 0 (Llama), or 1 (Gemma, whose stored w starts at 0).
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset = 0.0f);
// fp32 scratch a norm backward needs for (N, C).
size_t norm_backward_scratch_floats(int64_t N, int64_t C);
// Fused: dx (N, C) += input gradient; dw, db (C) += gain and bias gradients (db absent for rms).
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                        Tensor w, Tensor mean, Tensor rstd);
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor w,
                      Tensor rstd, float w_offset = 0.0f);
// Split: the input gradient alone (dx +=), and the parameter gradients alone (dw, db +=); the
// two give bit for bit what the fused form gives.
void layernorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor mean, Tensor rstd);
void layernorm_backward_weight(Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                               Tensor mean, Tensor rstd);
void rmsnorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor rstd,
                            float w_offset = 0.0f);
void rmsnorm_backward_weight(Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor rstd);

// --- attention --------------------------------------------------------------------------------
// Causal self-attention over the grouped QKV layout above. qkv (B·T, groups·(rep+2)·hd);
// out (B·T, groups·rep·hd) with heads in order (g, r); att what backward needs (attention_saved
// below; an empty out: att only, as selective recompute needs it).
struct AttentionShape {
  int B = 0, T = 0, groups = 0, rep = 0, hd = 0;
  // RoPE: the position of each of a sequence's T rows (context parallelism holds parts of longer
  // sequences; CPU only), or nullptr: row t is position t.
  const int32_t* pos = nullptr;
  // The ring pieces below: the positions of kv's T rows (the rank they came from), which a
  // sliding window needs when pos is given; nullptr: those of pos.
  const int32_t* kv_pos = nullptr;
  // What a model family changes (model/model_config.h), as transformers' eager attention: the
  // scores q·k are multiplied by `scale` (0: 1/sqrt(hd)); soft-capped, softcap·tanh(s/softcap),
  // where softcap > 0 (Gemma 2), before the mask; and a query at position i sees the keys at
  // positions j with i − window < j ≤ i where window > 0 (itself and window − 1 before it: Mistral,
  // Gemma's sliding layers), every j ≤ i where window is 0. Positions are absolute: pos above,
  // and q0/k0 in the ring pieces below.
  float scale = 0.0f;
  float softcap = 0.0f;
  int window = 0;
  // Document masking (data.document_mask: packed documents that do not see each other), or
  // nullptr: every sequence is one document. doc_begin is (B, seq) on the tensors' device, seq
  // the whole sequence's length (T, or T·cp under context parallelism): for each absolute
  // position p of sequence b, the position its document starts at (0 for the first). A query at
  // p sees only keys at j >= doc_begin[b·seq + p] (with the causal and window rules above), and
  // RoPE rotates it by its position in its document, p − doc_begin[b·seq + p].
  const int32_t* doc_begin = nullptr;
  int seq = 0;
};
void attention_forward(Tensor out, Tensor att, Tensor qkv, const AttentionShape& s);
// What `att` holds is the backend's: CUDA, and the CPU on its tiled path, keep flash-style each
// query row's log-sum-exp of its scaled scores (B, heads, T) in fp32, and their backward
// recomputes the probabilities from it; the CPU's materialized path keeps the probabilities
// (B, heads, T, T) in the activations' dtype. The CPU's path is kernels::attention_path(T, act)
// (STRATA_ATTENTION). Callers size and type `att` by this.
struct AttentionSaved {
  DType dtype = DType::F32;
  int64_t numel = 0;
};
AttentionSaved attention_saved(Device device, DType act, const AttentionShape& s);
// fp32 scratch attention_backward needs on `device` (the CPU's materialized path: the
// probabilities' gradients, and with a soft-cap the recomputed raw scores; CUDA and the CPU's
// tiled path: none, their backward recomputes tile by tile).
size_t attention_backward_scratch_floats(Device device, DType act, const AttentionShape& s);
// dqkv (overwritten) from dout.
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const AttentionShape& s);
// Rotary embedding, in place, on the query and key heads of the grouped layout (value heads are
// left alone); row n of the (B·T) rows is at position n % T (pos[n % T] with pos), and rotates by
// it, or with documents by its position in its document (doc_begin above).
// Ring attention's pieces (context parallelism, CPU only; kernels/cpu/attention_ring.h). s is
// the shape of this rank's qkv: B, T = its rows of each sequence, groups, rep, hd. kv holds the
// keys and values of some rank's qkv, (B·T, groups·2·hd). A block: query rows [q0, q0+Tq) of
// each sequence against key rows [k0, k0+Tk) of kv's; causal: the same positions (query i sees
// keys j <= i), else every key; a window and documents (by pos and kv_pos) mask as above. The
// forward merges into o (fp32, (B·T, heads·hd)) and lse (fp32, (B, heads, T), -inf where nothing
// is merged yet); the backward, given the final lse and delta (fp32, (B, heads, T), Σ dout∘out per
// row), accumulates fp32 dq (B·T, heads·hd) and dkv.
void attention_lse_clear(Tensor lse);  // -inf: nothing merged yet
void attention_pack_kv(Tensor kv, Tensor qkv, const AttentionShape& s);
void attention_unpack_dqkv(Tensor dqkv, Tensor dq, Tensor dkv, const AttentionShape& s);
void attention_block_forward(Tensor o, Tensor lse, Tensor qkv, int q0, int Tq, Tensor kv, int k0,
                             int Tk, const AttentionShape& s, bool causal);
void attention_delta(Tensor delta, Tensor dout, Tensor out, const AttentionShape& s);
void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv, Tensor lse,
                              Tensor delta, int q0, int Tq, Tensor kv, int k0, int Tk,
                              const AttentionShape& s, bool causal);
// A rotary embedding's frequencies, built by the model from its RoPE settings (base, scaling:
// linear, llama3, yarn; model/rope.h): the first rotary_dim of each query and key head's hd
// values rotate in pairs (i, i + rotary_dim/2) by the angle pos·inv_freq[i], i < rotary_dim/2
// (transformers' rotate_half); the other hd − rotary_dim values pass through (partial rotary).
// cos and sin are multiplied by attention_factor (yarn's; 1 elsewhere). Plain data, passed to a
// GPU kernel by value.
struct Rope {
  static constexpr int kMaxHalf = 256;
  int rotary_dim = 0;
  float attention_factor = 1.0f;
  float inv_freq[kMaxHalf] = {};
};
// The unscaled rotary embedding of base theta over all of hd: inv_freq[i] = 1 / theta^(2i/hd) in
// fp32, as Hugging Face computes it.
Rope rope_default(int hd, float theta);
void rope_forward(Tensor qkv, const AttentionShape& s, const Rope& rope);
void rope_backward(Tensor dqkv, const AttentionShape& s, const Rope& rope);

// --- q/k normalisation ---------------------------------------------------------------------------
// RMS normalisation of the query and key heads in the grouped QKV layout; value heads are copied.
// Per head (Qwen3, Gemma 3): each query head and each key head over its hd values, with one (hd)
// gain wq for every query head and wk for every key head. Whole (OLMo 2): all of a row's query
// heads together, and all its key heads together, gains wq (groups·rep·hd) and wk (groups·hd),
// this rank's slices under tensor parallelism, where a row's heads are spread over the ranks and
// the sums below are all-reduced over the tensor-parallel group between the two calls.
// The gain is (w_offset + w) (Gemma's RMSNorm keeps 1 + w: w_offset 1; others 0). rstd fp32:
// (N, groups·(rep+1)) per head ((g, r) query heads, then the key heads g); (N, 2) whole.
struct QkNorm {
  bool per_head = true;
  float eps = 1e-6f;
  float w_offset = 0.0f;
  // Whole: the number of query and key values a row's norm spans (over every tensor-parallel
  // rank); ignored per head.
  int64_t q_width = 0, k_width = 0;
};
// Whole only: sumsq (N, 2) fp32 = each row's Σ q² and Σ k² over this rank's heads (then
// all-reduced over the tensor-parallel group, and passed to qk_norm_forward).
void qk_norm_sumsq(Tensor sumsq, Tensor qkv, const AttentionShape& s);
// out (N, groups·(rep+2)·hd) from qkv (not in place: the backward reads qkv); rstd saved for
// backward. sumsq: whole only, the reduced sums (empty per head).
void qk_norm_forward(Tensor out, Tensor rstd, Tensor qkv, Tensor wq, Tensor wk, Tensor sumsq,
                     const AttentionShape& s, const QkNorm& n);
// Whole only: dot (N, 2) fp32 = each row's Σ over this rank's query (key) values of
// dout·gain·x·rstd, which the input gradient needs over the whole row (all-reduced, then passed
// to qk_norm_backward).
void qk_norm_backward_dot(Tensor dot, Tensor dout, Tensor qkv, Tensor wq, Tensor wk, Tensor rstd,
                          const AttentionShape& s, const QkNorm& n);
// dqkv (overwritten, not dout; value heads copied from dout); dwq, dwk += the gains' gradients.
// dot: whole only, the reduced sums (empty per head).
void qk_norm_backward(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor dout, Tensor qkv, Tensor wq,
                      Tensor wk, Tensor rstd, Tensor dot, const AttentionShape& s, const QkNorm& n);

// --- activations --------------------------------------------------------------------------------
void gelu_forward(Tensor out, Tensor x);
void gelu_backward(Tensor dx, Tensor x, Tensor dy);  // dx overwritten
// x (N, 2F) interleaved (gate f, up f); out (N, F) = silu(gate) · up.
void swiglu_forward(Tensor out, Tensor x);
void swiglu_backward(Tensor dx, Tensor dy, Tensor x);  // dx (N, 2F) overwritten
// The same layout; out = gelu_tanh(gate) · up (GeGLU: Gemma's MLP, the tanh approximation
// 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))), as transformers' gelu_pytorch_tanh).
void geglu_forward(Tensor out, Tensor x);
void geglu_backward(Tensor dx, Tensor dy, Tensor x);  // dx (N, 2F) overwritten

// --- embeddings ----------------------------------------------------------------------------------
// tokens (N) int32. rows holds the embedding rows [row_begin, row_end) of the (global) table.
// out[n] = rows[tokens[n] - row_begin] for the tokens in that range; other rows untouched.
void embedding_forward(Tensor out, Tensor tokens, Tensor rows, int64_t row_begin, int64_t row_end);
// drows += the gradient of those rows from dout (N, C).
void embedding_backward(Tensor drows, Tensor dout, Tensor tokens, int64_t row_begin,
                        int64_t row_end);
// out (N, C) += wpe[pos[t]] for row n, t = (pos0 + n) % T (pos[t] = t without pos; pos: context
// parallelism's positions of a sequence's T rows, CPU only); dwpe += the same gathered from dout.
// doc_begin, seq: document masking's starts (AttentionShape above; row n is sequence
// (pos0 + n) / T): the row takes wpe[p − doc_begin[b·seq + p]], p its absolute position.
void position_forward(Tensor out, Tensor wpe, int64_t T, int64_t pos0, const int32_t* pos = nullptr,
                      const int32_t* doc_begin = nullptr, int64_t seq = 0);
void position_backward(Tensor dwpe, Tensor dout, int64_t T, int64_t pos0,
                       const int32_t* pos = nullptr, const int32_t* doc_begin = nullptr,
                       int64_t seq = 0);

// --- cross-entropy -------------------------------------------------------------------------------
// Gemma 2's final-logit soft cap: t = cap · tanh(t / cap) elementwise, in fp32 (cap > 0), on the
// logits (N, Vl) after the head's product and before any of the cross-entropies below; ce_dlogits
// with softcap = cap then gives the gradient w.r.t. the logits before the cap.
void softcap_inplace(Tensor t, float cap);
// Serial: logits (N, V); targets (N) int32 (< 0: ignored, loss 0). losses (N) fp32 (evaluation:
// the logits untouched).
void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets);
// Training in two halves, so that a backward can take the dlogits a vocabulary unit at a time:
// losses (N) and stats (3, N) = row max, Σ exp(logit − max), the target's logit (the layout the
// vocabulary-parallel steps below leave: gmax, then sums); later out (N, cols) with row stride
// ldo = the dlogits of logits' columns [c0, c0 + cols), rounded to the logits' dtype and stored
// in out's: the logits' own (out may be those columns) or fp32 (for products that run in fp32);
// dlogits = (softmax − onehot) · dloss, zero rows for ignored targets. v0 and valid as below (0
// and V for one rank). softcap > 0: the logits z are soft-capped (softcap_inplace) and the
// gradient is taken w.r.t. the raw logits before the cap, each dlogit times 1 − (z/softcap)²
// (z the capped value ce_dlogits reads, so out may still alias the logits); 0: no cap.
void cross_entropy_stats(Tensor losses, Tensor stats, Tensor logits, Tensor targets);
void ce_dlogits(Tensor out, int64_t ldo, Tensor logits, Tensor targets, Tensor stats, int64_t c0,
                int64_t cols, int64_t v0, int64_t valid, float dloss, float softcap = 0.0f);
// Vocabulary-parallel, in three local steps around two reductions over the tensor-parallel group.
// logits (N, Vl) hold global vocabulary columns [v0, v0 + Vl), of which the first `valid` exist
// (the rest are padding and never count).
//   1. rowmax (N) = max over the valid columns (−inf where none).      → max over ranks
//      (max_rows over the ranks' gathered maxima)
//   2. sums (2, N): row 0 Σ exp(logit − gmax) over valid columns, row 1 the target's logit where
//      this rank owns the target (else 0).                             → sum over ranks
//   3. losses (N) = log(sumexp) + gmax − target logit (0 for ignored targets). For training,
//      gmax then sums are the stats ce_dlogits takes (padding columns get 0).
void vocab_ce_max(Tensor rowmax, Tensor logits, int64_t valid);
void vocab_ce_sums(Tensor sums, Tensor logits, Tensor targets, Tensor gmax, int64_t v0,
                   int64_t valid);
void vocab_ce_finish(Tensor losses, Tensor targets, Tensor gmax, Tensor sums);

// out (N) = max over k of in (K, N), fp32.
void max_rows(Tensor out, Tensor in);

// --- optimizer ----------------------------------------------------------------------------------
// One step over n elements: master (fp32) updated in place, param (optional: absent when master is
// the parameter) = master rounded to its dtype; grad (G) is multiplied by grad_scale first.
struct AdamArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0, grad_scale = 1;
  int64_t step = 1;  // 1-based, for bias correction
  bool adamw = true;
};
void adam_step(Tensor master, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamArgs& a);
struct SgdArgs {
  float lr = 0, momentum = 0, weight_decay = 0, grad_scale = 1;
  bool nesterov = false;
  int64_t step = 1;
};
// buf: the momentum buffer (optional without momentum).
void sgd_step(Tensor master, Tensor param, Tensor grad, Tensor buf, const SgdArgs& a);

// --- mixture of experts --------------------------------------------------------------------------
// A MoE layer (model/model_config.h MoeConfig) routes each of N token rows to top_k of E experts,
// runs each expert on the rows routed to it (grouped, by the plan) and sums their outputs back.
struct MoeRoute {
  int experts = 0, top_k = 0;
  bool norm_topk_prob = true;
  // DeepSeek-V3's router (model_config.h MoeConfig): sigmoid scores, the choice among the
  // topk_groups of `groups` expert groups by score + bias, gates times `scale`.
  bool sigmoid = false;
  int groups = 1, topk_groups = 1;
  float scale = 1.0f;
};
// Softmax: probs (N, E) = softmax(logits (N, E)); top (N, k) int32: the top_k experts by
// probability, descending (equal ones: the lower expert first); gates (N, k): their
// probabilities, renormalised to sum to 1 with norm_topk_prob.
// Sigmoid: probs = sigmoid(logits), each expert's score; the choice c = score + bias (E, given
// or empty: 0); a group's value the sum of its two largest c; the topk_groups groups of the
// largest values (equal ones: the lower group) keep their c, the others' are 0; top the top_k
// experts by that (descending, the lower expert first); gates their scores, over their sum
// (+1e-20) with norm_topk_prob, times scale (transformers' DeepseekV3TopkRouter).
// lse (N) = each row's logsumexp of the logits. fp32 throughout.
void moe_route_forward(Tensor probs, Tensor lse, Tensor top, Tensor gates, Tensor logits,
                       const MoeRoute& r, Tensor bias = {});
// Token dropping (MoeRoute's capacity): each expert keeps at most `capacity` of the choices of
// each group of `group` consecutive rows, the most probable (by_probs, ties by row) or the first.
struct MoeCapacity {
  int64_t capacity = 0;  // 0: dropless
  int64_t group = 0;
  bool by_probs = true;
};
// The dispatch plan of top (N, k): counts (E) the rows routed to each expert; rows (N·k, the
// first Σ counts used) the token of each row sorted by expert (by token, then choice, within
// one); pos (N, k) where token n's j-th choice is among them, -1 where it was dropped. int32
// throughout; probs (N, E) fp32 rank the choices for a capacity by_probs.
void moe_plan(Tensor counts, Tensor pos, Tensor rows, Tensor top, Tensor probs, int experts,
              const MoeCapacity& capacity = {});
// Per sequence of T rows (N/T of them): stats (B, 2, E) fp32 = the choices of each expert, then
// the sum of each expert's probability over the sequence's rows; normalized: of each row's
// probabilities over their sum + 1e-20 (the sigmoid router's scores, DeepSeek-V3's
// sequence-wise balancing).
void moe_balance_stats(Tensor stats, Tensor probs, Tensor top, int64_t T, bool normalized = false);
// dlogits (N, E) fp32: the router logits' gradient from dgates (N, k), the gates' (for
// norm_topk_prob through the renormalisation), plus coef (B, E), optional, added to the gradient
// of the probabilities of every row of sequence b (the balancing loss's), plus the z-loss's
// z·lse² per row (z: its weight per row; 0: none). The sigmoid router's through its scores (the
// bias takes no gradient; z 0), coef then the gradient with respect to each row's normalised
// scores (moe_balance_stats' normalized).
void moe_route_backward(Tensor dlogits, Tensor dgates, Tensor probs, Tensor lse, Tensor top,
                        Tensor gates, Tensor coef, int64_t T, float z, const MoeRoute& r);
// out (R, C) row r = x (N, C) row rows[r].
void gather_rows(Tensor out, Tensor x, Tensor rows);
// out (N, C) row n = Σ_j w[n, j] · y[pos[n, j]] (w (N, k) fp32; absent: 1) over the choices not
// dropped (pos -1), summed in fp32 in j order and rounded once. y (R, C): the plan's rows (R =
// N·k), or any rows the positions index (the all-gather dispatch's: one rank's experts').
void moe_combine(Tensor out, Tensor y, Tensor pos, Tensor w);
// The combine's backward: dy[pos[n, j]] = w[n, j] · dout[n] (dy as y, (R, C); rows no position
// names untouched); dw (N, k) fp32 = <dout[n], y[pos]> (0 where dropped).
void moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor pos, Tensor w);
// A sigmoid-gated branch: g (N) fp32 holds the gate's logits, replaced by sigmoid(g); out (N, C)
// += g[n] · s[n].
void moe_gate_forward(Tensor out, Tensor s, Tensor g);
// Its backward: ds = g[n] · dout[n]; dg (N) fp32, the gradient of the gate's logit,
// = <dout[n], s[n]> · g[n]·(1 − g[n]) (linear in dout: partial sums sum).
void moe_gate_backward(Tensor ds, Tensor dg, Tensor dout, Tensor s, Tensor g);
// Grouped linear layers: x's rows in consecutive groups of counts[g] rows (host memory, summing
// to its rows), group g through weight g, rows [g·N, (g+1)·N) of w (G·N, K). One call per
// projection, however many groups are empty: on the CPU one grouped product whose threads split
// all the groups' rows at once (kernels::grouped_matmul), on a GPU a gemm per group with rows.
// y (R, N) = x_g (R_g, K) · w_gᵀ per group.
void grouped_linear_forward(Tensor y, Tensor x, Tensor w, const int64_t* counts, int groups);
// dx (R, K) = dy_g · w_g per group (dx written).
void grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t* counts,
                                   int groups);
// dw_g (N, K) += dy_gᵀ · x_g per group.
void grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, const int64_t* counts,
                                    int groups);

// --- tokens --------------------------------------------------------------------------------------
// Checks every token of inputs in [0, V) (an InputError naming the first that is not) and returns
// the number of targets >= 0. Either may be empty (nothing checked / 0).
int64_t check_tokens(Tensor inputs, Tensor targets, int64_t V);

// --- streams and events --------------------------------------------------------------------------
// Work is ordered by streams and events, not by returning (DESIGN.md §10). Each device has a
// compute stream, on which every kernel above runs in issue order, and a communication stream, on
// which the collectives run (comm/communicator.h: an asynchronous operation takes the event it
// must wait for before it reads its buffer, and its Handle gives the event of its completion).
// Wherever one stream consumes what the other produces, the producer records an event and the
// consumer waits on it: a gradient bucket's reduction is issued `after` the compute event that
// follows the backward which wrote it, and the compute stream waits on a gather's event before a
// kernel reads the gathered parameters.
//
// A backend implements record and wait over its own events (a CUDA backend: cudaEventRecord and
// cudaStreamWaitEvent, NCCL on the communication stream) and an ops::Completion for the events it
// hands out. The CPU backend: the compute stream is the calling thread, whose kernels have
// finished when they return, so an event recorded on it is complete at once; the communication
// stream is a communicator's comm thread, whose events are the completions of the operations
// queued on it, and which waits for an operation's `after` event before running it. Waiting on an
// incomplete event blocks the calling thread: the compute stream itself, and for the
// communication stream an order at least as strict as asked.
//
// The compute stream of the device this process computes on (core/device.h default_device).
Stream compute_stream();
// Which device's memory p is: CUDA for the CUDA backend's device memory, else the CPU (host
// memory, pinned or not, and the CPU device's memory). The communication layer stages a GPU's
// buffers through host memory where its transport cannot read them.
Device device_of(const void* p);
// While it lives, the kernels and copies this thread issues on s's device run on s (the
// communication layer's conversions and staging run on the communication stream).
class OnStream {
 public:
  explicit OnStream(Stream s);
  ~OnStream();
  OnStream(const OnStream&) = delete;
  OnStream& operator=(const OnStream&) = delete;

 private:
  void* previous_ = nullptr;
  bool active_ = false;
};

// An event of the current work on s. Only a compute stream can be recorded here: a communication
// stream's events come from the Handles of its operations.
Event record(Stream s);
// Work issued to s after this call does not start before e's work is done.
void wait(Stream s, const Event& e);
// The host blocks until e's work is done; rethrows the error of the operation e completes.
void synchronize(const Event& e);

}  // namespace strata::ops
