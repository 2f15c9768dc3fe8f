#include "strata/kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {
// Channels per backward task: 64 keeps a task's rows of dwte in whole cache lines for every G.
constexpr int kChannelBlock = 64;

// The position table's row of row n (position_forward).
inline int64_t table_row(int64_t n, int T, int64_t pos0, const int32_t* pos,
                         const int32_t* doc_begin, int64_t seq) {
  const int64_t t = (pos0 + n) % T, p = pos != nullptr ? pos[t] : t;
  return doc_begin != nullptr ? p - doc_begin[(pos0 + n) / T * seq + p] : p;
}
}  // namespace

template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* rows, int64_t row_begin,
                       int64_t row_end, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(B) * T * C >= kParallelMinWork)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const int64_t r = tokens[bt];
    if (r < row_begin || r >= row_end) continue;
    std::memcpy(out + bt * C, rows + (r - row_begin) * C, sizeof(S) * size_t(C));
  }
}

template <typename S>
void position_forward(S* out, const S* wpe, int64_t N, int T, int C, int64_t pos0,
                      const int32_t* pos, const int32_t* doc_begin, int64_t seq) {
#pragma omp parallel for schedule(static) if (parallel : N * C >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    S* o = out + n * C;                                                 // (C)
    const S* p = wpe + table_row(n, T, pos0, pos, doc_begin, seq) * C;  // (C)
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = store<S>(load(o[c]) + load(p[c]));
  }
}

template <typename S, typename G>
void embedding_backward(G* drows, int64_t row_begin, int64_t row_end, const S* dout,
                        const int32_t* tokens, int B, int T, int C) {
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (parallel : int64_t(B) * T * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
      const int64_t r = tokens[bt];
      if (r < row_begin || r >= row_end) continue;
      const S* d = dout + bt * C;          // (C)
      G* g = drows + (r - row_begin) * C;  // (C)
#pragma omp simd
      for (int c = c0; c < c1; ++c) g[c] = store<G>(load(g[c]) + load(d[c]));
    }
  }
}

namespace {

// With documents the rows of one table row are not every T-th: each channel block sums them by
// table row into fp32 (R, kChannelBlock) in increasing n, then adds the sums of the rows some n
// reached. The sums live in the kernel's workspace (not reentrant, as the other kernels'), with R
// flags after them.
template <typename S, typename G>
void position_backward_documents(G* dwpe, const S* dout, int64_t N, int T, int C, int64_t pos0,
                                 const int32_t* pos, const int32_t* doc_begin, int64_t seq) {
  int64_t R = 0;  // the table rows reached lie in [0, R)
  for (int64_t n = 0; n < N; ++n) R = std::max(R, table_row(n, T, pos0, pos, doc_begin, seq) + 1);
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
  static Buffer buf;
  float* sums = reserve_floats(buf, (int64_t(nblocks) * kChannelBlock + 1) * R);
  float* reached = sums + int64_t(nblocks) * kChannelBlock * R;  // (R): 1 where some n reaches
  std::fill(sums, reached + R, 0.0f);
  for (int64_t n = 0; n < N; ++n) reached[table_row(n, T, pos0, pos, doc_begin, seq)] = 1.0f;
#pragma omp parallel for schedule(static) if (parallel : N * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    float* acc = sums + int64_t(blk) * kChannelBlock * R;  // (R, kChannelBlock)
    for (int64_t n = 0; n < N; ++n) {
      const S* d = dout + n * C;                                                    // (C)
      float* a = acc + table_row(n, T, pos0, pos, doc_begin, seq) * kChannelBlock;  // (block)
#pragma omp simd
      for (int c = c0; c < c1; ++c) a[c - c0] += load(d[c]);
    }
    for (int64_t r = 0; r < R; ++r) {
      if (reached[r] == 0.0f) continue;
      G* g = dwpe + r * C;                       // (C)
      const float* a = acc + r * kChannelBlock;  // (block)
#pragma omp simd
      for (int c = c0; c < c1; ++c) g[c] = store<G>(load(g[c]) + a[c - c0]);
    }
  }
}

}  // namespace

template <typename S, typename G>
void position_backward(G* dwpe, const S* dout, int64_t N, int T, int C, int64_t pos0,
                       const int32_t* pos, const int32_t* doc_begin, int64_t seq) {
  if (doc_begin != nullptr) {
    return position_backward_documents(dwpe, dout, N, T, C, pos0, pos, doc_begin, seq);
  }
  const int nblocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (parallel : N * C >= kParallelMinWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int t = 0; t < T; ++t) {
      G* g = dwpe + int64_t(pos != nullptr ? pos[t] : t) * C;  // (C)
      float acc[kChannelBlock];
#pragma omp simd
      for (int c = c0; c < c1; ++c) acc[c - c0] = 0.0f;
      // The rows at position t: n ≡ t − pos0 (mod T).
      for (int64_t n = ((t - pos0) % T + T) % T; n < N; n += T) {
        const S* d = dout + n * C;  // (C)
#pragma omp simd
        for (int c = c0; c < c1; ++c) acc[c - c0] += load(d[c]);
      }
#pragma omp simd
      for (int c = c0; c < c1; ++c) g[c] = store<G>(load(g[c]) + acc[c - c0]);
    }
  }
}

int64_t find_token_outside(const int32_t* tokens, int64_t n, int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < lo || tokens[i] >= hi) return i;
  }
  return -1;
}

int64_t count_nonnegative(const int32_t* tokens, int64_t n) {
  int64_t count = 0;
#pragma omp simd reduction(+ : count)
  for (int64_t i = 0; i < n; ++i) count += tokens[i] >= 0 ? 1 : 0;
  return count;
}

#define INSTANTIATE_S(S)                                                                       \
  template void embedding_forward<S>(S*, const int32_t*, const S*, int64_t, int64_t, int, int, \
                                     int);                                                     \
  template void position_forward<S>(S*, const S*, int64_t, int, int, int64_t, const int32_t*,  \
                                    const int32_t*, int64_t);
#define INSTANTIATE_SG(S, G)                                                                       \
  template void embedding_backward<S, G>(G*, int64_t, int64_t, const S*, const int32_t*, int, int, \
                                         int);                                                     \
  template void position_backward<S, G>(G*, const S*, int64_t, int, int, int64_t, const int32_t*,  \
                                        const int32_t*, int64_t);
STRATA_FOR_EACH_S(INSTANTIATE_S)
STRATA_FOR_EACH_SG(INSTANTIATE_SG)

}  // namespace strata::kernels
