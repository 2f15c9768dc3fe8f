// Times one product three ways on this CPU: oneDNN's fp32 sgemm on fp32 operands (the fp32
// run's speed), bf16 operands widened into a workspace for that sgemm and the result narrowed,
// and pack_gemm widening bf16 as it packs. Prints GFLOP/s per path (median of --reps).
//   build/gemm_paths M N K [ta tb] [c: bf16|fp32] [accumulate 0|1]
// ta/tb 1: a or b transposed in memory (a weight read as its transpose is tb = 1).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/cpu/pack_gemm.h"

using namespace strata;
using namespace strata::kernels;

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double median_gflops(double flop, int reps, F&& f) {
  f();  // plans, workspace and page faults out of the timing
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    const double t0 = seconds();
    f();
    r.push_back(flop / (seconds() - t0) / 1e9);
  }
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: gemm_paths M N K [ta tb] [bf16|fp32] [accumulate]\n");
    return 2;
  }
  const int64_t M = std::atoll(argv[1]), N = std::atoll(argv[2]), K = std::atoll(argv[3]);
  const bool ta = argc > 4 && std::atoi(argv[4]) != 0, tb = argc > 5 && std::atoi(argv[5]) != 0;
  const bool c32 = argc > 6 && std::strcmp(argv[6], "fp32") == 0;
  const bool acc = argc > 7 && std::atoi(argv[7]) != 0;
  const int reps = 9;
  std::vector<float> a32(size_t(M * K)), b32(size_t(K * N)), cf(size_t(M * N));
  std::vector<bf16> a16(a32.size()), b16(b32.size()), ch(cf.size());
  uint32_t s = 12345;
  auto rnd = [&] { return float((s = s * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f; };
  for (size_t i = 0; i < a32.size(); ++i) a16[i] = f32_to_bf16(a32[i] = rnd());
  for (size_t i = 0; i < b32.size(); ++i) b16[i] = f32_to_bf16(b32[i] = rnd());
  const int64_t ars = ta ? 1 : K, acs = ta ? M : 1, brs = tb ? 1 : N, bcs = tb ? K : 1;
  const int64_t nb[2] = {1, 1};
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const DType ct = c32 ? DType::F32 : DType::BF16;
  void* cp = c32 ? static_cast<void*>(cf.data()) : static_cast<void*>(ch.data());

  const double f32 = median_gflops(flop, reps, [&] {
    matmul({cf.data(), DType::F32, N}, {a32.data(), DType::F32, ars, acs},
           {b32.data(), DType::F32, brs, bcs}, M, N, K, nb, 1.0f, acc);
  });
  // The workspace path: both operands widened, the fp32 product, the result narrowed.
  std::vector<float> aw(a32.size()), bw(b32.size()), cw(cf.size());
  const double widened = median_gflops(flop, reps, [&] {
#pragma omp parallel for
    for (size_t i = 0; i < aw.size(); ++i) aw[i] = bf16_to_f32(a16[i]);
#pragma omp parallel for
    for (size_t i = 0; i < bw.size(); ++i) bw[i] = bf16_to_f32(b16[i]);
    if (acc && !c32) {
#pragma omp parallel for
      for (size_t i = 0; i < cw.size(); ++i) cw[i] = bf16_to_f32(ch[i]);
    }
    matmul({c32 ? cf.data() : cw.data(), DType::F32, N}, {aw.data(), DType::F32, ars, acs},
           {bw.data(), DType::F32, brs, bcs}, M, N, K, nb, 1.0f, acc);
    if (!c32) {
#pragma omp parallel for
      for (size_t i = 0; i < cw.size(); ++i) ch[i] = f32_to_bf16(cw[i]);
    }
  });
  std::printf(
      "M=%lld N=%lld K=%lld ta=%d tb=%d c=%s acc=%d threads=%d | GFLOP/s: fp32 sgemm %.1f, bf16 "
      "widened into a workspace %.1f",
      (long long)M, (long long)N, (long long)K, int(ta), int(tb), c32 ? "fp32" : "bf16", int(acc),
      omp_get_max_threads(), f32, widened);
  for (PackKernel k : pack_gemm_kernels()) {
    const double packed = median_gflops(flop, reps, [&] {
      pack_gemm(k, {cp, ct, N}, {a16.data(), DType::BF16, ars, acs},
                {b16.data(), DType::BF16, brs, bcs}, M, N, K, 1.0f, acc);
    });
    std::printf(", bf16 pack_gemm(%s) %.1f", pack_kernel_name(k), packed);
  }
  std::printf("\n");
  return 0;
}
