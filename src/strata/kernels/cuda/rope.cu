// Rotary position embedding on the GPU (backend.h rope_forward / rope_backward), the CPU's
// formula (kernels/cpu/rope.h, Hugging Face's rotate_half) from the same table of frequencies
// (ops::Rope, passed by value): of a head's hd values the first rotary_dim rotate, element
// i < rotary_dim/2 pairing with i + rotary_dim/2, by angle = t · inv_freq[i] (t the row's
// position, or with documents its position in its document); cos and sin are multiplied by
// attention_factor; the other values pass through.
//
// The angles follow the CPU's fp32 steps: t · inv_freq is an fp32 product of the CPU's own table.
// The CPU's cos and sin of floats are glibc's cosf and sinf, which evaluate in double and round
// once to float (within 0.56 ulp); here they are evaluated in double and rounded once to float
// too, rather than with CUDA's sinf and cosf (up to 2 ulp off), so the tables agree with the
// CPU's but for rare last-bit differences. The rotation itself may be contracted to fma
// differently by the two compilers (at most an ulp of fp32, before the rounding to S).
#include <cstdint>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 128;

// x: B·T rows of row_stride elements; row b·T + t has position t, and rotates by t, or with
// documents (doc (B, seq), or nullptr) by t − doc[b·seq + t]. In each row, `groups` groups from
// column g·group_stride, and the first nheads heads (hd elements each) of every group rotate
// their first rope.rotary_dim values by +angle (sign 1) or −angle (sign −1). Grid (T, B): a block
// per row, which first tabulates cos and ±sin of its rotation's rotary_dim/2 angles in shared
// memory (rotary_dim floats), then rotates every pair of the row.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    rotate(S* x, int T, int groups, int nheads, int hd, int64_t group_stride, int64_t row_stride,
           const Rope rope, float sign, const int32_t* doc, int seq) {
  extern __shared__ float table[];  // cos (rotary_dim/2), then ±sin (rotary_dim/2)
  const int t = blockIdx.x, b = blockIdx.y;
  const int rot = doc != nullptr ? t - doc[int64_t(b) * seq + t] : t;
  const int half = rope.rotary_dim / 2;
  float* cs = table;
  float* sn = table + half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = float(rot) * rope.inv_freq[i];
    cs[i] = float(cos(double(angle))) * rope.attention_factor;
    sn[i] = sign * float(sin(double(angle))) * rope.attention_factor;
  }
  __syncthreads();
  S* row = x + (int64_t(b) * T + t) * row_stride;  // (row_stride)
  const int pairs = groups * nheads * half;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int i = e % half, head = e / half;
    S* lo = row + (head / nheads) * group_stride + int64_t(head % nheads) * hd;  // (half)
    S* hi = lo + half;                                                           // (half)
    const float a = to_f(lo[i]), c = to_f(hi[i]);
    lo[i] = from_f<S>(a * cs[i] - c * sn[i]);
    hi[i] = from_f<S>(c * cs[i] + a * sn[i]);
  }
}

// The rep query heads and the key head of every group rotate; the value heads do not.
void rope(const char* op, Tensor qkv, const AttentionShape& s, const Rope& r, float sign) {
  STRATA_CHECK(s.B <= 65535, op, ": B=", s.B, " exceeds the CUDA rope's grid (B at most 65535)");
  const int64_t group = int64_t(s.rep + 2) * s.hd;
  const int64_t row = s.groups * group;
  with_type(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    rotate<S><<<dim3(unsigned(s.T), unsigned(s.B)), kThreads, r.rotary_dim * sizeof(float),
                compute_stream()>>>(dev<S>(qkv), s.T, s.groups, s.rep + 1, s.hd, group, row, r,
                                    sign, s.doc_begin, s.seq);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace

void rope_forward(Tensor qkv, const AttentionShape& s, const Rope& r) {
  rope("rope_forward", qkv, s, r, 1.0f);
}

void rope_backward(Tensor dqkv, const AttentionShape& s, const Rope& r) {
  rope("rope_backward", dqkv, s, r, -1.0f);
}

}  // namespace strata::ops::cuda
