#include "strata/kernels/cpu/qk_norm.h"

#include <algorithm>
#include <cmath>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/norm.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

// The layout's arithmetic. Heads of a kind are numbered in row order: the query heads
// h = g·rep + r, the key heads h = g.
enum Kind { kQuery = 0, kKey = 1 };

int64_t row_width(const QkNormArgs& a) {
  return int64_t(a.groups) * (a.rep + 2) * a.hd;
}
int heads(const QkNormArgs& a, Kind k) {
  return k == kQuery ? a.groups * a.rep : a.groups;
}
// The first column of head h of kind k in a row.
int64_t head_col(const QkNormArgs& a, Kind k, int h) {
  const int g = k == kQuery ? h / a.rep : h, r = k == kQuery ? h % a.rep : a.rep;
  return (int64_t(g) * (a.rep + 2) + r) * a.hd;
}
int64_t value_col(const QkNormArgs& a, int g) {
  return (int64_t(g) * (a.rep + 2) + a.rep + 1) * a.hd;
}
// Where row n's rstd of head h of kind k is.
int64_t stat(const QkNormArgs& a, int64_t n, Kind k, int h) {
  if (!a.per_head) return 2 * n + k;
  return n * (int64_t(a.groups) * (a.rep + 1)) + (k == kQuery ? h : a.groups * a.rep + h);
}
// The first of head h's hd gains: per head, every head of a kind shares one (hd) gain.
int64_t gain_col(const QkNormArgs& a, int h) {
  return a.per_head ? 0 : int64_t(h) * a.hd;
}
// The number of values one norm spans.
float width(const QkNormArgs& a, Kind k) {
  return a.per_head ? float(a.hd) : float(k == kQuery ? a.q_width : a.k_width);
}

// One head's pieces, on hd values; off is gain_offset's, the gain off + w.
template <typename S>
float head_sum_squares(const S* x, int hd) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int d = 0; d < hd; ++d) ss += load(x[d]) * load(x[d]);
  return ss;
}

template <typename S>
void head_scale(S* y, const S* x, const S* w, float off, float r, int hd) {
#pragma omp simd
  for (int d = 0; d < hd; ++d) y[d] = store<S>(load(x[d]) * r * (off + load(w[d])));
}

// Σ dy·gain·x·r.
template <typename S>
float head_dot(const S* dy, const S* x, const S* w, float off, float r, int hd) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < hd; ++d) s += (off + load(w[d])) * load(dy[d]) * load(x[d]) * r;
  return s;
}

// dx = (gain·dy − x̂·mean)·r with x̂ = x·r, mean = Σ dy·gain·x̂ / W over the norm's span.
template <typename S>
void head_dx(S* dx, const S* dy, const S* x, const S* w, float off, float r, float mean, int hd) {
#pragma omp simd
  for (int d = 0; d < hd; ++d) {
    const float xhat = load(x[d]) * r;
    dx[d] = store<S>(((off + load(w[d])) * load(dy[d]) - xhat * mean) * r);
  }
}

// Value heads pass through: dst = src on each group's value head of row n.
template <typename S>
void copy_values(S* dst, const S* src, const QkNormArgs& a) {
  for (int g = 0; g < a.groups; ++g) {
    const int64_t c = value_col(a, g);
    std::copy(src + c, src + c + a.hd, dst + c);
  }
}

// dw += Σ over the rows, and over the heads that share each gain, of dy·x·rstd (the gain is
// off + w: its gradient does not depend on off). A task per kChunk gain values, over the rows in
// blocks of kRowBlock whose fp32 sums then add in order: the same bits on any thread count.
constexpr int kChunk = 16, kRowBlock = 64;

template <typename S, typename G>
void gain_grad(G* dw, const S* dy, const S* x, const float* rstd, const QkNormArgs& a, Kind k) {
  const int hd = a.hd, nheads = heads(a, k);
  const int owners = a.per_head ? 1 : nheads;  // distinct (hd) gains
  const int chunks = (hd + kChunk - 1) / kChunk;
  const int64_t row = row_width(a);
  const int64_t work = int64_t(a.N) * nheads * hd;
#pragma omp parallel for schedule(static) if (parallel : work >= kParallelMinWork)
  for (int task = 0; task < owners * chunks; ++task) {
    const int owner = task / chunks, d0 = (task % chunks) * kChunk, m = std::min(kChunk, hd - d0);
    const int h0 = a.per_head ? 0 : owner, h1 = a.per_head ? nheads : owner + 1;
    float total[kChunk] = {};
    for (int n0 = 0; n0 < a.N; n0 += kRowBlock) {
      float part[kChunk] = {};
      for (int n = n0; n < std::min(a.N, n0 + kRowBlock); ++n) {
        for (int h = h0; h < h1; ++h) {
          const int64_t c = int64_t(n) * row + head_col(a, k, h) + d0;
          const float r = rstd[stat(a, n, k, h)];
          for (int j = 0; j < m; ++j) part[j] += load(dy[c + j]) * (load(x[c + j]) * r);
        }
      }
      for (int j = 0; j < m; ++j) total[j] += part[j];
    }
    G* g = dw + int64_t(owner) * hd + d0;
    for (int j = 0; j < m; ++j) g[j] = store<G>(load(g[j]) + total[j]);
  }
}

}  // namespace

template <typename S>
void qk_norm_sumsq(float* sumsq, const S* qkv, const QkNormArgs& a) {
  const int64_t row = row_width(a);
#pragma omp parallel for schedule(static) if (parallel : int64_t(a.N) * row >= kParallelMinWork)
  for (int n = 0; n < a.N; ++n) {
    const S* x = qkv + int64_t(n) * row;  // (row)
    for (Kind k : {kQuery, kKey}) {
      float s = 0.0f;
      for (int h = 0; h < heads(a, k); ++h) s += head_sum_squares(x + head_col(a, k, h), a.hd);
      sumsq[2 * int64_t(n) + k] = s;
    }
  }
}

template <typename S>
void qk_norm_forward(S* out, float* rstd, const S* qkv, const S* wq, const S* wk,
                     const float* sumsq, const QkNormArgs& a) {
  const int64_t row = row_width(a);
  const float off = gain_offset(a.w_offset);
#pragma omp parallel for schedule(static) if (parallel : int64_t(a.N) * row >= kParallelMinWork)
  for (int n = 0; n < a.N; ++n) {
    const S* x = qkv + int64_t(n) * row;  // (row)
    S* y = out + int64_t(n) * row;        // (row)
    for (Kind k : {kQuery, kKey}) {
      const S* w = k == kQuery ? wq : wk;
      float r = 0.0f;
      if (!a.per_head) {
        r = 1.0f / std::sqrt(sumsq[2 * int64_t(n) + k] / width(a, k) + a.eps);
        rstd[stat(a, n, k, 0)] = r;
      }
      for (int h = 0; h < heads(a, k); ++h) {
        const int64_t c = head_col(a, k, h);
        if (a.per_head) {
          r = 1.0f / std::sqrt(head_sum_squares(x + c, a.hd) / float(a.hd) + a.eps);
          rstd[stat(a, n, k, h)] = r;
        }
        head_scale(y + c, x + c, w + gain_col(a, h), off, r, a.hd);
      }
    }
    copy_values(y, x, a);
  }
}

template <typename S>
void qk_norm_backward_dot(float* dot, const S* dout, const S* qkv, const S* wq, const S* wk,
                          const float* rstd, const QkNormArgs& a) {
  const int64_t row = row_width(a);
  const float off = gain_offset(a.w_offset);
#pragma omp parallel for schedule(static) if (parallel : int64_t(a.N) * row >= kParallelMinWork)
  for (int n = 0; n < a.N; ++n) {
    const S* x = qkv + int64_t(n) * row;    // (row)
    const S* dy = dout + int64_t(n) * row;  // (row)
    for (Kind k : {kQuery, kKey}) {
      const S* w = k == kQuery ? wq : wk;
      const float r = rstd[2 * int64_t(n) + k];
      float s = 0.0f;
      for (int h = 0; h < heads(a, k); ++h) {
        const int64_t c = head_col(a, k, h);
        s += head_dot(dy + c, x + c, w + gain_col(a, h), off, r, a.hd);
      }
      dot[2 * int64_t(n) + k] = s;
    }
  }
}

template <typename S, typename G>
void qk_norm_backward(S* dqkv, G* dwq, G* dwk, const S* dout, const S* qkv, const S* wq,
                      const S* wk, const float* rstd, const float* dot, const QkNormArgs& a) {
  const int64_t row = row_width(a);
  const float off = gain_offset(a.w_offset);
#pragma omp parallel for schedule(static) if (parallel : int64_t(a.N) * row >= kParallelMinWork)
  for (int n = 0; n < a.N; ++n) {
    const S* x = qkv + int64_t(n) * row;    // (row)
    const S* dy = dout + int64_t(n) * row;  // (row)
    S* dx = dqkv + int64_t(n) * row;        // (row)
    for (Kind k : {kQuery, kKey}) {
      const S* w = k == kQuery ? wq : wk;
      for (int h = 0; h < heads(a, k); ++h) {
        const int64_t c = head_col(a, k, h);
        const S* wh = w + gain_col(a, h);
        const float r = rstd[stat(a, n, k, h)];
        const float s =
            a.per_head ? head_dot(dy + c, x + c, wh, off, r, a.hd) : dot[2 * int64_t(n) + k];
        head_dx(dx + c, dy + c, x + c, wh, off, r, s / width(a, k), a.hd);
      }
    }
    copy_values(dx, dy, a);
  }
  gain_grad(dwq, dout, qkv, rstd, a, kQuery);
  gain_grad(dwk, dout, qkv, rstd, a, kKey);
}

#define INSTANTIATE_S(S)                                                                   \
  template void qk_norm_sumsq<S>(float*, const S*, const QkNormArgs&);                     \
  template void qk_norm_forward<S>(S*, float*, const S*, const S*, const S*, const float*, \
                                   const QkNormArgs&);                                     \
  template void qk_norm_backward_dot<S>(float*, const S*, const S*, const S*, const S*,    \
                                        const float*, const QkNormArgs&);
#define INSTANTIATE_SG(S, G)                                                               \
  template void qk_norm_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, const S*, \
                                       const float*, const float*, const QkNormArgs&);
STRATA_FOR_EACH_S(INSTANTIATE_S)
STRATA_FOR_EACH_SG(INSTANTIATE_SG)

}  // namespace strata::kernels
