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

namespace {

// The backward of one row, in the pieces the fused and the split forms share. Kept out of line:
// every form runs the same machine code, so the split forms give the fused one's bits.

// dx (C) += the layernorm input gradient of one row; dy, x (C); m, r its mean and rstd.
template <typename S>
[[gnu::noinline]] void layernorm_row_dx(S* dx, const S* dy, const S* x, const S* weight, float m,
                                        float r, int C) {
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
    float d = (load(weight[c]) * g - dn_mean - xhat * dn_xhat_mean) * r;
    dx[c] = store<S>(load(dx[c]) + d);
  }
}

// dw (C) += dy·xhat, db (C) += dy of one row.
template <typename S>
[[gnu::noinline]] void layernorm_row_dw(float* dw, float* db, const S* dy, const S* x, float m,
                                        float r, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) {
    float g = load(dy[c]);
    float xhat = (load(x[c]) - m) * r;
    dw[c] += g * xhat;
    db[c] += g;
  }
}

// off: gain_offset's.
template <typename S>
[[gnu::noinline]] void rmsnorm_row_dx(S* dx, const S* dy, const S* x, const S* weight, float off,
                                      float r, int C) {
  float dn_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dn_xhat_mean)
  for (int c = 0; c < C; ++c)
    dn_xhat_mean += (off + load(weight[c])) * load(dy[c]) * load(x[c]) * r;
  dn_xhat_mean /= float(C);
#pragma omp simd
  for (int c = 0; c < C; ++c) {
    float g = load(dy[c]);
    float xhat = load(x[c]) * r;
    float d = ((off + load(weight[c])) * g - xhat * dn_xhat_mean) * r;
    dx[c] = store<S>(load(dx[c]) + d);
  }
}

template <typename S>
[[gnu::noinline]] void rmsnorm_row_dw(float* dw, const S* dy, const S* x, float r, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) dw[c] += load(dy[c]) * (load(x[c]) * r);
}

// block(blk, n0, n1) for each fixed row block [n0, n1): the partition that makes the parameter
// gradients independent of the thread count.
template <typename Block>
void for_row_blocks(int N, int C, Block block) {
  const int nblocks = row_blocks(N);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    block(blk, block_begin(blk, nblocks, N), block_begin(blk + 1, nblocks, N));
  }
}

}  // namespace

// scratch (blocks, 2, C): per row block, Σ dout·xhat then Σ dout.
template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, float* scratch, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int N, int C) {
  for_row_blocks(N, C, [&](int blk, int n0, int n1) {
    float* part = scratch + int64_t(blk) * 2 * C;  // (2, C)
    std::fill(part, part + 2 * int64_t(C), 0.0f);
    for (int n = n0; n < n1; ++n) {
      const int64_t o = int64_t(n) * C;
      layernorm_row_dx(dinp + o, dout + o, inp + o, weight, mean[n], rstd[n], C);
      layernorm_row_dw(part, part + C, dout + o, inp + o, mean[n], rstd[n], C);
    }
  });
  combine_blocks(dweight, scratch, row_blocks(N), 2 * int64_t(C), C);
  if (dbias != nullptr) combine_blocks(dbias, scratch + C, row_blocks(N), 2 * int64_t(C), C);
}

template <typename S>
void layernorm_backward_input(S* dinp, const S* dout, const S* inp, const S* weight,
                              const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const int64_t o = int64_t(n) * C;
    layernorm_row_dx(dinp + o, dout + o, inp + o, weight, mean[n], rstd[n], C);
  }
}

template <typename S, typename G>
void layernorm_backward_weight(G* dweight, G* dbias, float* scratch, const S* dout, const S* inp,
                               const float* mean, const float* rstd, int N, int C) {
  for_row_blocks(N, C, [&](int blk, int n0, int n1) {
    float* part = scratch + int64_t(blk) * 2 * C;  // (2, C)
    std::fill(part, part + 2 * int64_t(C), 0.0f);
    for (int n = n0; n < n1; ++n) {
      const int64_t o = int64_t(n) * C;
      layernorm_row_dw(part, part + C, dout + o, inp + o, mean[n], rstd[n], C);
    }
  });
  combine_blocks(dweight, scratch, row_blocks(N), 2 * int64_t(C), C);
  if (dbias != nullptr) combine_blocks(dbias, scratch + C, row_blocks(N), 2 * int64_t(C), C);
}

template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int N, int C, float eps,
                     float w_offset) {
  const float off = gain_offset(w_offset);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + int64_t(n) * C;  // (C)
    S* o = out + int64_t(n) * C;        // (C)
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) ss += load(x[c]) * load(x[c]);
    float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = store<S>(load(x[c]) * r * (off + load(weight[c])));
    if (rstd != nullptr) rstd[n] = r;
  }
}

// scratch (blocks, C): per row block, Σ dout·xhat.
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, float* scratch, const S* dout, const S* inp,
                      const S* weight, const float* rstd, int N, int C, float w_offset) {
  const float off = gain_offset(w_offset);
  for_row_blocks(N, C, [&](int blk, int n0, int n1) {
    float* part = scratch + int64_t(blk) * C;  // (C)
    std::fill(part, part + C, 0.0f);
    for (int n = n0; n < n1; ++n) {
      const int64_t o = int64_t(n) * C;
      rmsnorm_row_dx(dinp + o, dout + o, inp + o, weight, off, rstd[n], C);
      rmsnorm_row_dw(part, dout + o, inp + o, rstd[n], C);
    }
  });
  combine_blocks(dweight, scratch, row_blocks(N), C, C);
}

template <typename S>
void rmsnorm_backward_input(S* dinp, const S* dout, const S* inp, const S* weight,
                            const float* rstd, int N, int C, float w_offset) {
  const float off = gain_offset(w_offset);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * C >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const int64_t o = int64_t(n) * C;
    rmsnorm_row_dx(dinp + o, dout + o, inp + o, weight, off, rstd[n], C);
  }
}

template <typename S, typename G>
void rmsnorm_backward_weight(G* dweight, float* scratch, const S* dout, const S* inp,
                             const float* rstd, int N, int C) {
  for_row_blocks(N, C, [&](int blk, int n0, int n1) {
    float* part = scratch + int64_t(blk) * C;  // (C)
    std::fill(part, part + C, 0.0f);
    for (int n = n0; n < n1; ++n) {
      const int64_t o = int64_t(n) * C;
      rmsnorm_row_dw(part, dout + o, inp + o, rstd[n], C);
    }
  });
  combine_blocks(dweight, scratch, row_blocks(N), C, C);
}

#define INSTANTIATE_S(S)                                                                         \
  template void layernorm_forward<S>(S*, float*, float*, const S*, const S*, const S*, int, int, \
                                     float);                                                     \
  template void rmsnorm_forward<S>(S*, float*, const S*, const S*, int, int, float, float);      \
  template void layernorm_backward_input<S>(S*, const S*, const S*, const S*, const float*,      \
                                            const float*, int, int);                             \
  template void rmsnorm_backward_input<S>(S*, const S*, const S*, const S*, const float*, int,   \
                                          int, float);
#define INSTANTIATE_SG(S, G)                                                                       \
  template void layernorm_backward<S, G>(S*, G*, G*, float*, const S*, const S*, const S*,         \
                                         const float*, const float*, int, int);                    \
  template void rmsnorm_backward<S, G>(S*, G*, float*, const S*, const S*, const S*, const float*, \
                                       int, int, float);                                           \
  template void layernorm_backward_weight<S, G>(G*, G*, float*, const S*, const S*, const float*,  \
                                                const float*, int, int);                           \
  template void rmsnorm_backward_weight<S, G>(G*, float*, const S*, const S*, const float*, int,   \
                                              int);
STRATA_FOR_EACH_S(INSTANTIATE_S)
STRATA_FOR_EACH_SG(INSTANTIATE_SG)

}  // namespace strata::kernels
