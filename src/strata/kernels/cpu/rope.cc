#include "strata/kernels/cpu/rope.h"

#include <cmath>

#include "strata/core/check.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

constexpr int kMaxHalf = 512;  // cos/sin of one position live on the stack

// Rotates the rotated heads of rows at position t (one per batch element) by +angle (sign 1) or
// -angle (sign -1). cos/sin are computed once per position and shared by all B·groups·nheads
// heads; with documents, once per rotation position, which the batch elements share only where
// their documents start alike.
template <typename S>
void rotate(S* x, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
            int64_t row_stride, const float* inv_freq, int rotary_dim, float attention_factor,
            float sign, const int32_t* pos, const int32_t* doc_begin, int seq) {
  STRATA_CHECK(
      rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= hd && rotary_dim / 2 <= kMaxHalf,
      "rope needs an even rotary dim in (0, min(hd=", hd, ", ", 2 * kMaxHalf, ")], got ",
      rotary_dim);
  const int half = rotary_dim / 2;
  const int64_t work = int64_t(B) * T * groups * nheads * rotary_dim;
#pragma omp parallel for schedule(static) if (parallel : work >= kParallelMinWork)
  for (int t = 0; t < T; ++t) {
    float cs[kMaxHalf], sn[kMaxHalf];
    const int p = pos != nullptr ? pos[t] : t;
    int64_t tabled = -1;  // the rotation position cs and sn hold
    for (int b = 0; b < B; ++b) {
      const int64_t rot = doc_begin != nullptr ? p - doc_begin[int64_t(b) * seq + p] : p;
      if (rot != tabled) {
        for (int i = 0; i < half; ++i) {
          float angle = float(rot) * inv_freq[i];
          cs[i] = std::cos(angle) * attention_factor;
          sn[i] = sign * std::sin(angle) * attention_factor;
        }
        tabled = rot;
      }
      S* row = x + (int64_t(b) * T + t) * row_stride;  // (row_stride)
      for (int g = 0; g < groups; ++g) {
        for (int h = 0; h < nheads; ++h) {
          S* lo = row + g * group_stride + int64_t(h) * hd;  // (rotary_dim/2)
          S* hi = lo + half;                                 // (rotary_dim/2)
#pragma omp simd
          for (int i = 0; i < half; ++i) {
            float a = load(lo[i]), c = load(hi[i]);
            lo[i] = store<S>(a * cs[i] - c * sn[i]);
            hi[i] = store<S>(c * cs[i] + a * sn[i]);
          }
        }
      }
    }
  }
}

}  // namespace

template <typename S>
void rope_forward(S* x, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                  int64_t row_stride, const float* inv_freq, int rotary_dim, float attention_factor,
                  const int32_t* pos, const int32_t* doc_begin, int seq) {
  rotate(x, B, T, groups, nheads, hd, group_stride, row_stride, inv_freq, rotary_dim,
         attention_factor, 1.0f, pos, doc_begin, seq);
}

// The rotation by −angle is the transpose of that by +angle; the factor scales both alike.
template <typename S>
void rope_backward(S* dx, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                   int64_t row_stride, const float* inv_freq, int rotary_dim,
                   float attention_factor, const int32_t* pos, const int32_t* doc_begin, int seq) {
  rotate(dx, B, T, groups, nheads, hd, group_stride, row_stride, inv_freq, rotary_dim,
         attention_factor, -1.0f, pos, doc_begin, seq);
}

#define INSTANTIATE_S(S)                                                                           \
  template void rope_forward<S>(S*, int, int, int, int, int, int64_t, int64_t, const float*, int,  \
                                float, const int32_t*, const int32_t*, int);                       \
  template void rope_backward<S>(S*, int, int, int, int, int, int64_t, int64_t, const float*, int, \
                                 float, const int32_t*, const int32_t*, int);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
