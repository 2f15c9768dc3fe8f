// Times the CPU's two attention paths (kernels/cpu/attention.h: materialized; attention_tiled.h:
// tiled) on one shape, forward and backward, fp32, bf16 and fp16, and prints the minimum of --reps
// runs in milliseconds (the four calls interleaved in each round) with the bytes each keeps for
// backward.
//   build/attention_paths [B NH KVH hd] [T ...] [--reps n] [--ring] [--window w]
// Defaults: bench-23M's attention (B 8, 8 heads, hd 64) at T 64, 128, 256, 512, 1024.
// --ring: the tiled kernel against the ring attention blocks (attention_ring.h) on the same whole
// causal sequence, as one causal block and as the 4 chunks of a zig-zag cp 2 (4 causal blocks and
// 6 full ones), each with its pack_kv and delta.
// --window w: the tiled kernel with a sliding window of w keys (AttentionScores::window) against
// the same T without one, forward and backward, fp32 and bf16, and the speed-up of each (T of 4·w
// and more: the window skips all but about (w + 64)/(T/2) of the causal key tiles).
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/rng.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/cpu/attention_ring.h"
#include "strata/kernels/cpu/attention_tiled.h"
#include "strata/kernels/cpu/cpu_features.h"

using namespace strata;
using namespace strata::kernels;

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Minimum milliseconds of each of fs over reps rounds, the functions interleaved within a round so
// that a busy moment of a shared machine falls on all of them alike.
template <size_t N>
std::array<double, N> min_ms(int reps, const std::array<std::function<void()>, N>& fs) {
  for (const auto& f : fs) f();  // workspaces and page faults out of the timing
  std::array<double, N> best;
  best.fill(1e30);
  for (int i = 0; i < reps; ++i) {
    for (size_t k = 0; k < N; ++k) {
      const double t0 = seconds();
      fs[k]();
      best[k] = std::min(best[k], seconds() - t0);
    }
  }
  for (double& b : best) b *= 1e3;
  return best;
}

template <typename S>
void run(int B, int T, int NH, int KVH, int hd, int reps) {
  const int64_t qkv_n = int64_t(B) * T * (NH + 2 * KVH) * hd, out_n = int64_t(B) * T * NH * hd;
  const int64_t att_n = int64_t(B) * NH * T * T, lse_n = int64_t(B) * NH * T;
  std::vector<S> qkv(static_cast<size_t>(qkv_n)), dy(static_cast<size_t>(out_n)),
      out(static_cast<size_t>(out_n)), dqkv(static_cast<size_t>(qkv_n));
  const uint64_t key = rng_key(7, "attention_paths");
  for (int64_t i = 0; i < qkv_n; ++i) qkv[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(i)));
  for (int64_t i = 0; i < out_n; ++i) {
    dy[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(qkv_n + i)));
  }
  std::vector<S> att(static_cast<size_t>(att_n));
  std::vector<float> scratch(attention_backward_scratch_floats(B, T, NH, KVH, hd));
  std::vector<float> lse(static_cast<size_t>(lse_n));
  const auto [mf, mb, tf, tb] = min_ms<4>(
      reps,
      {[&] { attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, KVH, hd); },
       [&] {
         attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), att.data(), B, T,
                            NH, KVH, hd);
       },
       [&] { attention_tiled_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hd); },
       [&] {
         attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), B, T, NH, KVH,
                                  hd);
       }});
  const double m_saved = double(att_n) * sizeof(S) / 1048576.0;
  const double t_saved = double(lse_n) * sizeof(float) / 1048576.0;
  std::printf("%-5s %5d  %9.2f %9.2f %9.2f  %9.2f %9.2f %9.2f  %6.2f  %8.2f %7.3f\n",
              dtype_name(dtype_of<S>()), T, mf, mb, mf + mb, tf, tb, tf + tb, (tf + tb) / (mf + mb),
              m_saved, t_saved);
}

// The whole causal sequence through the ring blocks, cut into `chunks` chunks: each chunk's queries
// against its own keys (causal) and every earlier chunk's (full), as a ring's ranks together do.
template <typename S>
void ring_forward(float* o, float* lse, S* kv, const S* qkv, int B, int T, int NH, int KVH, int hd,
                  int chunks) {
  const int c = T / chunks;
  attention_pack_kv(kv, qkv, B, T, NH, KVH, hd);
  std::fill(lse, lse + int64_t(B) * NH * T, -INFINITY);
  for (int a = 0; a < chunks; ++a) {
    for (int b = a; b >= 0; --b) {
      attention_block_forward(o, lse, qkv, T, a * c, c, kv, T, b * c, c, B, NH, KVH, hd, a == b);
    }
  }
}

template <typename S>
void ring_backward(float* dq, float* dkv, float* delta, const S* dout, const S* out, const S* qkv,
                   const float* lse, const S* kv, int B, int T, int NH, int KVH, int hd,
                   int chunks) {
  const int c = T / chunks;
  attention_delta(delta, dout, out, B, T, NH, hd);
  std::fill(dq, dq + int64_t(B) * T * NH * hd, 0.0f);
  std::fill(dkv, dkv + int64_t(B) * T * KVH * 2 * hd, 0.0f);
  for (int a = 0; a < chunks; ++a) {
    for (int b = a; b >= 0; --b) {
      attention_block_backward(dq, dkv, dout, qkv, lse, delta, T, a * c, c, kv, T, b * c, c, B, NH,
                               KVH, hd, a == b);
    }
  }
}

template <typename S>
void run_ring(int B, int T, int NH, int KVH, int hd, int reps) {
  const int64_t qkv_n = int64_t(B) * T * (NH + 2 * KVH) * hd, out_n = int64_t(B) * T * NH * hd;
  const int64_t kv_n = int64_t(B) * T * KVH * 2 * hd, lse_n = int64_t(B) * NH * T;
  std::vector<S> qkv(static_cast<size_t>(qkv_n)), dy(static_cast<size_t>(out_n)),
      out(static_cast<size_t>(out_n)), dqkv(static_cast<size_t>(qkv_n));
  std::vector<S> kv(static_cast<size_t>(kv_n));
  std::vector<float> lse(static_cast<size_t>(lse_n)), o(static_cast<size_t>(out_n)),
      dq(static_cast<size_t>(out_n)), dkv(static_cast<size_t>(kv_n));
  std::vector<float> rlse(static_cast<size_t>(lse_n)), delta(static_cast<size_t>(lse_n));
  const uint64_t key = rng_key(7, "attention_paths");
  for (int64_t i = 0; i < qkv_n; ++i) qkv[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(i)));
  for (int64_t i = 0; i < out_n; ++i) {
    dy[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(qkv_n + i)));
  }
  std::array<double, 6> ms = min_ms<6>(
      reps,
      {[&] { attention_tiled_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hd); },
       [&] {
         attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), B, T, NH, KVH,
                                  hd);
       },
       [&] { ring_forward(o.data(), rlse.data(), kv.data(), qkv.data(), B, T, NH, KVH, hd, 1); },
       [&] {
         ring_backward(dq.data(), dkv.data(), delta.data(), dy.data(), out.data(), qkv.data(),
                       rlse.data(), kv.data(), B, T, NH, KVH, hd, 1);
       },
       [&] { ring_forward(o.data(), rlse.data(), kv.data(), qkv.data(), B, T, NH, KVH, hd, 4); },
       [&] {
         ring_backward(dq.data(), dkv.data(), delta.data(), dy.data(), out.data(), qkv.data(),
                       rlse.data(), kv.data(), B, T, NH, KVH, hd, 4);
       }});
  std::printf("%-5s %5d  %9.2f %9.2f %9.2f  %9.2f %9.2f %9.2f  %9.2f %9.2f %9.2f\n",
              dtype_name(dtype_of<S>()), T, ms[0], ms[1], ms[0] + ms[1], ms[2], ms[3],
              ms[2] + ms[3], ms[4], ms[5], ms[4] + ms[5]);
}

// The tiled path at T with and without a window of w keys.
template <typename S>
void run_window(int B, int T, int NH, int KVH, int hd, int w, int reps) {
  const int64_t qkv_n = int64_t(B) * T * (NH + 2 * KVH) * hd, out_n = int64_t(B) * T * NH * hd;
  const int64_t lse_n = int64_t(B) * NH * T;
  std::vector<S> qkv(static_cast<size_t>(qkv_n)), dy(static_cast<size_t>(out_n)),
      out(static_cast<size_t>(out_n)), dqkv(static_cast<size_t>(qkv_n));
  std::vector<float> lse(static_cast<size_t>(lse_n)), wlse(static_cast<size_t>(lse_n));
  const uint64_t key = rng_key(7, "attention_paths");
  for (int64_t i = 0; i < qkv_n; ++i) qkv[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(i)));
  for (int64_t i = 0; i < out_n; ++i) {
    dy[size_t(i)] = from_f32<S>(rng_normal(key, uint64_t(qkv_n + i)));
  }
  AttentionScores sc;
  sc.window = w;
  const auto [pf, pb, wf, wb] = min_ms<4>(
      reps,
      {[&] { attention_tiled_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hd); },
       [&] {
         attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), B, T, NH, KVH,
                                  hd);
       },
       [&] { attention_tiled_forward(out.data(), wlse.data(), qkv.data(), B, T, NH, KVH, hd, sc); },
       [&] {
         attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), wlse.data(), B, T, NH, KVH,
                                  hd, sc);
       }});
  std::printf("%-5s %5d %6d  %9.2f %9.2f %9.2f  %9.2f %9.2f %9.2f  %6.2f %6.2f %6.2f\n",
              dtype_name(dtype_of<S>()), T, w, pf, pb, pf + pb, wf, wb, wf + wb, pf / wf, pb / wb,
              (pf + pb) / (wf + wb));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, window = 0;
  bool ring = false;
  std::vector<int> args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--ring") == 0) {
      ring = true;
    } else if (std::strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
      window = std::atoi(argv[++i]);
    } else {
      args.push_back(std::atoi(argv[i]));
    }
  }
  int B = 8, NH = 8, KVH = 8, hd = 64;
  std::vector<int> Ts = {64, 128, 256, 512, 1024};
  if (args.size() >= 4) {
    B = args[0], NH = args[1], KVH = args[2], hd = args[3];
    if (args.size() > 4) Ts.assign(args.begin() + 4, args.end());
  }
  const CpuFeatures& f = cpu_features();
  std::printf("# %s; %s; %d threads; B %d, heads %d, kv heads %d, hd %d; min of %d runs, ms\n",
              f.model.c_str(), f.flags().c_str(), omp_get_max_threads(), B, NH, KVH, hd, reps);
  if (window > 0) {
    std::printf("%-5s %5s %6s  %9s %9s %9s  %9s %9s %9s  %6s %6s %6s\n", "dtype", "T", "window",
                "full fwd", "full bwd", "full f+b", "win fwd", "win bwd", "win f+b", "x fwd",
                "x bwd", "x f+b");
    for (int T : Ts) run_window<float>(B, T, NH, KVH, hd, window, reps);
    for (int T : Ts) run_window<bf16>(B, T, NH, KVH, hd, window, reps);
    return 0;
  }
  if (ring) {
    std::printf("%-5s %5s  %9s %9s %9s  %9s %9s %9s  %9s %9s %9s\n", "dtype", "T", "tile fwd",
                "tile bwd", "tile f+b", "ring1 fwd", "ring1 bwd", "ring1 f+b", "ring4 fwd",
                "ring4 bwd", "ring4 f+b");
    for (int T : Ts) run_ring<float>(B, T, NH, KVH, hd, reps);
    for (int T : Ts) run_ring<bf16>(B, T, NH, KVH, hd, reps);
    return 0;
  }
  std::printf("%-5s %5s  %9s %9s %9s  %9s %9s %9s  %6s  %8s %7s\n", "dtype", "T", "mat fwd",
              "mat bwd", "mat f+b", "tile fwd", "tile bwd", "tile f+b", "ratio", "mat MiB",
              "lse MiB");
  for (int T : Ts) run<float>(B, T, NH, KVH, hd, reps);
  for (int T : Ts) run<bf16>(B, T, NH, KVH, hd, reps);
  for (int T : Ts) run<f16>(B, T, NH, KVH, hd, reps);
  return 0;
}
