// Blocks of causal self-attention on the CPU for ring attention (context parallelism): each rank
// holds some of the sequence's positions (zig-zag: chunks r and 2·cp−1−r of 2·cp), and the keys
// and values travel round the ring; every step attends the rank's queries to one visiting block
// of keys and values and merges the result into a running output through the log-sum-exp.
//
// Layouts as attention_tiled.h: qkv rows are (B, Tl), Tl rows per batch row; a row has KVH groups,
// group g = its rep = NH/KVH query heads, then its key head, then its value head, each hd wide;
// head h = g·rep + r; scores as AttentionScores says (attention.h). A kv buffer is rows (B, Tkl) of
// KVH groups, each [key hd | value hd] (KVH·2·hd per row): the keys and values packed out of some
// rank's qkv.
//
// Block pairs: a query position sees a key position at or before it. For two chunks of the
// sequence, a chunk's queries against its own keys are a causal (diagonal) block, against an
// earlier chunk's a full block, against a later chunk's nothing (skip the call). With a window
// (AttentionScores::window > 0) a block's keys are also masked by position, in full blocks as in
// causal ones: the query rows of qkv are at positions AttentionScores::pos, the key rows of kv at
// kv_pos (each nullptr: the row index; increasing). A block with no key inside any query's window
// returns at once, and the key tiles outside every window of a query tile are skipped. Documents
// (AttentionScores::doc_begin, by those positions) mask alike: a batch row whose every key lies
// before the document of its first query is skipped at once (the whole block where every row's
// is), and so are the key tiles before a query tile's document.
//
// Inside: the tiled kernel's fp32 tiles, micro-kernels (AVX-512 or AVX2, as
// attention_tiled_force_avx2 says) and per-tile loops (attention_tiled_kernels.h). Each output
// element is computed by one thread in a fixed order: the bits do not depend on the thread count.
// A ring of one causal block (q0 = k0 = 0, Tq = Tk = Tl) gives attention_tiled_forward's bits.
// Per-thread tiles (attention_block_workspace_floats, linear in Tk) live in the kernels' own
// workspace, counted under MemCategory::Workspace; nothing is quadratic in the block length.
// Not reentrant (the workspace is shared by the calls), as the other CPU kernels.
#pragma once

#include <cstddef>

#include "strata/kernels/cpu/attention.h"

namespace strata::kernels {

// kv (B, Tl, KVH·2·hd) = the keys and values of qkv (B, Tl rows), group by group.
template <typename S>
void attention_pack_kv(S* kv, const S* qkv, int B, int Tl, int NH, int KVH, int hd);

// One block: query rows [q0, q0+Tq) of every batch row of qkv (Tl rows per batch row) against key
// and value rows [k0, k0+Tk) of every batch row of kv (Tkl rows per batch row). causal: a diagonal
// block (needs Tq == Tk, the same positions: query q0+i sees keys k0+j, j <= i); otherwise every
// key is visible (inside the window, where sc has one). Merged into the running result of the query
// rows: o (B, Tl, NH·hd) fp32, the normalised output so far, and lse (B, NH, Tl) fp32; only rows
// [q0, q0+Tq) are read or written. Where lse is -inf (a fresh row: fill lse with -inf before the
// first step; o's values there are not read) the block's output and lse are written; else new_lse =
// logaddexp(lse, block_lse) and o = o·exp(lse − new_lse) + o_block·exp(block_lse − new_lse). A row
// that sees no key of the block is left as it is. dqkv (B, Tl rows, the grouped qkv layout) = the
// fp32 query gradients dq (B, Tl, NH·hd) and key/value gradients dkv (B, Tl, KVH·2·hd), rounded to
// S once: attention_pack_kv's inverse for the gradients the ring accumulates.
template <typename S>
void attention_unpack_dqkv(S* dqkv, const float* dq, const float* dkv, int B, int Tl, int NH,
                           int KVH, int hd);

template <typename S>
void attention_block_forward(float* o, float* lse, const S* qkv, int Tl, int q0, int Tq,
                             const S* kv, int Tkl, int k0, int Tk, int B, int NH, int KVH, int hd,
                             bool causal, const AttentionScores& sc = {});

// delta (B, NH, Tl) fp32 = Σ_d dout ∘ out per row and head; dout and out (B, Tl, NH·hd), out the
// final output (after every block).
template <typename S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int Tl, int NH, int hd);

// Backward of one block (same block arguments as attention_block_forward), given the FINAL lse
// and delta of the query rows: P = exp(s − lse), s = scale·q·kᵀ soft-capped (masked as the
// forward's block), dP = dout·vᵀ, dS = P ∘ (dP − delta) (times the cap's derivative, the gradient
// of scale·q·kᵀ). Accumulates (+=, fp32):
//   dq (B, Tl, NH·hd), rows [q0, q0+Tq): += scale·dS·k;
//   dkv (B, Tkl, KVH·2·hd), rows [k0, k0+Tk): key part += scale·dSᵀ·q and value part += Pᵀ·dout,
//   each summed over the group's rep query heads.
// dout (B, Tl, NH·hd); lse, delta (B, NH, Tl).
template <typename S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const float* lse,
                              const float* delta, int Tl, int q0, int Tq, const S* kv, int Tkl,
                              int k0, int Tk, int B, int NH, int KVH, int hd, bool causal,
                              const AttentionScores& sc = {});

// Floats of workspace each thread uses for a block of Tk keys (the backward's, the larger):
// attention_tiled_workspace_floats(Tk, hd).
size_t attention_block_workspace_floats(int Tk, int hd);

}  // namespace strata::kernels
