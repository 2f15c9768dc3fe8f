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

// losses (N) as above; logits (N,V) untouched (evaluation).
template <typename S>
void cross_entropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V);

}  // namespace strata::kernels
