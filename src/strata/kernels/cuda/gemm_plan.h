// The arithmetic of the CUDA backend's products (gemm.cc) and bias gradient (bias_grad.cu), in
// plain C++ so that CPU tests cover it without a GPU: how a row-major product maps onto
// cuBLASLt's column-major call, the products of the linear layers, the key a cached cuBLASLt plan
// is found by, and the bias-gradient kernel's grid.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "strata/core/dtype.h"
#include "strata/core/tensor.h"

namespace strata::ops::cuda {

// --- the product -------------------------------------------------------------------------------
// C (M, N) = op(A) (M, K) · op(B) (K, N), every matrix row-major as stored, with row strides
// lda, ldb, ldc (ops::Gemm's fields): A is stored (M, K), or (K, M) when trans_a; B (K, N), or
// (N, K) when trans_b.
struct RowMajorProduct {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
};

// A column-major matrix as a cuBLASLt layout describes it: (rows, cols), column stride ld.
struct ColLayout {
  int64_t rows = 0, cols = 0, ld = 0;
};

// The cuBLASLt call computing a RowMajorProduct: D (m, n) = op(a) (m, k) · op(b) (k, n),
// column-major. A row-major (r, c) matrix with row stride ld is, read column-major, its
// transpose (c, r) with the same ld; so C is Dᵀ, and C = op(A)·op(B) is D = op(B)ᵀ·op(A)ᵀ:
// cuBLASLt's `a` is B's memory and its `b` is A's (the operands swap), each transposed in the
// call exactly where it is in the row-major product.
struct LtProduct {
  int64_t m = 0, n = 0, k = 0;  // m = N, n = M, k = K
  bool trans_a = false;         // TRANSA, on B's memory: trans_b
  bool trans_b = false;         // TRANSB, on A's memory: trans_a
  ColLayout a, b, d;            // as stored, before TRANSA/TRANSB; C's layout is d's
};

constexpr LtProduct lt_product(const RowMajorProduct& p) {
  LtProduct lt;
  lt.m = p.N, lt.n = p.M, lt.k = p.K;
  lt.trans_a = p.trans_b, lt.trans_b = p.trans_a;
  // B stored (K, N) reads as (N, K) = op(B)ᵀ already; stored (N, K) reads as (K, N), transposed.
  lt.a = p.trans_b ? ColLayout{p.K, p.N, p.ldb} : ColLayout{p.N, p.K, p.ldb};
  // A stored (M, K) reads as (K, M) = op(A)ᵀ already; stored (K, M) reads as (M, K), transposed.
  lt.b = p.trans_a ? ColLayout{p.M, p.K, p.lda} : ColLayout{p.K, p.M, p.lda};
  lt.d = ColLayout{p.N, p.M, p.ldc};
  return lt;
}

// --- the linear layers' products (weights (N, K), activations (M, K), ops.h) -------------------
// y (M, N) = x (M, K) · wᵀ: A = x, B = w read transposed.
constexpr RowMajorProduct linear_forward_product(int64_t M, int64_t K, int64_t N) {
  return {M, N, K, false, true, K, K, N};
}
// dx (M, K) = dy (M, N) · w (N, K).
constexpr RowMajorProduct linear_dx_product(int64_t M, int64_t K, int64_t N) {
  return {M, K, N, false, false, N, K, K};
}
// dw (N, K) = dyᵀ (N, M) · x (M, K): A = dy read transposed.
constexpr RowMajorProduct linear_dw_product(int64_t M, int64_t K, int64_t N) {
  return {N, K, M, true, false, N, K, K};
}

// --- the plan cache's key ----------------------------------------------------------------------
// What is fused after the product: nothing, or a bias (N) added to every row of C (cuBLASLt's
// BIAS epilogue: a vector along D's rows, which are C's columns).
enum class Epilogue : uint8_t { None, Bias };

// The alignment cuBLASLt may assume of a pointer: the largest power of two dividing its address,
// at most 256 (cuBLASLt's default assumption, and the bound of its MIN_ALIGNMENT preferences).
constexpr uint32_t pointer_alignment(uintptr_t address) {
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// Everything a cuBLASLt plan (descriptors, layouts, the heuristic's algorithm) depends on: the
// dtypes of A, B, C, the product's shape and strides, the epilogue, beta (0, or 1 with
// accumulate: whether C is read), and the alignments of the pointers (the heuristic picks
// algorithms by them; 0 for an absent bias). Alpha is not part of it: it is passed per call.
struct PlanKey {
  std::array<uint64_t, 8> words{};
  bool operator==(const PlanKey&) const = default;
};

constexpr PlanKey plan_key(const RowMajorProduct& p, DType a, DType b, DType c, Epilogue e,
                           bool accumulate, uint32_t align_a, uint32_t align_b, uint32_t align_c,
                           uint32_t align_bias) {
  const uint64_t kinds = uint64_t(a) | uint64_t(b) << 8 | uint64_t(c) << 16 |
                         uint64_t(p.trans_a) << 24 | uint64_t(p.trans_b) << 25 |
                         uint64_t(accumulate) << 26 | uint64_t(e) << 27;
  const uint64_t aligns = uint64_t(align_a) | uint64_t(align_b) << 16 | uint64_t(align_c) << 32 |
                          uint64_t(align_bias) << 48;
  return {{kinds, aligns, uint64_t(p.M), uint64_t(p.N), uint64_t(p.K), uint64_t(p.lda),
           uint64_t(p.ldb), uint64_t(p.ldc)}};
}

struct PlanKeyHash {
  // splitmix64's finaliser over the words in turn: a change in any bit of any word reaches
  // every bit of the hash.
  static constexpr uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  constexpr size_t operator()(const PlanKey& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint64_t w : k.words) h = mix(h ^ w);
    return size_t(h);
  }
};

// --- the bias gradient (bias_grad.cu) ----------------------------------------------------------
// db (N) += Σ_m dy (M, N) in fp32, rounded once into db; no float atomics. Blocks of
// kBiasGradCols × kBiasGradRowThreads threads: block (bx, by) sums columns [32·bx, 32·bx + 32)
// over rows [chunk_rows·by, chunk_rows·(by + 1)); thread (tx, ty) adds its column's rows ty,
// ty + 8, ... of the chunk in order (a warp reads 32 adjacent columns of one row), then the 8 row
// threads' sums are added in order. With several row chunks, each writes its column sums to fp32
// scratch (row_chunks, N) and a second kernel adds the chunks in order into db. The split depends
// on (M, N) alone, so the bits do not depend on the device.
inline constexpr int kBiasGradCols = 32;
inline constexpr int kBiasGradRowThreads = 8;

struct BiasGradLaunch {
  int64_t col_blocks = 0, row_chunks = 0, chunk_rows = 0;
  size_t scratch_floats = 0;  // (row_chunks, N) partial sums; 0 with one chunk
};

// About 512 blocks (a few waves of an H100/H200's 132 SMs) where the rows allow: several chunks
// only of at least 64 rows each, every chunk a multiple of the row threads, none empty. M, N > 0.
constexpr BiasGradLaunch bias_grad_launch(int64_t M, int64_t N) {
  constexpr int64_t kTargetBlocks = 512, kMinChunkRows = 64;
  BiasGradLaunch l;
  l.col_blocks = (N + kBiasGradCols - 1) / kBiasGradCols;
  const int64_t max_chunks = M / kMinChunkRows > 1 ? M / kMinChunkRows : 1;
  int64_t chunks = (kTargetBlocks + l.col_blocks - 1) / l.col_blocks;
  if (chunks > max_chunks) chunks = max_chunks;
  const int64_t rows = (M + chunks - 1) / chunks;
  l.chunk_rows = (rows + kBiasGradRowThreads - 1) / kBiasGradRowThreads * kBiasGradRowThreads;
  l.row_chunks = (M + l.chunk_rows - 1) / l.chunk_rows;
  l.scratch_floats = l.row_chunks > 1 ? size_t(l.row_chunks * N) : 0;
  return l;
}

// db (N) += Σ_rows dy (M, N) on the compute stream (bias_grad.cu); db's dtype is dy's or fp32.
void bias_grad(Tensor db, Tensor dy);

}  // namespace strata::ops::cuda
