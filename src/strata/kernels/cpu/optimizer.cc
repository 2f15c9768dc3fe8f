#include "strata/kernels/cpu/optimizer.h"

#include <algorithm>
#include <cmath>

#include "strata/core/check.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {
// sum_squares and sum split their input into this many equal parts whatever the thread count.
constexpr int kSumParts = 64;
}  // namespace

// When S is float and param aliases master, the final store writes back the value just written:
// harmless, and it keeps the loop free of a branch.
template <typename S, typename G>
void adam_step(float* master, S* param, const G* grad, float* m, float* v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, float grad_scale,
               int64_t step, bool adamw_mode) {
  const float step_size = float(lr / (1.0 - std::pow(double(beta1), double(step))));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(beta2), double(step))));
  const float decay = adamw_mode ? 1.0f - lr * weight_decay : 1.0f;
  const float l2 = adamw_mode ? 0.0f : weight_decay;
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) {
    float p = master[i];
    float g = load(grad[i]) * grad_scale + l2 * p;
    p *= decay;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    param[i] = store<S>(p);
  }
}

namespace {

// Which momentum update an SGD step does: none, torch's first step (the buffer starts as g; the
// old contents are never read), or the running one.
enum class Momentum { None, First, Running };

template <Momentum mode, typename S, typename G>
void sgd_loop(float* master, S* param, const G* grad, float* buf, size_t n, float lr,
              float momentum, float weight_decay, bool nesterov, float grad_scale) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) {
    float p = master[i];
    float g = load(grad[i]) * grad_scale + weight_decay * p;
    if constexpr (mode != Momentum::None) {
      float b = g;
      if constexpr (mode == Momentum::Running) b += momentum * buf[i];
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p -= lr * g;
    master[i] = p;
    param[i] = store<S>(p);
  }
}

}  // namespace

template <typename S, typename G>
void sgd_step(float* master, S* param, const G* grad, float* buf, size_t n, float lr,
              float momentum, float weight_decay, bool nesterov, float grad_scale, int64_t step) {
  if (momentum == 0.0f) {
    sgd_loop<Momentum::None>(master, param, grad, buf, n, lr, momentum, weight_decay, nesterov,
                             grad_scale);
  } else if (step <= 1) {
    sgd_loop<Momentum::First>(master, param, grad, buf, n, lr, momentum, weight_decay, nesterov,
                              grad_scale);
  } else {
    sgd_loop<Momentum::Running>(master, param, grad, buf, n, lr, momentum, weight_decay, nesterov,
                                grad_scale);
  }
}

namespace {

// Part `part` of kSumParts near-equal parts of [0, n): the split is fixed whatever the thread
// count, so the sums below do not depend on it.
void part_range(size_t n, int part, size_t& begin, size_t& end) {
  begin = n / kSumParts * part + std::min<size_t>(part, n % kSumParts);
  end = begin + n / kSumParts + (size_t(part) < n % kSumParts ? 1 : 0);
}

double sum_parts(const double* partial) {
  double total = 0.0;
  for (int part = 0; part < kSumParts; ++part) total += partial[part];
  return total;
}

}  // namespace

template <typename G>
double sum_squares(const G* g, size_t n) {
  double partial[kSumParts];
#pragma omp parallel for schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (int part = 0; part < kSumParts; ++part) {
    size_t begin, end;
    part_range(n, part, begin, end);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = begin; i < end; ++i) {
      double x = load(g[i]);
      s += x * x;
    }
    partial[part] = s;
  }
  return sum_parts(partial);
}

double sum(const float* x, size_t n) {
  double partial[kSumParts];
#pragma omp parallel for schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (int part = 0; part < kSumParts; ++part) {
    size_t begin, end;
    part_range(n, part, begin, end);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = begin; i < end; ++i) s += double(x[i]);
    partial[part] = s;
  }
  return sum_parts(partial);
}

template <typename G>
void scale_inplace(G* g, size_t n, float s) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) g[i] = store<G>(load(g[i]) * s);
}

#define INSTANTIATE_SG(S, G)                                                                       \
  template void adam_step<S, G>(float*, S*, const G*, float*, float*, size_t, float, float, float, \
                                float, float, float, int64_t, bool);                               \
  template void sgd_step<S, G>(float*, S*, const G*, float*, size_t, float, float, float, bool,    \
                               float, int64_t);
#define INSTANTIATE_G(G)                            \
  template double sum_squares<G>(const G*, size_t); \
  template void scale_inplace<G>(G*, size_t, float);
STRATA_FOR_EACH_SG(INSTANTIATE_SG)
STRATA_FOR_EACH_S(INSTANTIATE_G)

double sum_squares(const void* g, DType dtype, size_t n) {
  switch (dtype) {
    case DType::F32:
      return sum_squares(static_cast<const float*>(g), n);
    case DType::BF16:
      return sum_squares(static_cast<const bf16*>(g), n);
    case DType::F16:
      return sum_squares(static_cast<const f16*>(g), n);
    case DType::I32:
      break;
  }
  STRATA_FAIL("sum_squares takes fp32, bf16 or fp16 elements, not ", dtype_name(dtype));
}

}  // namespace strata::kernels
