// Causal self-attention on the CPU, tiled (flash-style): memory linear in T. The probabilities are
// never stored; each query row keeps the log-sum-exp of its scaled scores, as the CUDA backend
// does (kernels/cuda/attention.cu), and backward recomputes the probabilities tile by tile.
// Same grouped qkv layout, heads h = g·rep + r, scores and masks (AttentionScores: scale, soft
// cap, window, documents) as kernels/cpu/attention.h; with a window, the key tiles outside every
// row's window are neither computed nor masked, so the time grows as T·window; with documents,
// the key tiles before the document of a query tile's first row are skipped alike, so packed
// documents cost about what they would alone. Everything inside runs in fp32
// for every storage type S (q, k, v are widened exactly; the scores and probabilities are never
// rounded to S); the outputs are rounded to S once.
//
// Each output element is computed by one thread in a fixed order, so the bits do not depend on
// the thread count. They do depend on the CPU: AVX-512 and AVX2 run different vector widths.
#pragma once

#include <cstddef>

#include "strata/kernels/cpu/attention.h"

namespace strata::kernels {

// out (B,T,NH·hd) as attention_forward's; lse (B,NH,T) fp32: lse_i = ln Σ_j exp(s_ij) over the
// keys j row i sees, s_ij = scale·q_i·k_j (soft-capped). out nullptr: the lse only (selective
// recompute).
template <typename S>
void attention_tiled_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int KVH,
                             int hd, const AttentionScores& sc = {});

// dqkv (B,T,KVH·(rep+2)·hd) written from dout (B,T,NH·hd), qkv and the forward's lse. Needs no
// caller scratch: per-thread tiles (linear in T) live in the kernel's own workspace, counted
// under MemCategory::Workspace (attention_tiled_workspace_floats per thread).
template <typename S>
void attention_tiled_backward(S* dqkv, const S* dout, const S* qkv, const float* lse, int B, int T,
                              int NH, int KVH, int hd, const AttentionScores& sc = {});

// Tests: true runs the AVX2 kernels even where AVX-512F is present, so one CPU covers both.
void attention_tiled_force_avx2(bool on);

// Floats of workspace each thread uses (the backward's, which is the larger): keys, their
// transpose, the values' transpose and the fp32 key/value gradients of one kv group
// (5·T·hd), one query tile's probabilities and their gradients for every key (2·64·T), and
// a few 64-row tiles; T and hd rounded up to the tile and vector width.
size_t attention_tiled_workspace_floats(int T, int hd);

}  // namespace strata::kernels
