// Optimizer updates and gradient reductions, elementwise over flat buffers. S: storage type of
// the parameters (float, bf16, f16); G: type of the gradients. Updates are computed in fp32 on
// the fp32 master copy, then rounded to S.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// One Adam/AdamW step (torch.optim formulas). master (n) fp32 (may alias param when S = float);
// param (n); grad (n); m, v (n) fp32 moments. g = grad · grad_scale (grad_scale folds loss-scale
// unscaling and clipping). step is 1-based, for the bias corrections.
//   adamw_mode: p ·= (1 − lr·wd), then p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)
//   else Adam with L2: g += wd·p before the moments, same update without the decay.
template <typename S, typename G>
void adam_step(float* master, S* param, const G* grad, float* m, float* v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, float grad_scale,
               int64_t step, bool adamw_mode);

// One SGD step (torch.optim.SGD, dampening 0): g = grad·grad_scale + wd·p; with momentum,
// buf = g on step 1 (buf's old contents are not read), else momentum·buf + g; the step uses
// g + momentum·buf (nesterov) or buf. buf (n) fp32; unused, and may be null, when momentum == 0.
template <typename S, typename G>
void sgd_step(float* master, S* param, const G* grad, float* buf, size_t n, float lr,
              float momentum, float weight_decay, bool nesterov, float grad_scale, int64_t step);

// Σ g² over g (n), accumulated in double over a fixed partition combined in a fixed order, so
// the result does not depend on the number of threads. NaN and Inf propagate.
template <typename G>
double sum_squares(const G* g, size_t n);
// The same over a buffer whose dtype is known only at run time.
double sum_squares(const void* g, DType dtype, size_t n);

// Σ x over x (n) in double, with the same fixed partition.
double sum(const float* x, size_t n);

// g (n) ·= s.
template <typename G>
void scale_inplace(G* g, size_t n, float s);

}  // namespace strata::kernels
