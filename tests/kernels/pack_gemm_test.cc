// pack_gemm, the GEMM that widens half-precision operands as it packs them: every micro-kernel
// this CPU runs, against a double-precision reference over operand types, layouts, partial tiles
// and blocks; rounding of a half result exactly once, bit for bit as core/dtype.h rounds; results
// that do not depend on the thread count or on which rows and columns a call computes; grouped
// products equal to one product per group; and matmul choosing it for large products on the
// widened path.
#include "strata/kernels/cpu/pack_gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/cpu/matmul.h"

namespace strata::kernels {
namespace {

// (rows, cols) of dtype S, row-major with ld = cols + pad, or transposed (column-major).
template <typename S>
struct Mat {
  int64_t rows = 0, cols = 0;
  bool trans = false;
  int64_t pad = 3;
  std::vector<float> values = {};  // the exact values held, widened
  std::vector<S> data = {};
  int64_t ld() const { return (trans ? rows : cols) + pad; }
  int64_t rs() const { return trans ? 1 : ld(); }
  int64_t cs() const { return trans ? ld() : 1; }
  size_t at(int64_t i, int64_t j) const { return size_t(i * rs() + j * cs()); }
  float operator()(int64_t i, int64_t j) const { return values[at(i, j)]; }
  MatOperand operand() const { return {data.data(), dtype_of<S>(), rs(), cs()}; }
};

template <typename S>
Mat<S> random_mat(int64_t rows, int64_t cols, bool trans, std::string_view name) {
  Mat<S> m;
  m.rows = rows, m.cols = cols, m.trans = trans;
  const size_t n = size_t(m.ld() * (trans ? cols : rows));
  m.values = test::rounded<S>(test::randn(n, name));
  m.data = test::to_dtype<S>(m.values);
  return m;
}

// Operand types, layouts, result type, accumulate and alpha of one case.
struct Case {
  DType a, b, c;
  bool ta, tb, accumulate;
  float alpha;
};

template <typename F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(float{});
    case DType::BF16:
      return f(bf16{});
    case DType::F16:
      return f(f16{});
    case DType::I32:
      break;
  }
  FAIL() << "no matmul type " << dtype_name(t);
}

// Relative error of one pack_gemm against the double reference; the padding of c untouched.
double case_error(PackKernel kernel, const Case& cs, int64_t M, int64_t N, int64_t K) {
  double err = 0.0;
  with_type(cs.a, [&](auto a_type) {
    with_type(cs.b, [&](auto b_type) {
      with_type(cs.c, [&](auto c_type) {
        using A = decltype(a_type);
        using B = decltype(b_type);
        using C = decltype(c_type);
        const auto a = random_mat<A>(M, K, cs.ta, "a");
        const auto b = random_mat<B>(K, N, cs.tb, "b");
        auto c = random_mat<C>(M, N, false, "c");
        const std::vector<float> c0 = c.values;
        pack_gemm(kernel, {c.data.data(), dtype_of<C>(), c.ld()}, a.operand(), b.operand(), M, N, K,
                  cs.alpha, cs.accumulate);
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double s = 0.0;
            for (int64_t k = 0; k < K; ++k) s += double(a(i, k)) * double(b(k, j));
            s = s * cs.alpha + (cs.accumulate ? double(c0[c.at(i, j)]) : 0.0);
            num = std::max(num, std::abs(double(to_f32(c.data[c.at(i, j)])) - s));
            den = std::max(den, std::abs(s));
          }
          for (int64_t j = N; j < c.ld(); ++j) {
            EXPECT_EQ(to_f32(c.data[c.at(i, j)]), c0[c.at(i, j)]) << "padding at " << i << "," << j;
          }
        }
        err = num / den;
      });
    });
  });
  return err;
}

double tolerance(DType c) {
  // A half result rounded once: relative error <= u (bf16 2^-8, fp16 2^-11) of the largest value,
  // with a factor two of margin; fp32 against double: the accumulation order, K·2^-24 at most.
  return c == DType::BF16 ? 0x1p-7 : c == DType::F16 ? 0x1p-10 : 1e-5;
}

// A bf16 result of M×N×K against the same product's fp32 result rounded, bit for bit.
void expect_bf16_is_fp32_rounded(PackKernel kernel, int64_t M, int64_t N, int64_t K) {
  const auto a = random_mat<bf16>(M, K, false, "a");
  const auto b = random_mat<bf16>(K, N, true, "b");
  std::vector<float> c32(size_t(M * N));
  std::vector<bf16> c16(size_t(M * N));
  pack_gemm(kernel, {c32.data(), DType::F32, N}, a.operand(), b.operand(), M, N, K, 0.5f, false);
  pack_gemm(kernel, {c16.data(), DType::BF16, N}, a.operand(), b.operand(), M, N, K, 0.5f, false);
  for (size_t i = 0; i < c32.size(); ++i) ASSERT_EQ(c16[i].bits, f32_to_bf16(c32[i]).bits) << i;
}

class PackGemm : public testing::TestWithParam<PackKernel> {};

// Shapes: partial tiles on both edges (MR and NR never divide 37 or 45), depth across the
// 512-deep blocks (1100 = 2·512 + 76), several threads' rows, and columns across the 3072-wide
// block (3100).
TEST_P(PackGemm, EveryOperandTypeAndLayoutAgainstReference) {
  const DType F = DType::F32, H = DType::BF16, P = DType::F16;
  const Case cases[] = {
      {H, H, H, false, true, false, 1.0f},  {H, H, F, true, false, true, 1.0f},
      {H, H, H, false, false, true, 0.5f},  {H, H, F, false, true, false, -2.0f},
      {F, H, H, false, false, false, 1.0f}, {F, H, F, true, false, true, 1.0f},
      {P, P, P, false, true, true, 1.0f},   {P, P, F, true, true, false, 0.25f},
      {F, F, F, true, true, true, 1.0f},    {H, P, H, false, false, false, 1.0f},
  };
  const int64_t shapes[][3] = {{37, 45, 29}, {130, 70, 1100}, {9, 3100, 40}};
  for (const Case& cs : cases) {
    for (const auto& s : shapes) {
      SCOPED_TRACE(testing::Message()
                   << dtype_name(cs.a) << "·" << dtype_name(cs.b) << "→" << dtype_name(cs.c)
                   << " ta=" << cs.ta << " tb=" << cs.tb << " acc=" << cs.accumulate
                   << " alpha=" << cs.alpha << " M=" << s[0] << " N=" << s[1] << " K=" << s[2]);
      EXPECT_LT(case_error(GetParam(), cs, s[0], s[1], s[2]), tolerance(cs.c));
    }
  }
}

// A bf16 result is the fp32 result rounded once, bit for bit as f32_to_bf16 rounds (ties to
// even, NaN kept, overflow to Inf): c = 1 · b, with b holding the hard cases.
TEST_P(PackGemm, Bf16ResultRoundsOnceAsCoreDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {1.0f,
                          std::bit_cast<float>(0x3f808000u),  // a tie: rounds to even (down)
                          std::bit_cast<float>(0x3f818000u),  // a tie: rounds to even (up)
                          std::bit_cast<float>(0x3f808001u),  // just above a tie: up
                          -std::bit_cast<float>(0x3f817fffu),
                          std::bit_cast<float>(0x7f7fffffu),  // FLT_MAX: rounds to Inf
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7f800001u),  // a signalling NaN: quieted
                          -0.0f,
                          1e-40f};  // subnormal
  const int64_t M = 13, N = int64_t(v.size()) * 3, K = 1;
  std::vector<float> b(static_cast<size_t>(N)), a(static_cast<size_t>(M), 1.0f);
  for (int64_t j = 0; j < N; ++j) b[size_t(j)] = v[size_t(j) % v.size()];
  std::vector<bf16> c(size_t(M * N));
  pack_gemm(GetParam(), {c.data(), DType::BF16, N}, {a.data(), DType::F32, 1, 1},
            {b.data(), DType::F32, N, 1}, M, N, K, 1.0f, false);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      // The sum starts from +0: -0 comes out +0, as from any GEMM.
      EXPECT_EQ(c[size_t(i * N + j)].bits, f32_to_bf16(0.0f + b[size_t(j)]).bits)
          << "row " << i << " value " << std::bit_cast<uint32_t>(b[size_t(j)]);
    }
  }
}

// Without accumulate, a bf16 result equals the same product's fp32 result rounded: the sums are
// the same, in the same order, whether they end in fp32 or in bf16 (here across three blocks of
// depth, so through the fp32 partial sums; and on 3 threads across two column blocks of 1024 and
// 76, where a thread of few rows reaches the narrow block while the others sum the wide one).
TEST_P(PackGemm, Bf16ResultIsTheFp32ResultRounded) {
  const int threads = omp_get_max_threads();
  for (const int64_t N : {int64_t(70), int64_t(1100)}) {
    omp_set_num_threads(N == 70 ? threads : 3);
    SCOPED_TRACE(testing::Message() << "N=" << N);
    expect_bf16_is_fp32_rounded(GetParam(), 50, N, 1300);
  }
  omp_set_num_threads(threads);
}

// Each element is the same sum whichever rows and columns a call computes (data, tensor and
// sequence parallelism split products so) and however many threads run it.
TEST_P(PackGemm, ElementsDoNotDependOnTheSplitOrTheThreads) {
  const int64_t M = 600, N = 300, K = 1100;
  const auto a = random_mat<bf16>(M, K, false, "a");
  const auto b = random_mat<bf16>(K, N, true, "b");
  std::vector<float> whole(size_t(M * N)), part(size_t(M * N), 0.0f), one(size_t(M * N));
  pack_gemm(GetParam(), {whole.data(), DType::F32, N}, a.operand(), b.operand(), M, N, K, 1.0f,
            false);
  // Rows [100, 457) x columns [33, 250), a call of its own.
  const int64_t i0 = 100, i1 = 457, j0 = 33, j1 = 250;
  MatOperand as = a.operand(), bs = b.operand();
  as.ptr = a.data.data() + i0 * a.rs();
  bs.ptr = b.data.data() + j0 * b.cs();
  pack_gemm(GetParam(), {part.data() + i0 * N + j0, DType::F32, N}, as, bs, i1 - i0, j1 - j0, K,
            1.0f, false);
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = j0; j < j1; ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(part[size_t(i * N + j)]),
                std::bit_cast<uint32_t>(whole[size_t(i * N + j)]))
          << i << "," << j;
    }
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads == 1 ? 3 : 1);
  pack_gemm(GetParam(), {one.data(), DType::F32, N}, a.operand(), b.operand(), M, N, K, 1.0f,
            false);
  omp_set_num_threads(threads);
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(one[i]), std::bit_cast<uint32_t>(whole[i])) << i;
  }
}

// A grouped product gives each group's elements bit for bit as pack_gemm gives them for that
// group alone, whatever the threads (1 and 3) and however their split falls across the groups:
// groups of 0, 1, 5, 200 and 700 rows, depths of 1100 (three blocks, through a bf16 result's
// fp32 partial sums) beside 40, and a group of no depth, whose c stays as it was.
TEST_P(PackGemm, GroupedIsEachGroupAloneBitForBit) {
  const int64_t N = 70;
  struct Shape {
    int64_t M, K;
  };
  const Shape shapes[] = {{200, 1100}, {0, 40}, {1, 1100}, {700, 40}, {5, 0}, {5, 1100}, {13, 40}};
  for (const DType ct : {DType::F32, DType::BF16}) {
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(ct) << " accumulate=" << accumulate);
      std::vector<Mat<bf16>> as, bs;
      std::vector<Mat<float>> c32;
      std::vector<Mat<bf16>> c16;
      for (const Shape& s : shapes) {
        as.push_back(random_mat<bf16>(s.M, s.K, false, "a"));
        bs.push_back(random_mat<bf16>(s.K, N, true, "b"));
        c32.push_back(random_mat<float>(s.M, N, false, "c"));
        c16.push_back(random_mat<bf16>(s.M, N, false, "c"));
      }
      // The reference: one pack_gemm per group (none for a group without rows or depth).
      auto ref32 = c32;
      auto ref16 = c16;
      const auto out = [&](std::vector<Mat<float>>& f, std::vector<Mat<bf16>>& h, size_t g) {
        return ct == DType::F32 ? MatOut{f[g].data.data(), ct, f[g].ld()}
                                : MatOut{h[g].data.data(), ct, h[g].ld()};
      };
      for (size_t g = 0; g < std::size(shapes); ++g) {
        if (shapes[g].M == 0 || shapes[g].K == 0) continue;
        pack_gemm(GetParam(), out(ref32, ref16, g), as[g].operand(), bs[g].operand(), shapes[g].M,
                  N, shapes[g].K, 0.5f, accumulate);
      }
      const int threads = omp_get_max_threads();
      for (const int t : {1, 3}) {
        auto g32 = c32;
        auto g16 = c16;
        std::vector<MatGroup> groups;
        for (size_t g = 0; g < std::size(shapes); ++g) {
          groups.push_back(
              {out(g32, g16, g), as[g].operand(), bs[g].operand(), shapes[g].M, shapes[g].K});
        }
        omp_set_num_threads(t);
        pack_gemm_grouped(GetParam(), groups, N, 0.5f, accumulate);
        omp_set_num_threads(threads);
        for (size_t g = 0; g < std::size(shapes); ++g) {
          for (size_t i = 0; i < g32[g].data.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(g32[g].data[i]),
                      std::bit_cast<uint32_t>(ref32[g].data[i]))
                << "threads " << t << " group " << g << " element " << i;
          }
          for (size_t i = 0; i < g16[g].data.size(); ++i) {
            ASSERT_EQ(g16[g].data[i].bits, ref16[g].data[i].bits)
                << "threads " << t << " group " << g << " element " << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, PackGemm, testing::ValuesIn(pack_gemm_kernels()),
                         [](const testing::TestParamInfo<PackKernel>& p) {
                           return std::string(pack_kernel_name(p.param));
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PackGemm);

// On the widened path, matmul runs products of many rows on pack_gemm, bit for bit, and the
// linear backward's fused and split forms still agree bit for bit (its output gradient is then
// widened by each product's packing rather than once up front).
TEST(PackGemmInMatmul, WidenedPathRunsLargeProductsOnIt) {
  if (pack_gemm_kernels().empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this CPU";
  const Bf16Matmul detected = bf16_matmul_path();
  set_bf16_matmul_path(Bf16Matmul::Widened);
  const int64_t M = 520, K = 96, N = 530;
  const auto x = test::to_dtype<bf16>(test::randn(size_t(M * K), "x"));
  const auto w = test::to_dtype<bf16>(test::randn(size_t(N * K), "w"));
  const auto dy = test::to_dtype<bf16>(test::randn(size_t(M * N), "dy"));
  std::vector<bf16> y(size_t(M * N)), y_ref(size_t(M * N));
  linear_forward<bf16>(y.data(), x.data(), w.data(), nullptr, M, K, N);
  pack_gemm({y_ref.data(), DType::BF16, N}, {x.data(), DType::BF16, K, 1},
            {w.data(), DType::BF16, 1, K}, M, N, K, 1.0f, false);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i].bits, y_ref[i].bits) << i;

  std::vector<bf16> dx(size_t(M * K)), dx2(size_t(M * K));
  std::vector<float> dw(size_t(N * K), 0.0f), dw2(size_t(N * K), 0.0f);
  linear_backward<bf16, float>(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), M, K,
                               N);
  linear_backward_input<bf16>(dx2.data(), dy.data(), w.data(), M, K, N, false);
  linear_backward_weight<bf16, float>(dw2.data(), nullptr, dy.data(), x.data(), M, K, N);
  set_bf16_matmul_path(detected);
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i].bits, dx2[i].bits) << i;
  for (size_t i = 0; i < dw.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(dw[i]), std::bit_cast<uint32_t>(dw2[i])) << i;
  }
  // And against the double reference: dx = dy · w, dw = dyᵀ · x.
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < M; i += 7) {
    for (int64_t k = 0; k < K; ++k) {
      double s = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        s += double(to_f32(dy[size_t(i * N + n)])) * double(to_f32(w[size_t(n * K + k)]));
      }
      num = std::max(num, std::abs(double(to_f32(dx[size_t(i * K + k)])) - s));
      den = std::max(den, std::abs(s));
    }
  }
  EXPECT_LT(num / den, 0x1p-7);
}

}  // namespace
}  // namespace strata::kernels
