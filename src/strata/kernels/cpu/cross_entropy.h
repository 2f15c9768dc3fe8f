// Softmax cross-entropy over a vocabulary, fp32 per row (max-subtracted). S: storage type of the
// logits (float, bf16, f16).
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// losses (N) = −log softmax(logits)[target]; logits (N,V) are then overwritten in place by
// dlogits = (softmax − onehot(target)) · dloss. targets (N) in [0, V), or < 0 to ignore the row
// (loss 0, gradient 0). dloss is 1/(tokens counted in the global batch) times the loss scale.
template <typename S>
void cross_entropy_forward_backward(float* losses, S* logits, const int32_t* targets, int N, int V,
                                    float dloss);

// Training, in two halves. cross_entropy_stats: losses (N) as above and stats (3,N) = the row max,
// Σ exp(logit − max) and the target's logit (as the vocabulary-parallel steps below leave gmax
// and sums), logits untouched. ce_dlogits: out (N, cols) with row stride ldo = the dlogits of
// columns [c0, c0 + cols) of logits (N,V) from those stats (v0/valid as in vocab_ce_*; with one
// rank 0 and V), each rounded to S and stored as D: S (out may be the columns themselves) or
// float (the exact widening, for products that run in fp32); softcap > 0: the logits are capped
// (softcap_inplace, elementwise.h) and each dlogit is times 1 − (z/softcap)², z the logit read,
// the gradient w.r.t. the logits before the cap (0: none). forward_backward is the two over all
// columns in place.
template <typename S>
void cross_entropy_stats(float* losses, float* stats, const S* logits, const int32_t* targets,
                         int N, int V);
template <typename S, typename D>
void ce_dlogits(D* out, int64_t ldo, const S* logits, const int32_t* targets, const float* stats,
                int N, int V, int64_t c0, int64_t cols, int64_t v0, int valid, float dloss,
                float softcap);

// losses (N) as above; logits (N,V) untouched (evaluation).
template <typename S>
void cross_entropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V);

// Vocabulary-parallel form: a rank holds logits (N,V) of the global vocabulary columns
// [v0, v0 + V), of which the first `valid` exist (the rest pad the vocabulary to a multiple of
// the tensor-parallel size and never count). Three local steps around two reductions over ranks
// (the caller's): with one rank (v0 = 0, valid = V) they compute what the serial form does.
// 1. rowmax (N) = max over the valid columns (−inf where valid is 0).
template <typename S>
void vocab_ce_max(float* rowmax, const S* logits, int N, int V, int valid);
// 2. With gmax (N) the maximum over ranks: sums (2,N), row 0 Σ exp(logit − gmax) over the valid
// columns, row 1 the target's logit where this rank holds the target, else 0; both 0 for ignored
// targets (< 0).
template <typename S>
void vocab_ce_sums(float* sums, const S* logits, const int32_t* targets, const float* gmax, int N,
                   int V, int64_t v0, int valid);
// 3. With sums summed over ranks: losses (N) = log(sumexp) + gmax − target logit (0 for ignored
// targets). gmax then sums are the statistics ce_dlogits takes for training.
void vocab_ce_finish(float* losses, const int32_t* targets, const float* gmax, const float* sums,
                     int N);

// out (N) = max over k of in (K,N): the maximum over ranks of gathered row maxima.
void max_rows(float* out, const float* in, int K, int64_t N);

}  // namespace strata::kernels
