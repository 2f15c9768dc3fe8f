// The CUDA backend's product arithmetic (kernels/cuda/gemm_plan.h), on the CPU: the column-major
// cuBLASLt call a row-major product maps onto computes that product for every transpose
// combination, padded strides included (a reference reads the buffers exactly as cuBLASLt reads
// its layouts); the linear layers' products are theirs; plan keys tell apart every field a plan
// depends on; and the bias gradient's grid covers every row and column once.
#include "strata/kernels/cuda/gemm_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

namespace strata::ops::cuda {
namespace {

// The storage of a row-major matrix of `rows` rows with row stride ld, padding included, every
// element distinct (quarters: the products below are exact in double).
std::vector<double> filled(int64_t rows, int64_t ld, double base) {
  std::vector<double> v(size_t(rows * ld));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25 * double(i);
  return v;
}

// Element (r, c) of a column-major layout over `mem`, checked to lie inside it.
double col_major(const std::vector<double>& mem, const ColLayout& l, int64_t r, int64_t c) {
  EXPECT_TRUE(r < l.rows && c < l.cols);
  const int64_t at = r + c * l.ld;
  EXPECT_LT(at, int64_t(mem.size()));
  return mem[size_t(at)];
}

// What cublasLtMatmul computes: D (m, n) = op(a) · op(b) (+ D with accumulate), every matrix
// column-major as its layout says; TRANSA/TRANSB transpose the stored (rows, cols).
void lt_reference(const LtProduct& lt, const std::vector<double>& a, const std::vector<double>& b,
                  std::vector<double>& d, bool accumulate) {
  // cuBLASLt's layout constraints: op(a) is (m, k), op(b) (k, n), D (m, n), each ld >= rows.
  EXPECT_EQ(lt.a.rows, lt.trans_a ? lt.k : lt.m);
  EXPECT_EQ(lt.a.cols, lt.trans_a ? lt.m : lt.k);
  EXPECT_EQ(lt.b.rows, lt.trans_b ? lt.n : lt.k);
  EXPECT_EQ(lt.b.cols, lt.trans_b ? lt.k : lt.n);
  EXPECT_EQ(lt.d.rows, lt.m);
  EXPECT_EQ(lt.d.cols, lt.n);
  EXPECT_GE(lt.a.ld, lt.a.rows);
  EXPECT_GE(lt.b.ld, lt.b.rows);
  EXPECT_GE(lt.d.ld, lt.d.rows);
  for (int64_t j = 0; j < lt.n; ++j) {
    for (int64_t i = 0; i < lt.m; ++i) {
      double s = 0;
      for (int64_t l = 0; l < lt.k; ++l) {
        const double x = lt.trans_a ? col_major(a, lt.a, l, i) : col_major(a, lt.a, i, l);
        const double y = lt.trans_b ? col_major(b, lt.b, j, l) : col_major(b, lt.b, l, j);
        s += x * y;
      }
      double& out = d[size_t(i + j * lt.d.ld)];
      out = accumulate ? out + s : s;
    }
  }
}

// The row-major product itself: C (M, N) = op(A) · op(B) (+ C), on the stored matrices.
void row_major_reference(const RowMajorProduct& p, const std::vector<double>& a,
                         const std::vector<double>& b, std::vector<double>& c, bool accumulate) {
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      double s = 0;
      for (int64_t l = 0; l < p.K; ++l) {
        const double x = p.trans_a ? a[size_t(l * p.lda + i)] : a[size_t(i * p.lda + l)];
        const double y = p.trans_b ? b[size_t(j * p.ldb + l)] : b[size_t(l * p.ldb + j)];
        s += x * y;
      }
      double& out = c[size_t(i * p.ldc + j)];
      out = accumulate ? out + s : s;
    }
  }
}

// The cuBLASLt call of lt_product(p), on the row-major buffers as they are (B's memory as
// cuBLASLt's a, A's as its b, C's as D), gives the row-major product bit for bit and leaves the
// padding of C alone.
void expect_maps(const RowMajorProduct& p, bool accumulate) {
  SCOPED_TRACE(::testing::Message()
               << "M=" << p.M << " N=" << p.N << " K=" << p.K << " trans_a=" << p.trans_a
               << " trans_b=" << p.trans_b << " lda=" << p.lda << " ldb=" << p.ldb
               << " ldc=" << p.ldc << " accumulate=" << accumulate);
  const std::vector<double> a = filled(p.trans_a ? p.K : p.M, p.lda, 1.0);
  const std::vector<double> b = filled(p.trans_b ? p.N : p.K, p.ldb, -2.0);
  std::vector<double> want = filled(p.M, p.ldc, 100.0), got = want;
  row_major_reference(p, a, b, want, accumulate);
  lt_reference(lt_product(p), b, a, got, accumulate);
  EXPECT_EQ(got, want);
}

TEST(GemmPlan, SwapsOperandsAndKeepsTransposes) {
  const LtProduct lt = lt_product({3, 5, 4, true, false, 7, 6, 9});
  EXPECT_EQ(lt.m, 5);
  EXPECT_EQ(lt.n, 3);
  EXPECT_EQ(lt.k, 4);
  EXPECT_FALSE(lt.trans_a);  // B, not transposed: stored (K, N), read as (N, K)
  EXPECT_TRUE(lt.trans_b);   // A, transposed: stored (K, M), read as (M, K)
  EXPECT_EQ(lt.a.rows, 5);
  EXPECT_EQ(lt.a.cols, 4);
  EXPECT_EQ(lt.a.ld, 6);
  EXPECT_EQ(lt.b.rows, 3);
  EXPECT_EQ(lt.b.cols, 4);
  EXPECT_EQ(lt.b.ld, 7);
  EXPECT_EQ(lt.d.rows, 5);
  EXPECT_EQ(lt.d.cols, 3);
  EXPECT_EQ(lt.d.ld, 9);
}

TEST(GemmPlan, ComputesTheRowMajorProductForEveryTransposeCombination) {
  const int64_t M = 3, N = 5, K = 4;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool accumulate : {false, true}) {
        // Dense strides, then every stride padded (a view into a wider matrix, as the logits'
        // vocabulary columns are).
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        expect_maps({M, N, K, ta, tb, lda, ldb, N}, accumulate);
        expect_maps({M, N, K, ta, tb, lda + 2, ldb + 3, N + 1}, accumulate);
      }
    }
  }
}

TEST(GemmPlan, ComputesDegenerateShapes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      expect_maps({1, 6, 5, ta, tb, ta ? 1 : 5, tb ? 5 : 6, 6}, false);  // a single row
      expect_maps({6, 1, 5, ta, tb, ta ? 6 : 5, tb ? 5 : 1, 1}, false);  // a single column
      expect_maps({4, 6, 1, ta, tb, ta ? 4 : 1, tb ? 1 : 6, 6}, true);   // an outer product
    }
  }
}

// The linear layers' products against their definitions on dense row-major tensors.
TEST(GemmPlan, LinearProducts) {
  const int64_t M = 5, K = 4, N = 3;
  const std::vector<double> x = filled(M, K, 1.0), w = filled(N, K, -1.0), dy = filled(M, N, 0.5);
  auto run = [](const RowMajorProduct& p, const std::vector<double>& a,
                const std::vector<double>& b, std::vector<double> c, bool accumulate) {
    lt_reference(lt_product(p), b, a, c, accumulate);
    return c;
  };
  std::vector<double> y(size_t(M * N)), dx = filled(M, K, 3.0), dw = filled(N, K, 2.0);
  std::vector<double> want_y = y, want_dx = dx, want_dw = dw;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        want_y[size_t(m * N + n)] += x[size_t(m * K + k)] * w[size_t(n * K + k)];
        want_dx[size_t(m * K + k)] += dy[size_t(m * N + n)] * w[size_t(n * K + k)];
        want_dw[size_t(n * K + k)] += dy[size_t(m * N + n)] * x[size_t(m * K + k)];
      }
    }
  }
  EXPECT_EQ(run(linear_forward_product(M, K, N), x, w, y, false), want_y);
  EXPECT_EQ(run(linear_dx_product(M, K, N), dy, w, dx, true), want_dx);
  EXPECT_EQ(run(linear_dw_product(M, K, N), dy, x, dw, true), want_dw);
}

TEST(GemmPlan, PointerAlignment) {
  EXPECT_EQ(pointer_alignment(0x10000), 256u);
  EXPECT_EQ(pointer_alignment(0x10100), 256u);
  EXPECT_EQ(pointer_alignment(0x10080), 128u);
  EXPECT_EQ(pointer_alignment(0x10010), 16u);
  EXPECT_EQ(pointer_alignment(0x10008), 8u);
  EXPECT_EQ(pointer_alignment(0x10002), 2u);
  EXPECT_EQ(pointer_alignment(0x10001), 1u);
}

// Every field a plan depends on changes the key, and (for these keys) its hash; the same
// arguments give the same key and hash.
TEST(GemmPlan, KeysTellApartEveryField) {
  struct Args {
    RowMajorProduct p{64, 96, 32, false, true, 32, 32, 96};
    DType a = DType::BF16, b = DType::BF16, c = DType::BF16;
    Epilogue e = Epilogue::None;
    bool accumulate = false;
    uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 0;
    PlanKey key() const {
      return plan_key(p, a, b, c, e, accumulate, align_a, align_b, align_c, align_bias);
    }
  };
  std::vector<Args> cases(1);
  auto vary = [&](auto change) {
    Args v;
    change(v);
    cases.push_back(v);
  };
  vary([](Args& v) { v.p.M = 65; });
  vary([](Args& v) { v.p.N = 97; });
  vary([](Args& v) { v.p.K = 33; });
  vary([](Args& v) { v.p.M = 96, v.p.N = 64; });  // M and N swapped
  vary([](Args& v) { v.p.trans_a = true; });
  vary([](Args& v) { v.p.trans_b = false; });
  vary([](Args& v) { v.p.trans_a = true, v.p.trans_b = false; });  // the transposes swapped
  vary([](Args& v) { v.p.lda = 40; });
  vary([](Args& v) { v.p.ldb = 40; });
  vary([](Args& v) { v.p.ldc = 100; });
  vary([](Args& v) { v.p.lda = 33, v.p.ldb = 32; });
  vary([](Args& v) { v.p.lda = 32, v.p.ldb = 33; });  // the same values in the other stride
  vary([](Args& v) { v.a = DType::F16, v.b = DType::F16, v.c = DType::F16; });
  vary([](Args& v) { v.a = DType::F32, v.b = DType::F32, v.c = DType::F32; });
  vary([](Args& v) { v.c = DType::F32; });
  vary([](Args& v) { v.a = DType::F16; });
  vary([](Args& v) { v.b = DType::F16; });
  vary([](Args& v) { v.e = Epilogue::Bias, v.align_bias = 256; });
  vary([](Args& v) { v.e = Epilogue::Bias, v.align_bias = 2; });
  vary([](Args& v) { v.accumulate = true; });
  vary([](Args& v) { v.align_a = 16; });
  vary([](Args& v) { v.align_b = 16; });
  vary([](Args& v) { v.align_c = 16; });
  vary([](Args& v) { v.align_c = 2; });
  vary([](Args& v) { v.align_a = 16, v.align_b = 8; });
  vary([](Args& v) { v.align_a = 8, v.align_b = 16; });  // the same values on the other operand

  const PlanKeyHash hash;
  std::set<size_t> hashes;
  for (size_t i = 0; i < cases.size(); ++i) {
    const PlanKey ki = cases[i].key();
    EXPECT_EQ(ki, cases[i].key());
    EXPECT_EQ(hash(ki), hash(cases[i].key()));
    hashes.insert(hash(ki));
    for (size_t j = 0; j < i; ++j) EXPECT_NE(ki, cases[j].key()) << "cases " << i << ", " << j;
  }
  EXPECT_EQ(hashes.size(), cases.size());
}

// Every row of every column block is summed by exactly one thread of one chunk; no chunk is
// empty; several chunks only of at least 64 rows, few enough for gridDim.y; scratch holds one
// row of sums per chunk.
TEST(GemmPlan, BiasGradLaunchCoversEveryRowOnce) {
  for (int64_t M : {1, 7, 8, 63, 64, 65, 127, 128, 129, 1000, 4096, 16384, 100003}) {
    for (int64_t N : {1, 31, 32, 33, 768, 3072, 50257}) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N);
      const BiasGradLaunch l = bias_grad_launch(M, N);
      EXPECT_GE(l.col_blocks * kBiasGradCols, N);
      EXPECT_LT((l.col_blocks - 1) * kBiasGradCols, N);
      EXPECT_EQ(l.chunk_rows % kBiasGradRowThreads, 0);
      EXPECT_GE(l.row_chunks, 1);
      EXPECT_LE(l.row_chunks, 65535);
      EXPECT_GE(l.row_chunks * l.chunk_rows, M);
      EXPECT_LT((l.row_chunks - 1) * l.chunk_rows, M);
      if (l.row_chunks > 1) {
        EXPECT_GE(l.chunk_rows, 64);
      }
      EXPECT_EQ(l.scratch_floats, l.row_chunks > 1 ? size_t(l.row_chunks * N) : 0u);
      std::vector<int> seen(static_cast<size_t>(M));
      for (int64_t by = 0; by < l.row_chunks; ++by) {
        const int64_t r0 = by * l.chunk_rows, r1 = std::min(M, r0 + l.chunk_rows);
        for (int ty = 0; ty < kBiasGradRowThreads; ++ty) {
          for (int64_t r = r0 + ty; r < r1; r += kBiasGradRowThreads) ++seen[size_t(r)];
        }
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), M);
    }
  }
}

// Wide products get enough blocks to fill a GPU when they have the rows for it.
TEST(GemmPlan, BiasGradLaunchSplitsRowsOfFewColumns) {
  const BiasGradLaunch l = bias_grad_launch(16384, 768);
  EXPECT_EQ(l.col_blocks, 24);
  EXPECT_GE(l.col_blocks * l.row_chunks, 512);
  const BiasGradLaunch few = bias_grad_launch(100, 768);
  EXPECT_EQ(few.row_chunks, 1);
  EXPECT_EQ(few.scratch_floats, 0u);
}

}  // namespace
}  // namespace strata::ops::cuda
