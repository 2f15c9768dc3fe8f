#include "strata/kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

// Rows are reduced in at most this many fixed blocks: enough to keep every core busy, few
// enough that the final combine over blocks is cheap.
constexpr int kMaxRowBlocks = 32;

int row_blocks(int N) {
  return std::max(1, std::min(N, kMaxRowBlocks));
}

// [begin, end) rows of block `blk` of `nblocks` (sizes differ by at most one).
int block_begin(int blk, int nblocks, int N) {
  return int(int64_t(N) * blk / nblocks);
}

// g (C) += Σ over blocks of partial[blk*stride + c], blocks added in order.
template <typename G>
void combine_blocks(G* g, const float* partial, int nblocks, int64_t stride, int C) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(nblocks) * C >= kParallelMinWork)
  for (int c = 0; c < C; ++c) {
    float s = 0.0f;
    for (int blk = 0; blk < nblocks; ++blk) s += partial[blk * stride + c];
    g[c] = store<G>(load(g[c]) + s);
  }
}

}  // namespace

size_t norm_backward_scratch_floats(int N, int C) {
  return size_t(row_blocks(N)) * 2 * C;
}

template <typename S>
void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight,
                       const S* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + int64_t(n) * C;  // (C)
    S* o = out + int64_t(n) * C;        // (C)
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += load(x[c]);
    float m = sum / float(C);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; ++c) {
      float d = load(x[c]) - m;
      var += d * d;
    }
    float r = 1.0f / std::sqrt(var / float(C) + eps);
    if (bias != nullptr) {
#pragma omp simd
      for (int c = 0; c < C; ++c)
        o[c] = store<S>((load(x[c]) - m) * r * load(weight[c]) + load(bias[c]));
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = store<S>((load(x[c]) - m) * r * load(weight[c]));
    }
    if (mean != nullptr) mean[n] = m;
    if (rstd != nullptr) rstd[n] = r;
  }
}

template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, float* scratch, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int N, int C) {
  int nblocks = row_blocks(N);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    float* dw = scratch + int64_t(blk) * 2 * C;  // (C) this block's Σ dout·xhat
    float* db = dw + C;                          // (C) this block's Σ dout
#pragma omp simd
    for (int c = 0; c < 2 * C; ++c) dw[c] = 0.0f;
    for (int n = block_begin(blk, nblocks, N); n < block_begin(blk + 1, nblocks, N); ++n) {
      const S* x = inp + int64_t(n) * C;    // (C)
      const S* dy = dout + int64_t(n) * C;  // (C)
      S* dx = dinp + int64_t(n) * C;        // (C)
      float m = mean[n], r = rstd[n];
      float dn_mean = 0.0f, dn_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dn_mean, dn_xhat_mean)
      for (int c = 0; c < C; ++c) {
        float dn = load(weight[c]) * load(dy[c]);
        dn_mean += dn;
        dn_xhat_mean += dn * (load(x[c]) - m) * r;
      }
      dn_mean /= float(C);
      dn_xhat_mean /= float(C);
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        float g = load(dy[c]);
        float xhat = (load(x[c]) - m) * r;
        dw[c] += g * xhat;
        db[c] += g;
        float d = (load(weight[c]) * g - dn_mean - xhat * dn_xhat_mean) * r;
        dx[c] = store<S>(load(dx[c]) + d);
      }
    }
  }
  combine_blocks(dweight, scratch, nblocks, 2 * int64_t(C), C);
  if (dbias != nullptr) combine_blocks(dbias, scratch + C, nblocks, 2 * int64_t(C), C);
}

template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + int64_t(n) * C;  // (C)
    S* o = out + int64_t(n) * C;        // (C)
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) ss += load(x[c]) * load(x[c]);
    float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = store<S>(load(x[c]) * r * load(weight[c]));
    if (rstd != nullptr) rstd[n] = r;
  }
}

template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, float* scratch, const S* dout, const S* inp,
                      const S* weight, const float* rstd, int N, int C) {
  int nblocks = row_blocks(N);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    float* dw = scratch + int64_t(blk) * C;  // (C) this block's Σ dout·xhat
#pragma omp simd
    for (int c = 0; c < C; ++c) dw[c] = 0.0f;
    for (int n = block_begin(blk, nblocks, N); n < block_begin(blk + 1, nblocks, N); ++n) {
      const S* x = inp + int64_t(n) * C;    // (C)
      const S* dy = dout + int64_t(n) * C;  // (C)
      S* dx = dinp + int64_t(n) * C;        // (C)
      float r = rstd[n];
      float dn_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dn_xhat_mean)
      for (int c = 0; c < C; ++c) dn_xhat_mean += load(weight[c]) * load(dy[c]) * load(x[c]) * r;
      dn_xhat_mean /= float(C);
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        float g = load(dy[c]);
        float xhat = load(x[c]) * r;
        dw[c] += g * xhat;
        float d = (load(weight[c]) * g - xhat * dn_xhat_mean) * r;
        dx[c] = store<S>(load(dx[c]) + d);
      }
    }
  }
  combine_blocks(dweight, scratch, nblocks, C, C);
}

#define INSTANTIATE_S(S)                                                                         \
  template void layernorm_forward<S>(S*, float*, float*, const S*, const S*, const S*, int, int, \
                                     float);                                                     \
  template void rmsnorm_forward<S>(S*, float*, const S*, const S*, int, int, float);
#define INSTANTIATE_SG(S, G)                                                                       \
  template void layernorm_backward<S, G>(S*, G*, G*, float*, const S*, const S*, const S*,         \
                                         const float*, const float*, int, int);                    \
  template void rmsnorm_backward<S, G>(S*, G*, float*, const S*, const S*, const S*, const float*, \
                                       int, int);
STRATA_FOR_EACH_S(INSTANTIATE_S)
STRATA_FOR_EACH_SG(INSTANTIATE_SG)

}  // namespace strata::kernels
