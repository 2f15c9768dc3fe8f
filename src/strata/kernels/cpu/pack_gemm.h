// A GEMM of its own for half-precision operands on CPUs without a bf16 dot product: operands are
// widened to fp32 while they are packed into the cache-sized panels every fast GEMM copies them
// into anyway, and a half-precision result is rounded as it leaves the registers. It replaces
// "widen each operand into a workspace, multiply in fp32, narrow the result", whose three extra
// passes over memory made bf16 slower than fp32 there. The math is the same: products of
// exactly widened operands, accumulated in fp32, rounded once.
//
// Blocking follows BLIS (Goto's algorithm): columns in blocks, depth in blocks of KC, rows in
// blocks of MC. The threads split the rows and run without a barrier: each packs its own blocks
// of b (NC / threads columns) as well as its rows of a. Each element is the fp32 sum of its K
// products in k order, in blocks of KC, whatever the shape, position or thread count: a product
// split by rows or columns (data, tensor or sequence parallel) gives the same bits in every piece.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strata/kernels/cpu/matmul.h"

namespace strata::kernels {

enum class PackKernel { Avx2, Avx512 };  // micro-kernels of 6 x 16 and 12 x 32 fp32 elements

// The micro-kernels this CPU can run, fastest first: AVX-512F, AVX2 with FMA; empty where it has
// neither (matmul then widens into a workspace instead).
const std::vector<PackKernel>& pack_gemm_kernels();
const char* pack_kernel_name(PackKernel k);  // "avx512" | "avx2"

// c (M,N) = alpha · a (M,K) · b (K,N) (+ c with accumulate), unbatched; each operand and the
// result fp32, bf16 or fp16. Runs the fastest kernel, which must exist. Not reentrant (shared
// packing buffers).
void pack_gemm(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N,
               int64_t K, float alpha, bool accumulate);
// The same on a chosen kernel of pack_gemm_kernels() (tests cover each on one CPU).
void pack_gemm(PackKernel kernel, const MatOut& c, const MatOperand& a, const MatOperand& b,
               int64_t M, int64_t N, int64_t K, float alpha, bool accumulate);

// Every group's product (matmul.h's MatGroup) in one parallel pass (a mixture of experts'
// projections, one group per expert): the threads split the groups' rows by cost, not each group's
// rows. A group with no rows or no depth is skipped (its c untouched). Each element is what
// pack_gemm gives for its group alone, bit for bit.
void pack_gemm_grouped(PackKernel kernel, std::span<const MatGroup> groups, int64_t N, float alpha,
                       bool accumulate);

}  // namespace strata::kernels
