// Matrix multiply on the CPU through oneDNN. Primitives are created once per shape and cached;
// executing one allocates nothing. Operands and result may each be fp32, bf16 or fp16. Two bf16
// operands run on oneDNN's bf16 kernels where the CPU has a bf16 dot product (cpu_features.h);
// anything else (no such instructions, fp16, mixed operand types) is multiplied in fp32 on
// exactly widened operands: on pack_gemm (pack_gemm.h), which widens while it packs, for
// unbatched products of many rows; else widened into a cached workspace for oneDNN's sgemm.
// Results are the same up to accumulation order.
// Not reentrant: calls from several threads at once share the cached plans and workspace.
#pragma once

#include <cstdint>
#include <span>

#include "strata/core/dtype.h"

namespace strata::kernels {

// One operand of a (batched) matmul: element (b0, b1, i, j) is at
//   ptr + b0*batch_stride[0] + b1*batch_stride[1] + i*row_stride + j*col_stride   (in elements)
// For a row-major [rows, cols] matrix: row_stride = ld, col_stride = 1; transposed: (1, ld).
struct MatOperand {
  const void* ptr;
  DType dtype;
  int64_t row_stride;
  int64_t col_stride;
  int64_t batch_stride[2] = {0, 0};
};

struct MatOut {
  void* ptr;
  DType dtype;
  int64_t row_stride;
  int64_t batch_stride[2] = {0, 0};
};

// Whether a product of `rows` rows (0: a batched product) widens its operands of dtype t into a
// workspace copy first: half precision with no native kernel on this CPU, in a product batched or
// too small for pack_gemm. A caller holding them in fp32 already saves that copy.
bool matmul_widens(DType t, int64_t rows = 0);

// A dense (rows, cols) bf16 or fp16 matrix widened to fp32 in the workspace's input slot `slot`
// (0 or 1; valid until that slot's next use), for a caller whose products would otherwise widen
// the same operand blocks many times over.
const float* widen_input(int slot, const void* src, DType t, int64_t rows, int64_t cols);

// c[b0,b1] (M,N) = alpha * a[b0,b1] (M,K) · b[b0,b1] (K,N) + (accumulate ? c : 0)
// batch = {B0, B1}, each >= 1. With accumulate, c is read and added to (the += of backward).
void matmul(MatOut c, MatOperand a, MatOperand b, int64_t M, int64_t N, int64_t K,
            const int64_t batch[2], float alpha = 1.0f, bool accumulate = false);

// One product of a grouped GEMM: c (M, N) = alpha · a (M, K) · b (K, N) (+ c), N shared.
struct MatGroup {
  MatOut c;
  MatOperand a, b;
  int64_t M = 0, K = 0;
};
// Every group's product, unbatched; a group with no rows or no depth is skipped. On pack_gemm
// where this CPU runs it (pack_gemm_grouped: one parallel pass over all the groups, each element
// what pack_gemm gives for its group alone, whatever the other groups hold), else one matmul per
// group.
void grouped_matmul(std::span<const MatGroup> groups, int64_t N, float alpha = 1.0f,
                    bool accumulate = false);

// Linear layers, weights stored [N, K] (out_features, in_features) as PyTorch does.
// out (M,N) = inp (M,K) · weight (N,K)ᵀ + bias (N) [bias may be null]
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t M, int64_t K,
                    int64_t N);
// dinp (M,K) = dout (M,N) · weight (N,K)           (dinp may be null; written, not accumulated)
// dweight (N,K) += dout ᵀ · inp                    (parameter gradients accumulate)
// dbias (N) += Σ_m dout                            (dbias may be null)
template <typename T, typename G>
void linear_backward(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t M, int64_t K, int64_t N);
// The same two halves apart, bit for bit what linear_backward gives:
// dinp (M,K) = dout · weight, or += with accumulate;
template <typename T>
void linear_backward_input(T* dinp, const T* dout, const T* weight, int64_t M, int64_t K, int64_t N,
                           bool accumulate);
// dweight (N,K) += doutᵀ · inp; dbias (N) += Σ_m dout. Either may be null (without dweight, inp
// is not read and K is unused).
template <typename T, typename G>
void linear_backward_weight(G* dweight, G* dbias, const T* dout, const T* inp, int64_t M, int64_t K,
                            int64_t N);

}  // namespace strata::kernels
