// RMS normalisation of the query and key heads of the grouped qkv layout (attention.h: per row,
// for each kv group g, its rep query heads, then its key head, then its value head, each hd wide);
// the value heads pass through. S: storage type (float, bf16, f16); G: the type the gains'
// gradients accumulate in; statistics fp32. y = (w_offset + w)·x·rstd, rstd = 1/sqrt(Σx²/W + eps),
// the gain formed in fp32.
//
// Per head (Qwen3, Gemma 3): each query head and each key head over its own hd values (W = hd),
// one (hd) gain wq shared by every query head and wk by every key head; rstd (N, groups·(rep+1)):
// the query heads (g, r) at g·rep + r, then the key heads g. Whole (OLMo 2): all of a row's query
// values together, and all its key values, W = q_width, k_width, which may span several
// tensor-parallel ranks: the caller adds the ranks' qk_norm_sumsq before the forward, and their
// qk_norm_backward_dot before the backward; gains wq (groups·rep·hd) and wk (groups·hd), this
// rank's part; rstd (N, 2): the queries', the keys'.
//
// The gains' gradients sum over rows and heads in a fixed order, whatever the thread count.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

struct QkNormArgs {
  int N = 0, groups = 0, rep = 0, hd = 0;  // N rows of groups·(rep+2)·hd
  bool per_head = true;
  float eps = 0.0f, w_offset = 0.0f;
  int64_t q_width = 0, k_width = 0;  // whole: the values each norm spans, over every rank
};

// Whole: sumsq (N, 2) = each row's Σ q², Σ k² over its heads here.
template <typename S>
void qk_norm_sumsq(float* sumsq, const S* qkv, const QkNormArgs& a);

// out (not aliasing qkv), qkv (N, groups·(rep+2)·hd); rstd as above, written; sumsq (N, 2) whole
// (the sums over every rank), null per head.
template <typename S>
void qk_norm_forward(S* out, float* rstd, const S* qkv, const S* wq, const S* wk,
                     const float* sumsq, const QkNormArgs& a);

// Whole: dot (N, 2) = each row's Σ dout·(w_offset + w)·x·rstd over its query (key) values here.
template <typename S>
void qk_norm_backward_dot(float* dot, const S* dout, const S* qkv, const S* wq, const S* wk,
                          const float* rstd, const QkNormArgs& a);

// dqkv (N, groups·(rep+2)·hd) written (not aliasing dout): the input gradient, dout for the
// value heads; dwq, dwk +=; dot (N, 2) whole (the sums over every rank), null per head.
template <typename S, typename G>
void qk_norm_backward(S* dqkv, G* dwq, G* dwk, const S* dout, const S* qkv, const S* wq,
                      const S* wk, const float* rstd, const float* dot, const QkNormArgs& a);

}  // namespace strata::kernels
