// The memory ops of ops.h on the GPU against the CPU backend: clearing and converting copies,
// the host transfers, the residual and bias additions and the scaling (each one fp32 operation
// rounded once, so the GPU must give the CPU's bits), the fp64 reductions, and the token check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "strata/core/check.h"
#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

class GpuMemory : public ::testing::TestWithParam<DType> {};

// fill_zero clears exactly its view: rows in the middle of a buffer of random values become zero,
// the rows around them keep theirs.
TEST_P(GpuMemory, FillZeroClearsExactlyItsView) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 300, C = 77;
  const auto x = random(N * C, 1);
  auto run = [&](Device d) {
    auto t = make(d, dt, {N, C}, x);
    ops::fill_zero(t->t.slice0(41, 259));
    return values(t->t);
  };
  EXPECT_TRUE(identical(run(kGpu), run(kCpu)));
}

// copy converts to every dtype as core/dtype.h rounds (to nearest even; fp16 subnormals and
// overflow to infinity), keeping signed zeros, infinities and NaN.
TEST_P(GpuMemory, CopyConvertsToEveryDtypeAsTheCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType src = GetParam();
  auto x = random(4093, 2, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  // Ties to even in bf16 (1 + 2^-8, 1 + 3·2^-8) and fp16 (1 + 2^-11, 1 + 3·2^-11); an fp16
  // subnormal, one that rounds up to the smallest and one that rounds to 0; fp16's largest
  // finite value and the first that overflows.
  x.insert(x.end(), {0x1.01p0f, 0x1.03p0f, 0x1.002p0f, 0x1.006p0f, 1e-6f, 4e-8f, 2e-8f, 65519.0f,
                     65520.0f, -1e30f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()});
  const int64_t n = int64_t(x.size());
  for (DType dst : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dst));
    auto run = [&](Device d) {
      auto s = make(d, src, {n}, x);
      auto t = make(d, dst, {n}, std::vector<float>(x.size(), 7.0f));
      ops::copy(t->t, s->t);
      return values(t->t);
    };
    EXPECT_TRUE(identical(run(kGpu), run(kCpu)));
  }
}

// copy_from_host then copy_to_host give back the bytes, for a whole buffer and for a view of rows
// inside it written and read alone (the transfer touches exactly its view's bytes).
TEST_P(GpuMemory, HostTransfersKeepTheBytes) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 1024, C = 300;
  const size_t row_bytes = size_t(C) * dtype_size(dt);
  // Arbitrary bytes (not values of dt: a transfer does not read them).
  const auto whole = random(N * row_bytes / 4, 3), rows = random(600 * row_bytes / 4, 4);
  Buffer buf(MemCategory::Activations, N * row_bytes, kGpu);
  const Tensor all(buf.data(), dt, {N, C}, kGpu), mid = all.slice0(100, 700);
  ops::copy_from_host(all, whole.data());
  ops::copy_from_host(mid, rows.data());
  std::vector<uint8_t> want(N * row_bytes), got_mid(600 * row_bytes), got(N * row_bytes);
  std::memcpy(want.data(), whole.data(), want.size());
  std::memcpy(want.data() + 100 * row_bytes, rows.data(), got_mid.size());
  ops::copy_to_host(got_mid.data(), mid);
  ops::copy_to_host(got.data(), all);
  EXPECT_EQ(std::memcmp(got_mid.data(), rows.data(), got_mid.size()), 0);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
}

// y += x in fp32, rounded once: the CPU's bits.
TEST_P(GpuMemory, AddInplaceRoundsOnce) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 300, C = 77;
  const auto y = random(N * C, 5, 2.0f), x = random(N * C, 6);
  auto run = [&](Device d) {
    auto yt = make(d, dt, {N, C}, y), xt = make(d, dt, {N, C}, x);
    ops::add_inplace(yt->t, xt->t);
    return values(yt->t);
  };
  EXPECT_TRUE(identical(run(kGpu), run(kCpu)));
}

// y (M, N) += b (N) on every row in fp32, rounded once: the CPU's bits.
TEST_P(GpuMemory, AddBiasRoundsOnce) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t M = 300, N = 77;
  const auto y = random(M * N, 7, 2.0f), b = random(N, 8);
  auto run = [&](Device d) {
    auto yt = make(d, dt, {M, N}, y), bt = make(d, dt, {N}, b);
    ops::add_bias(yt->t, bt->t);
    return values(yt->t);
  };
  EXPECT_TRUE(identical(run(kGpu), run(kCpu)));
}

// t *= s: one fp32 product of the stored value and s (not s rounded to the dtype), rounded once.
TEST_P(GpuMemory, ScaleInplaceRoundsOnce) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t n = 23101;
  const auto x = random(n, 9, 3.0f);
  auto run = [&](Device d) {
    auto t = make(d, dt, {n}, x);
    ops::scale_inplace(t->t, -0.3f);
    return values(t->t);
  };
  EXPECT_TRUE(identical(run(kGpu), run(kCpu)));
}

// Σ t² for one element, a block's worth and many blocks. The squares of fp32, bf16 and fp16
// values are exact in fp64 and an fp64 sum of 3e5 positive terms in any order is within 1e-10
// of the exact one, so 1e-9 relative allows any order and no fp32 step. +inf and NaN propagate.
TEST_P(GpuMemory, SumSquaresInFp64WithInfAndNan) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto run = [&](Device d, const std::vector<float>& x) {
    return ops::sum_squares(make(d, dt, {int64_t(x.size())}, x)->t);
  };
  for (size_t n : {size_t(1), size_t(1000), size_t(300001)}) {
    SCOPED_TRACE(n);
    const auto x = random(n, 10, 3.0f);
    const double want = run(kCpu, x);
    EXPECT_NEAR(run(kGpu, x), want, 1e-9 * want);
  }
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  auto x = random(300001, 11, 3.0f);
  x[123457] = -inf;
  EXPECT_EQ(run(kGpu, x), std::numeric_limits<double>::infinity());
  x[299999] = nan;
  EXPECT_TRUE(std::isnan(run(kGpu, x)));
  x[123457] = 1.0f;
  EXPECT_TRUE(std::isnan(run(kGpu, x)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMemory, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// Σ t of an fp32 tensor in fp64 (values in [-1, 1]: the sum cancels). Each fp64 addition errs by
// at most 2^-53 of Σ|t|, so 1e-9·Σ|t| allows any order over 3e5 terms and no fp32 partial sums.
TEST(GpuSum, Fp64SumOfFp32) {
  STRATA_SKIP_WITHOUT_GPU();
  for (size_t n : {size_t(1), size_t(1000), size_t(300001)}) {
    SCOPED_TRACE(n);
    const auto x = random(n, 12);
    double abs_sum = 0.0;
    for (float v : x) abs_sum += std::fabs(v);
    auto run = [&](Device d) { return ops::sum(make(d, DType::F32, {int64_t(n)}, x)->t); };
    EXPECT_NEAR(run(kGpu), run(kCpu), 1e-9 * abs_sum);
  }
}

// check_tokens counts the targets >= 0, with either view absent, and names the first bad token of
// a long array (not merely some bad one) in the CPU's words.
TEST(GpuTokens, CountsTargetsAndNamesTheFirstBadToken) {
  STRATA_SKIP_WITHOUT_GPU();
  const int64_t N = 4096, V = 5000;
  const auto u = random(2 * N, 13);
  std::vector<int32_t> in(N), tg(N);
  for (int64_t i = 0; i < N; ++i) {
    in[i] = int32_t((u[i] + 1.0f) * 0.5f * (V - 1));
    tg[i] = i % 7 == 3 ? -1 : i % 11 == 5 ? -100 : int32_t((u[N + i] + 1.0f) * 0.5f * (V - 1));
  }
  auto count = [&](Device d, bool inputs, bool targets) {
    auto it = make_tokens(d, {N}, in), tt = make_tokens(d, {N}, tg);
    return ops::check_tokens(inputs ? it->t : Tensor(), targets ? tt->t : Tensor(), V);
  };
  const int64_t counted = std::count_if(tg.begin(), tg.end(), [](int32_t t) { return t >= 0; });
  auto error = [&](Device d) -> std::string {
    try {
      count(d, true, true);
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(count(kGpu, true, true), counted);
  EXPECT_EQ(count(kGpu, false, true), counted);
  EXPECT_EQ(count(kGpu, true, false), 0);

  in[3000] = -1;  // the first bad input; more follow
  in[3001] = int32_t(V);
  in[4000] = int32_t(V + 7);
  EXPECT_NE(error(kCpu).find("input token -1 at position 3000"), std::string::npos) << error(kCpu);
  EXPECT_EQ(error(kGpu), error(kCpu));
  in[3000] = in[3001] = in[4000] = 0;
  tg[2000] = int32_t(V);  // negative targets are ignored rows, not errors
  tg[2500] = int32_t(V + 1);
  EXPECT_NE(error(kCpu).find("target token 5000 at position 2000"), std::string::npos)
      << error(kCpu);
  EXPECT_EQ(error(kGpu), error(kCpu));
}

}  // namespace
}  // namespace strata::gpu_test
