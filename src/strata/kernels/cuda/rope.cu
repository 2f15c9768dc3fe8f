// Rotary position embedding on the GPU (backend.h rope_forward / rope_backward), the CPU's
// formula (kernels/cpu/rope.h, Hugging Face's rotate_half): element i < hd/2 of a head pairs with
// i + hd/2 and rotates by angle = t · inv_freq[i], inv_freq[i] = 1 / theta^(2i/hd).
//
// The angles follow the CPU's fp32 steps: the exponent 2i/hd, the quotient 1/pow and t · inv_freq
// are fp32 operations. The CPU's pow, cos and sin of floats are glibc's powf, cosf and sinf,
// which evaluate in double and round once to float (within 0.82, 0.56 and 0.56 ulp); here they
// are evaluated in double and rounded once to float too, rather than with CUDA's powf, sinf and
// cosf (up to 4, 2 and 2 ulp off), so the tables agree with the CPU's but for rare last-bit
// differences. The rotation itself may be contracted to fma differently by the two compilers
// (at most an ulp of fp32, before the rounding to S).
#include <cstdint>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 128;

// x: B·T rows of row_stride elements; row b·T + t has position t. In each row, `groups` groups
// from column g·group_stride, and the first nheads heads (hd elements each) of every group
// rotate by +angle (sign 1) or −angle (sign −1). Grid (T, B): a block per row, which first
// tabulates cos and ±sin of its position's hd/2 angles in shared memory (hd floats), then
// rotates every pair of the row.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    rotate(S* x, int T, int groups, int nheads, int hd, int64_t group_stride, int64_t row_stride,
           float theta, float sign) {
  extern __shared__ float table[];  // cos (hd/2), then ±sin (hd/2)
  const int t = blockIdx.x, b = blockIdx.y;
  const int half = hd / 2;
  float* cs = table;
  float* sn = table + half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = 1.0f / float(pow(double(theta), double(float(2 * i) / float(hd))));
    const float angle = float(t) * inv_freq;
    cs[i] = float(cos(double(angle)));
    sn[i] = sign * float(sin(double(angle)));
  }
  __syncthreads();
  S* row = x + (int64_t(b) * T + t) * row_stride;  // (row_stride)
  const int pairs = groups * nheads * half;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int i = e % half, head = e / half;
    S* lo = row + (head / nheads) * group_stride + int64_t(head % nheads) * hd;  // (hd/2)
    S* hi = lo + half;                                                           // (hd/2)
    const float a = to_f(lo[i]), c = to_f(hi[i]);
    lo[i] = from_f<S>(a * cs[i] - c * sn[i]);
    hi[i] = from_f<S>(c * cs[i] + a * sn[i]);
  }
}

// The rep query heads and the key head of every group rotate; the value heads do not.
void rope(const char* op, Tensor qkv, const AttentionShape& s, float theta, float sign) {
  STRATA_CHECK(s.hd % 2 == 0, op, ": rope needs an even head dim, got ", s.hd);
  STRATA_CHECK(s.B <= 65535, op, ": B=", s.B, " exceeds the CUDA rope's grid (B at most 65535)");
  const int64_t group = int64_t(s.rep + 2) * s.hd;
  const int64_t row = s.groups * group;
  with_type(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    rotate<S>
        <<<dim3(unsigned(s.T), unsigned(s.B)), kThreads, s.hd * sizeof(float), compute_stream()>>>(
            dev<S>(qkv), s.T, s.groups, s.rep + 1, s.hd, group, row, theta, sign);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace

void rope_forward(Tensor qkv, const AttentionShape& s, float theta) {
  rope("rope_forward", qkv, s, theta, 1.0f);
}

void rope_backward(Tensor dqkv, const AttentionShape& s, float theta) {
  rope("rope_backward", dqkv, s, theta, -1.0f);
}

}  // namespace strata::ops::cuda
