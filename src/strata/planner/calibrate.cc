// strata bench --calibrate: this machine measured into the device profile the layout planner
// divides by (cost/device_profile.h). Rank 0 times, with its OpenMP threads while the other
// ranks wait idle, the dense GEMM peak per dtype, the efficiency of a linear layer's training
// products by size, the model's own block kernels beyond its GEMMs (elementwise per family,
// causal attention by sequence length; at a --config's or --model's shapes), the memory bandwidth
// of a streaming op and the fixed cost of a kernel call; all ranks then time strata's own
// all-reduce for the links' α–β; rank 0 writes the profile.
#include "strata/planner/calibrate.h"

#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/core/rng.h"
#include "strata/core/text.h"
#include "strata/cost/device_profile.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/ops.h"

namespace strata::planner {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The other ranks wait for rank 0 without spinning on the cores it is timing.
void idle_bcast(void* buf, int count, MPI_Datatype type, MPI_Comm world) {
  MPI_Request req;
  MPI_Ibcast(buf, count, type, 0, world, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Runs fn on rank 0 of world (MPI_COMM_NULL: this process alone) while the others wait idle, and
// raises the InputError it threw on every rank, so that the job ends with one message and exit 2.
void on_rank0(MPI_Comm world, const std::function<void()>& fn) {
  int rank = 0;
  if (world != MPI_COMM_NULL) MPI_Comm_rank(world, &rank);
  std::string error;
  if (rank == 0) {
    try {
      fn();
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  if (world != MPI_COMM_NULL) {
    int len = int(error.size());
    idle_bcast(&len, 1, MPI_INT, world);
    error.resize(size_t(len));
    if (len > 0) MPI_Bcast(error.data(), len, MPI_CHAR, 0, world);
  }
  STRATA_INPUT_CHECK(error.empty(), error);
}

// One GEMM of the efficiency curve: C (M, N) = A (M, K) · B (N, K)ᵀ, as a linear layer runs.
struct GemmShape {
  int64_t M, N, K;
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

// The products of a Transformer block at M rows: a model's QKV (M, qkv, C), MLP up (M, up, C) and
// down (M, C, ffn); without a model, the MLP's of C = 512 (QKV's are like up's).
std::vector<GemmShape> curve_shapes(const std::optional<ModelConfig>& model) {
  std::vector<std::array<int64_t, 2>> nk;
  if (!model) {
    // One width, so that the curve's FLOPs order its points by rows as a model's do.
    constexpr int64_t C = 512;
    nk = {{4 * C, C}, {C, 4 * C}};
  } else {
    const ModelConfig& m = *model;
    const int64_t C = m.hidden, hd = m.hd();
    const int64_t kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
    const int64_t ffn = m.ffn_hidden > 0 ? m.ffn_hidden : 4 * C;
    const int64_t up = m.gpt2_block() ? ffn : 2 * ffn;  // the gated MLPs' fused gate|up
    nk = {{(m.heads + 2 * kv) * hd, C}, {up, C}, {C, ffn}};
  }
  std::vector<GemmShape> shapes;
  for (int64_t M : {64, 128, 256, 512, 1024, 4096}) {
    for (const auto& [N, K] : nk) shapes.push_back({M, N, K});
  }
  return shapes;
}

// The median seconds of fn (synchronized): at least 3 runs and as many as fit in budget_s (at most
// 50), after one warm-up run (oneDNN's JIT, first touches).
double median_seconds(const std::function<void()>& fn, double budget_s) {
  auto run = [&] {
    fn();
    ops::synchronize(default_device());
  };
  run();
  std::vector<double> t;
  double spent = 0;
  for (int i = 0; i < 50 && (i < 3 || spent < budget_s); ++i) {
    const auto t0 = Clock::now();
    run();
    t.push_back(seconds_since(t0));
    spent += t.back();
  }
  std::nth_element(t.begin(), t.begin() + long(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// A buffer of n random normal values in dtype (random, not zeros: multiplying zeros draws less
// power, which lets a chip clock higher than training's data would).
Buffer random_buffer(size_t n, DType dtype, const char* name) {
  Buffer buf(MemCategory::Workspace, n * dtype_size(dtype));
  std::vector<float> v(n);
  std::vector<char> h(n * dtype_size(dtype));
  rng_fill_normal(v.data(), rng_key(1234, name), 0, n, 0.0f, 1.0f);
  convert(h.data(), dtype, v.data(), DType::F32, n);
  ops::copy_from_host(Tensor(buf.data(), dtype, {int64_t(n)}), h.data());
  return buf;
}

// The cubes whose best rate is a dtype's peak.
constexpr int64_t kPeakSizes[] = {1024, 1536, 2048};

// Random normal operands A and B in dtype and a result C in dtype, and for the training products
// a random dy, a dx in dtype and an fp32 dw, each large enough for every shape it is given (views
// of their beginnings).
class GemmBench {
 public:
  GemmBench(DType dtype, const std::vector<GemmShape>& shapes) : dtype_(dtype) {
    size_t a = 0, b = 0, c = 0;
    for (const GemmShape& s : shapes) {
      a = std::max(a, size_t(s.M * s.K)), b = std::max(b, size_t(s.N * s.K));
      c = std::max(c, size_t(s.M * s.N));
    }
    a_ = random(a, "calibrate a"), b_ = random(b, "calibrate b");
    c_ = Buffer(MemCategory::Workspace, c * dtype_size(dtype));
    dy_ = random(c, "calibrate dy"), dx_ = Buffer(MemCategory::Workspace, a * dtype_size(dtype));
    // Copies of a layer's weights and fp32 gradients, 64 MiB of weights at least (at most 32
    // copies): each run takes the next, so that the products meet them cold.
    weights_ = b,
    copies_ = std::clamp<size_t>((size_t(64) << 20) / (b * dtype_size(dtype) + 1) + 1, 1, 32);
    w_ = random(b * copies_, "calibrate w");
    dw_ = Buffer(MemCategory::Workspace, b * copies_ * sizeof(float));
    ops::fill_zero(Tensor(dw_.data(), DType::F32, {int64_t(b * copies_)}));
  }

  // FLOP/s of a linear layer's training products at s: forward y = x·wᵀ, backward dx = dy·w and
  // dw += dyᵀ·x into fp32 gradients (as mixed precision keeps them), with the model's own
  // kernels; the median of at least 3 runs and of as many as fit in budget_s, after a warm-up.
  // The median, not the best: a step meets these products with its caches as they come.
  double training_rate(const GemmShape& s, double budget_s) const {
    const Tensor x(a_.data(), dtype_, {s.M, s.K});
    const Tensor y(c_.data(), dtype_, {s.M, s.N}), dy(dy_.data(), dtype_, {s.M, s.N});
    const Tensor dx(dx_.data(), dtype_, {s.M, s.K});
    size_t next = 0;
    const double t = median_seconds(
        [&] {
          const size_t at = (next++ % copies_) * weights_;
          const Tensor w(static_cast<char*>(w_.data()) + at * dtype_size(dtype_), dtype_,
                         {s.N, s.K});
          const Tensor dw(dw_.as<float>() + at, DType::F32, {s.N, s.K});
          ops::linear_forward(y, x, w, Tensor());
          ops::linear_backward(dx, dw, Tensor(), dy, x, w);
        },
        budget_s);
    return 3.0 * s.flops() / t;
  }

  // FLOP/s of s: the best of at least 3 runs, and of as many as fit in budget_s, after a warm-up
  // (oneDNN's JIT, the first touch of C).
  double rate(const GemmShape& s, double budget_s) const {
    ops::Gemm g;
    g.M = s.M, g.N = s.N, g.K = s.K, g.trans_b = true, g.lda = g.ldb = s.K, g.ldc = s.N;
    const Tensor a(a_.data(), dtype_, {s.M, s.K}), b(b_.data(), dtype_, {s.N, s.K});
    const Tensor c(c_.data(), dtype_, {s.M, s.N});
    auto run = [&] {
      ops::gemm(c, a, b, g);
      ops::synchronize(default_device());
    };
    run();
    double best = 1e30, spent = 0;
    for (int i = 0; i < 50 && (i < 3 || spent < budget_s); ++i) {
      const auto t0 = Clock::now();
      run();
      const double dt = seconds_since(t0);
      best = std::min(best, dt), spent += dt;
    }
    return s.flops() / best;
  }

 private:
  Buffer random(size_t n, const char* name) const { return random_buffer(n, dtype_, name); }

  DType dtype_;
  Buffer a_, b_, c_, dy_, dx_, w_, dw_;
  size_t weights_ = 0, copies_ = 1;  // elements of one copy of w_ and dw_, and how many
};

// A family's block widths for the kernels beyond its GEMMs: a model's, or without one a
// mid-sized block of each family (C 512, 8 heads of 64; GPT-2's MLP 4·C, Llama's 2/3 of it with 2
// key/value heads), and the sequence lengths attention is timed at.
struct BlockShape {
  std::string family;
  int64_t C = 0, F = 0, heads = 0, kv = 0, hd = 0;
  std::vector<int64_t> seq_lens;
};

std::vector<BlockShape> block_shapes(const std::optional<ModelConfig>& model) {
  if (!model) {
    return {{"gpt2", 512, 2048, 8, 8, 64, {128, 512, 2048}},
            {"llama", 512, 1376, 8, 2, 64, {128, 512, 2048}}};
  }
  // The model's family at its widths, and the other family at the same C (its usual MLP), so
  // that a plan for either finds a rate.
  const ModelConfig& m = *model;
  // The elementwise rates are keyed by the block's kind: GPT-2's, or the RoPE families' ("llama").
  BlockShape b{m.gpt2_block() ? "gpt2" : "llama",
               m.hidden,
               m.ffn_hidden > 0 ? m.ffn_hidden : 4 * int64_t(m.hidden),
               m.heads,
               m.kv_heads > 0 ? m.kv_heads : m.heads,
               m.hd(),
               {}};
  for (int64_t T : {int64_t(m.seq_len) / 4, int64_t(m.seq_len)}) {
    // A point's forward and backward stay under about 30 GFLOP (a second or so here).
    const double flops = 12.0 * double(T) * double(T) * double(m.hidden) * double(1024 / T + 1);
    if (T >= 16 && flops < 3e10) b.seq_lens.push_back(T);
  }
  if (b.seq_lens.empty()) b.seq_lens.push_back(std::min<int64_t>(m.seq_len, 1024));
  BlockShape other = b;
  if (!m.gpt2_block()) {
    other.family = "gpt2", other.F = 4 * b.C, other.kv = b.heads;
  } else {
    other.family = "llama", other.F = (8 * b.C / 3 + 63) / 64 * 64;
    other.kv = b.heads % 2 == 0 ? b.heads / 2 : b.heads;
  }
  other.seq_lens.clear();  // attention's rate is timed once, with the model's heads
  return {b, other};
}

// The planner's count of a block's elementwise bytes over M rows, forward and backward (its
// StageCost::elementwise_bytes, three times): about twelve (M, C) tensors and three (M, F) ones
// read and written a pass.
double elementwise_bytes(const BlockShape& b, int64_t M, DType dtype) {
  return 3.0 * (12.0 * double(M * b.C) + 3.0 * double(M * b.F)) * double(dtype_size(dtype));
}

// Bytes (the planner's count) per second of the family's elementwise kernels of one block's
// forward and backward over M rows, timed together: two norms, the activation, two residual adds,
// and Llama's RoPE on the query and key heads.
double elementwise_rate(const BlockShape& b, int64_t M, DType dtype) {
  const int64_t C = b.C, F = b.F, up = b.family == "llama" ? 2 * F : F;
  const int64_t qkv_w = (b.heads + 2 * b.kv) * b.hd;
  const Buffer x = random_buffer(size_t(M * C), dtype, "ew x");
  const Buffer y = random_buffer(size_t(M * C), dtype, "ew y");
  const Buffer dy = random_buffer(size_t(M * C), dtype, "ew dy");
  const Buffer u = random_buffer(size_t(M * up), dtype, "ew u");
  const Buffer dh = random_buffer(size_t(M * F), dtype, "ew dh");
  const Buffer qkv = random_buffer(size_t(M * qkv_w), dtype, "ew qkv");
  const Buffer w = random_buffer(size_t(C), dtype, "ew w"),
               bias = random_buffer(size_t(C), dtype, "ew b");
  Buffer out(MemCategory::Workspace, size_t(M * C) * dtype_size(dtype));
  Buffer dx(MemCategory::Workspace, size_t(M * C) * dtype_size(dtype));
  Buffer h(MemCategory::Workspace, size_t(M * F) * dtype_size(dtype));
  Buffer du(MemCategory::Workspace, size_t(M * up) * dtype_size(dtype));
  Buffer stats(MemCategory::Workspace, size_t(2 * M) * sizeof(float));
  Buffer dwb(MemCategory::Workspace, size_t(2 * C) * sizeof(float));
  Buffer scratch(MemCategory::Workspace, ops::norm_backward_scratch_floats(M, C) * sizeof(float));
  const Tensor tx(x.data(), dtype, {M, C}), ty(y.data(), dtype, {M, C});
  const Tensor tdy(dy.data(), dtype, {M, C}), tout(out.data(), dtype, {M, C});
  const Tensor tdx(dx.data(), dtype, {M, C}), tw(w.data(), dtype, {C}), tb(bias.data(), dtype, {C});
  const Tensor tu(u.data(), dtype, {M, up}), th(h.data(), dtype, {M, F});
  const Tensor tdh(dh.data(), dtype, {M, F}), tdu(du.data(), dtype, {M, up});
  const Tensor mean(stats.as<float>(), DType::F32, {M}),
      rstd(stats.as<float>() + M, DType::F32, {M});
  const Tensor dw(dwb.as<float>(), DType::F32, {C}), db(dwb.as<float>() + C, DType::F32, {C});
  const Tensor tscratch(scratch.as<float>(), DType::F32,
                        {int64_t(ops::norm_backward_scratch_floats(M, C))});
  const Tensor tqkv(qkv.data(), dtype, {M, qkv_w});
  ops::AttentionShape rs;
  rs.B = 1, rs.T = int(M), rs.groups = int(b.kv), rs.rep = int(b.heads / b.kv), rs.hd = int(b.hd);
  const bool llama = b.family == "llama";
  ops::fill_zero(tdx);
  const double t = median_seconds(
      [&] {
        for (int i = 0; i < 2; ++i) {  // forward
          if (llama) {
            ops::rmsnorm_forward(tout, rstd, tx, tw, 1e-5f);
          } else {
            ops::layernorm_forward(tout, mean, rstd, tx, tw, tb, 1e-5f);
          }
          ops::add_inplace(ty, tout);
        }
        if (llama) {
          ops::swiglu_forward(th, tu);
          ops::rope_forward(tqkv, rs, ops::rope_default(rs.hd, 10000.0f));
        } else {
          ops::gelu_forward(th, tu);
        }
        for (int i = 0; i < 2; ++i) {  // backward
          if (llama) {
            ops::rmsnorm_backward(tdx, dw, tscratch, tdy, tx, tw, rstd);
          } else {
            ops::layernorm_backward(tdx, dw, db, tscratch, tdy, tx, tw, mean, rstd);
          }
          ops::add_inplace(ty, tdx);
        }
        if (llama) {
          ops::swiglu_backward(tdu, tdh, tu);
          ops::rope_backward(tqkv, rs, ops::rope_default(rs.hd, 10000.0f));
        } else {
          ops::gelu_backward(tdu, tu, tdh);
        }
      },
      0.3);
  return elementwise_bytes(b, M, dtype) / t;
}

// The planner's attention FLOPs (4·T²·heads·hd a sequence, forward; twice that backward) per
// second of causal attention's forward and backward at sequence length T, over enough sequences
// for about 1024 rows.
double attention_rate(const BlockShape& b, int64_t T, DType dtype) {
  ops::AttentionShape s;
  s.B = int(std::max<int64_t>(1, 1024 / T)), s.T = int(T), s.groups = int(b.kv);
  s.rep = int(b.heads / b.kv), s.hd = int(b.hd);
  const int64_t rows = int64_t(s.B) * T, width = b.heads * b.hd;
  const int64_t qkv_w = (b.heads + 2 * b.kv) * b.hd;
  const Buffer qkv = random_buffer(size_t(rows * qkv_w), dtype, "att qkv");
  const Buffer dout = random_buffer(size_t(rows * width), dtype, "att dout");
  const ops::AttentionSaved saved = ops::attention_saved(Device::CPU, dtype, s);
  Buffer out(MemCategory::Workspace, size_t(rows * width) * dtype_size(dtype));
  Buffer att(MemCategory::Workspace, size_t(saved.numel) * dtype_size(saved.dtype));
  Buffer dqkv(MemCategory::Workspace, size_t(rows * qkv_w) * dtype_size(dtype));
  const size_t scratch_floats = ops::attention_backward_scratch_floats(Device::CPU, dtype, s);
  Buffer scratch(MemCategory::Workspace, std::max<size_t>(1, scratch_floats) * sizeof(float));
  const Tensor tqkv(qkv.data(), dtype, {rows, qkv_w}), tdout(dout.data(), dtype, {rows, width});
  const Tensor tout(out.data(), dtype, {rows, width}), tatt(att.data(), saved.dtype, {saved.numel});
  const Tensor tdqkv(dqkv.data(), dtype, {rows, qkv_w});
  const Tensor tscratch(scratch.as<float>(), DType::F32,
                        {int64_t(std::max<size_t>(1, scratch_floats))});
  const double t = median_seconds(
      [&] {
        ops::attention_forward(tout, tatt, tqkv, s);
        ops::attention_backward(tdqkv, tscratch, tdout, tqkv, tatt, s);
      },
      0.3);
  return 3.0 * 4.0 * double(T) * double(T) * double(width) * double(s.B) / t;
}

// Bytes read and written per second by y += x over two 128 MiB fp32 buffers (well past any
// cache): 3 × 128 MiB a call, the best of 5 after a warm-up (the first touch).
double memory_bandwidth() {
  constexpr int64_t n = int64_t(32) << 20;
  Buffer x(MemCategory::Workspace, size_t(n) * 4), y(MemCategory::Workspace, size_t(n) * 4);
  const Tensor tx(x.data(), DType::F32, {n}), ty(y.data(), DType::F32, {n});
  ops::fill_zero(tx);
  ops::fill_zero(ty);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = Clock::now();
    ops::add_inplace(ty, tx);
    ops::synchronize(default_device());
    if (i > 0) best = std::min(best, seconds_since(t0));
  }
  return 3.0 * double(n) * 4.0 / best;
}

// The fixed cost of one kernel call: the median of a 16×16×16 GEMM's and a 64-element add's time
// (their work takes nanoseconds), averaged over the two kinds, as a block's forward mixes them.
double op_overhead() {
  Buffer buf(MemCategory::Workspace, 3 * 256 * 4);
  float* p = buf.as<float>();
  const Tensor a(p, DType::F32, {16, 16}), b(p + 256, DType::F32, {16, 16});
  const Tensor c(p + 512, DType::F32, {16, 16});
  ops::fill_zero(Tensor(p, DType::F32, {3 * 256}));
  ops::Gemm g;
  g.M = g.N = g.K = 16, g.trans_b = true, g.lda = g.ldb = g.ldc = 16;
  auto median_s = [](const std::function<void()>& fn) {
    std::vector<double> t;
    for (int i = -10; i < 200; ++i) {
      const auto t0 = Clock::now();
      fn();
      if (i >= 0) t.push_back(seconds_since(t0));
    }
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  };
  const double gemm = median_s([&] { ops::gemm(c, a, b, g); });
  const Tensor x(p, DType::F32, {64}), y(p + 512, DType::F32, {64});
  const double add = median_s([&] { ops::add_inplace(y, x); });
  return 0.5 * (gemm + add);
}

// A calibration's GEMM findings beyond the profile's fields, for the summary.
struct ComputeNotes {
  DType curve_dtype = DType::F32;
  int skipped = 0;  // curve shapes left out as too long to time
};

// Rank 0: the rates of cost::DeviceProfile that one rank's threads measure.
ComputeNotes measure_compute(const std::vector<GemmShape>& curve,
                             const std::vector<BlockShape>& blocks, cost::DeviceProfile* p) {
  ComputeNotes notes;
  std::vector<GemmShape> cubes;
  for (int64_t n : kPeakSizes) cubes.push_back({n, n, n});
  const bool bf16 = kernels::cpu_features().native_bf16();
  notes.curve_dtype = bf16 ? DType::BF16 : DType::F32;
  for (DType dtype : {DType::F32, DType::BF16}) {
    if (dtype == DType::BF16 && !bf16) continue;  // an emulated or widened bf16 is no peak
    std::vector<GemmShape> all = cubes;
    if (dtype == notes.curve_dtype) all.insert(all.end(), curve.begin(), curve.end());
    const GemmBench bench(dtype, all);
    double peak = 0;
    for (const GemmShape& s : cubes) peak = std::max(peak, bench.rate(s, 0.5));
    (dtype == DType::BF16 ? p->bf16_flops : p->fp32_flops) = peak;
    if (dtype != notes.curve_dtype) continue;
    // Equal FLOPs (an MLP's up and down) share one point, their mean. A call longer than half a
    // second at the peak is past the knee: the curve's last point stands for it.
    // The same points by rows too: each row count's mean over the shapes.
    std::map<double, std::pair<double, int>> by_flops, by_rows;
    for (const GemmShape& s : curve) {
      if (s.flops() / peak > 0.5) {
        ++notes.skipped;
        continue;
      }
      const double e = std::clamp(bench.training_rate(s, 0.3) / peak, 1e-6, 1.5);
      auto& [sum, n] = by_flops[s.flops()];
      sum += e, ++n;
      auto& [rsum, rn] = by_rows[double(s.M)];
      rsum += e, ++rn;
    }
    for (const auto& [f, e] : by_flops) p->gemm_efficiency.emplace_back(f, e.first / e.second);
    for (const auto& [m, e] : by_rows) p->gemm_efficiency_rows.emplace_back(m, e.first / e.second);
  }
  for (const BlockShape& b : blocks) {
    p->elementwise_bytes_per_s.emplace_back(b.family, elementwise_rate(b, 1024, notes.curve_dtype));
    for (int64_t T : b.seq_lens) {
      const double rate = attention_rate(b, T, notes.curve_dtype);
      auto same = std::find_if(p->attention_flops.begin(), p->attention_flops.end(),
                               [&](const auto& e) { return e.first == double(T); });
      if (same == p->attention_flops.end()) {
        p->attention_flops.emplace_back(double(T), rate);
      } else {
        same->second = 0.5 * (same->second + rate);  // two families' at one length: their mean
      }
    }
  }
  std::sort(p->attention_flops.begin(), p->attention_flops.end());
  p->memory_bytes_per_s = memory_bandwidth();
  p->op_overhead_s = op_overhead();
  return notes;
}

// α–β of strata's ring all-reduce over comm, collective over it: an n-byte all-reduce over P
// ranks takes 2(P-1) steps of alpha and moves 2(P-1)/P·n bytes over each rank's link, as the
// planner models it. Times are the slowest rank's, the 10th percentile of the repetitions: what
// the link can do (as the GEMM peaks are best-of), not what a loaded host happened to give.
struct LinkFit {
  cost::Link link;
  int ranks = 0;
  double small_s = 0, large_s = 0;
};
constexpr size_t kSmallBytes = 8, kLargeBytes = size_t(16) << 20;

LinkFit measure_all_reduce(MPI_Comm comm) {
  comm::Communicator c(comm, "calibrate");
  const int P = c.size();
  std::vector<float> buf(kLargeBytes / 4, 0.0f);
  auto fast_s = [&](size_t bytes, int reps) {
    std::vector<double> t;
    for (int r = -2; r < reps; ++r) {
      MPI_Barrier(comm);
      const auto t0 = Clock::now();
      c.all_reduce(buf.data(), bytes / 4, DType::F32, DType::F32);
      double dt = seconds_since(t0), slowest = 0;
      MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (r >= 0) t.push_back(slowest);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 10];
  };
  LinkFit f;
  f.ranks = P;
  f.small_s = fast_s(kSmallBytes, 51);
  f.large_s = fast_s(kLargeBytes, 11);
  const double steps = 2.0 * (P - 1);
  f.link.alpha_s = f.small_s / steps;
  const double wire = steps / P * double(kLargeBytes);
  f.link.bytes_per_s = wire / std::max(f.large_s - steps * f.link.alpha_s, 0.5 * f.large_s);
  return f;
}

struct Links {
  cost::Link intra, inter;
  std::string how;  // for the profile's source
  std::optional<LinkFit> intra_fit, inter_fit;
};

std::string link_words(const LinkFit& f, const char* where) {
  char s[256];
  std::snprintf(s, sizeof s,
                "strata's all-reduce over %d ranks %s (alpha from %zu B: %.1f us a call, bandwidth "
                "from %zu MiB: %.1f ms a call)",
                f.ranks, where, kSmallBytes, f.small_s * 1e6, kLargeBytes >> 20, f.large_s * 1e3);
  return s;
}

// Collective over world: intra-node over the ranks of each host, inter-node over one rank of
// each host; rank 0's answer. Without a second rank on rank 0's host, intra-node is shared memory
// as the measured memory bandwidth (rank 0's) gives it: a message is copied into the shared
// segment and out of it, each copy reading and writing every byte.
Links measure_links(MPI_Comm world, double memory_bytes_per_s) {
  Links l;
  const cost::Link shared = {5e-6, memory_bytes_per_s / 4.0};
  const std::string shared_words =
      "shared memory as the memory bandwidth gives it (4 bytes moved per byte sent), alpha 5 us "
      "assumed";
  if (world == MPI_COMM_NULL) {
    l.intra = l.inter = shared;
    l.how = "links not measured (one rank): run under strata launch -n 2; " + shared_words;
    return l;
  }
  int rank = 0, local = 0, local_rank = 0, hosts = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm host = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  MPI_Comm_size(host, &local);
  MPI_Comm_rank(host, &local_rank);
  MPI_Comm_split(world, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
  int leader = local_rank == 0;
  MPI_Allreduce(&leader, &hosts, 1, MPI_INT, MPI_SUM, world);
  if (local >= 2) l.intra_fit = measure_all_reduce(host);
  MPI_Barrier(world);
  if (leaders != MPI_COMM_NULL && hosts >= 2) l.inter_fit = measure_all_reduce(leaders);
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
  MPI_Comm_free(&host);
  l.how = "links measured: intra_node ";
  if (l.intra_fit) {
    l.intra = l.intra_fit->link;
    l.how += link_words(*l.intra_fit, "of one host");
  } else {
    l.intra = shared;
    l.how += "not measured (one rank on this host): " + shared_words;
  }
  if (l.inter_fit) {
    l.inter = l.inter_fit->link;
    l.how += "; inter_node " + link_words(*l.inter_fit, "one per host");
  } else {
    l.inter = l.intra;
    l.how += "; inter_node = intra_node (every rank on one host)";
  }
  return l;
}

void print_summary(const cost::DeviceProfile& p, const ComputeNotes& notes, const Links& l,
                   const std::string& output, double seconds) {
  std::printf("calibrated %s in %.1f s: %d cores, %d threads per rank\n", p.name.c_str(), seconds,
              p.cores, p.threads_per_rank);
  std::printf("  gemm peak (best of %lld^3..%lld^3): fp32 %.1f GFLOP/s",
              static_cast<long long>(kPeakSizes[0]), static_cast<long long>(kPeakSizes[2]),
              p.fp32_flops / 1e9);
  if (p.bf16_flops > 0) {
    std::printf(", bf16 %.1f GFLOP/s\n", p.bf16_flops / 1e9);
  } else {
    std::printf(", bf16 not native (planned at fp32's rate)\n");
  }
  if (!p.gemm_efficiency.empty()) {
    const auto by_fraction = [](const auto& a, const auto& b) { return a.second < b.second; };
    const auto [lo, hi] =
        std::minmax_element(p.gemm_efficiency.begin(), p.gemm_efficiency.end(), by_fraction);
    const std::string skipped =
        notes.skipped > 0 ? ", " + std::to_string(notes.skipped) + " too long left out" : "";
    std::printf("  gemm efficiency (%s, %zu sizes%s): %.3g of peak at %.2g FLOPs .. %.3g at %.2g\n",
                dtype_name(notes.curve_dtype), p.gemm_efficiency.size(), skipped.c_str(),
                lo->second, lo->first, hi->second, hi->first);
  }
  if (!p.gemm_efficiency_rows.empty()) {
    std::printf("  by rows (weights cold):");
    for (const auto& [m, e] : p.gemm_efficiency_rows) std::printf(" %.0f: %.3g", m, e);
    std::printf("\n");
  }
  std::printf("  memory bandwidth %.1f GB/s, kernel call %.1f us\n", p.memory_bytes_per_s / 1e9,
              p.op_overhead_s * 1e6);
  std::printf("  block elementwise kernels (the planner's bytes per second, 1024 rows):");
  for (const auto& [family, rate] : p.elementwise_bytes_per_s) {
    std::printf(" %s %.1f GB/s", family.c_str(), rate / 1e9);
  }
  std::printf("\n  causal attention forward + backward:");
  for (const auto& [T, rate] : p.attention_flops)
    std::printf(" T %.0f %.1f GFLOP/s", T, rate / 1e9);
  std::printf("\n");
  auto how = [](const std::optional<LinkFit>& f) {
    return f ? "all-reduce measured" : "estimated, not measured";
  };
  std::printf(
      "  intra_node alpha %.1f us, %.2f GB/s (%s); inter_node alpha %.1f us, %.2f GB/s (%s)\n",
      p.intra_node.alpha_s * 1e6, p.intra_node.bytes_per_s / 1e9, how(l.intra_fit),
      p.inter_node.alpha_s * 1e6, p.inter_node.bytes_per_s / 1e9,
      l.intra_fit && !l.inter_fit ? "one host: as intra_node" : how(l.inter_fit));
  std::printf("wrote %s\n", output.c_str());
  std::fflush(stdout);
}

}  // namespace

void check_profile_output(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  STRATA_INPUT_CHECK(!fs::is_directory(path, ec), flag, " ", path,
                     " is a directory; give the profile's file name, e.g. ", path,
                     "/calibration.json");
  const fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) return;
  fs::create_directories(dir, ec);
  STRATA_INPUT_CHECK(!ec && fs::is_directory(dir), flag, " ", path,
                     ": cannot create its directory ", dir.string(),
                     (ec ? ": " + ec.message() : std::string()));
}

void run_calibrate(const std::string& output, const std::optional<ModelConfig>& model,
                   const std::string& device) {
  STRATA_INPUT_CHECK(device == "cpu", "strata bench --calibrate --device ", device,
                     " is not supported yet (strata cannot query a GPU's memory from the CLI); "
                     "plan for a GPU with a built-in profile (strata plan --device a100|h100|h200) "
                     "or a profile file written by hand (cost/device_profile.h)");
  const auto start = Clock::now();
  kernels::bf16_matmul_path();  // a bad STRATA_BF16_MATMUL is every rank's input error
  const std::vector<GemmShape> curve = curve_shapes(model);
  const std::vector<BlockShape> blocks = block_shapes(model);
  const int ranks = comm::initialized() ? comm::world_size() : 1;
  const MPI_Comm world = ranks > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL;
  on_rank0(world, [&] { check_profile_output(output, "--output"); });

  cost::DeviceProfile p;
  p.name = "cpu: " + kernels::cpu_features().model;
  p.gpu = false;
  p.devices_per_node = 0;
  p.cores = omp_get_num_procs();
  p.threads_per_rank = omp_get_max_threads();
  p.memory_bytes = p.host_memory_bytes =
      uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  ComputeNotes notes;
  on_rank0(world, [&] { notes = measure_compute(curve, blocks, &p); });
  const Links links = measure_links(world, p.memory_bytes_per_s);
  on_rank0(world, [&] {
    p.intra_node = links.intra, p.inter_node = links.inter;
    p.source = "measured by strata bench --calibrate on " + utc_now(kUtcMinute) + ", " +
               std::to_string(ranks) + (ranks == 1 ? " rank x " : " ranks x ") +
               std::to_string(p.threads_per_rank) + " threads; " + links.how + "; " +
               kernels::describe_cpu();
    // The step fits a profile of this machine already holds at the output are kept: they are
    // what the planner's model misses on this CPU whatever the model (strata plan --fit), while
    // the rates above are re-measured at this model's shapes.
    size_t kept = 0;
    try {
      if (std::filesystem::exists(output)) {
        const cost::DeviceProfile old = cost::read_profile(output);
        if (!old.gpu && old.name == p.name && old.cores == p.cores &&
            old.threads_per_rank == p.threads_per_rank) {
          p.step_fits = old.step_fits, kept = old.step_fits.size();
        }
      }
    } catch (const InputError&) {
      // Not a profile this machine wrote: replaced whole.
    }
    cost::write_profile(p, output);
    print_summary(p, notes, links, output, seconds_since(start));
    if (kept > 0) {
      std::printf("  kept the %zu step fit(s) %s held for this CPU (strata plan --fit)\n", kept,
                  output.c_str());
    }
  });
}

}  // namespace strata::planner
