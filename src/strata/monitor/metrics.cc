#include "strata/monitor/metrics.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/core/rng.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/ops.h"

namespace strata {

namespace {

// GFLOP/s of an n³ matmul with both operands in dtype and a `result` dtype product, on this
// process's device (the CPU's OpenMP threads, or its GPU): the best of 5 runs after a warm-up
// (the machine's capability, not its momentary load).
double gemm_gflops(DType dtype, int n, DType result = DType::F32) {
  const size_t elems = size_t(n) * size_t(n);
  Buffer a(MemCategory::Workspace, elems * dtype_size(dtype));
  Buffer b(MemCategory::Workspace, elems * dtype_size(dtype));
  Buffer c(MemCategory::Workspace, elems * dtype_size(result));
  const Tensor ta(a.data(), dtype, {n, n}), tb(b.data(), dtype, {n, n});
  // Random operands: a GPU's tensor cores multiply zeros faster than data (less switching
  // power, so higher clocks), which would put the peak above what training can reach.
  {
    std::vector<float> v(elems);
    std::vector<char> h(elems * dtype_size(dtype));
    for (const Tensor& t : {ta, tb}) {
      rng_fill_normal(v.data(), rng_key(1234, t.data == ta.data ? "peak a" : "peak b"), 0, elems,
                      0.0f, 1.0f);
      convert(h.data(), dtype, v.data(), DType::F32, elems);
      ops::copy_from_host(t, h.data());
    }
  }
  ops::Gemm g;
  g.M = g.N = g.K = n, g.trans_b = true, g.lda = g.ldb = g.ldc = n;
  auto run = [&] {
    ops::gemm(Tensor(c.data(), result, {n, n}), ta, tb, g);
    ops::synchronize(default_device());  // a GPU's product has finished only then
  };
  run();  // JIT and first touch
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

// How many ranks' worth of cores this rank's host gives the job, divided among its ranks: a
// host running L ranks of t threads on c cores runs min(L·t, c) threads at once, each rank's
// measured peak covering min(t, c) of them. Summed over the ranks, the job's rank-equivalents.
double rank_share(MPI_Comm world) {
  int local = 1;
  if (world != MPI_COMM_NULL) {
    MPI_Comm host;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &local);
    MPI_Comm_free(&host);
  }
  if (default_device() == Device::CUDA) {
    // Ranks of a host share its GPUs: L ranks on G GPUs make min(L, G) GPUs' worth.
    const double gpus = double(std::max(1, ops::device_count(Device::CUDA)));
    return std::min(1.0, gpus / double(local));
  }
  const double t = double(omp_get_max_threads()), c = double(omp_get_num_procs());
  return std::min(double(local) * t, c) / std::min(t, c) / double(local);
}

// The machine's peak is its best GEMM rate, but one timing can be slowed by other work on the
// cores (and would then put MFU above 100%). The best rate seen is kept per CPU model, oneDNN ISA
// and thread count in $STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata, else ~/.cache/strata
// (peak.json), and rates[] is raised to it. Without a writable cache the measured rates stand.
void remember_best(double rates[2], int threads) {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* d = std::getenv("STRATA_CACHE_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = fs::path(x) / "strata";
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = fs::path(h) / ".cache" / "strata";
  } else {
    return;
  }
  const kernels::CpuFeatures& f = kernels::cpu_features();
  const std::string key =
      f.model + " | " + f.onednn_isa + " | " + std::to_string(threads) + " threads";
  const fs::path file = dir / "peak.json";
  nlohmann::json all = nlohmann::json::object();
  if (std::ifstream in(file); in.good()) {
    all = nlohmann::json::parse(in, nullptr, false);
    if (!all.is_object()) all = nlohmann::json::object();  // a damaged cache is rebuilt
  }
  nlohmann::json& e = all[key];
  for (int i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "fp32_gflops" : "bf16_gflops";
    if (rates[i] <= 0.0) continue;  // bf16 is a peak only where native
    if (e.contains(name) && e[name].is_number())
      rates[i] = std::max(rates[i], e[name].get<double>());
    e[name] = rates[i];
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Atomically: concurrent jobs never read half a file.
  try {
    atomic_write(file.string(), all.dump(2) + "\n", IoError::runtime);
  } catch (const Error&) {
    // An unwritable cache: the measured rates stand.
  }
}

}  // namespace

double MachinePeak::per_rank_gflops() const {
  return std::max(fp32_gflops, bf16_gflops);
}

double MachinePeak::gflops() const {
  return per_rank_gflops() * rank_equivalents;
}

std::string MachinePeak::describe() const {
  char buf[512];
  if (threads == 0) {
    std::snprintf(buf, sizeof buf,
                  "peak %.0f GFLOP/s = bf16 8192^3 GEMM %.0f GFLOP/s on the GPU x %.2g rank%s",
                  gflops(), per_rank_gflops(), rank_equivalents,
                  rank_equivalents == 1.0 ? "" : "s");
    return buf;
  }
  const bool bf16 = bf16_gflops > fp32_gflops;
  std::snprintf(buf, sizeof buf,
                "peak %.0f GFLOP/s = %s 2048^3 GEMM %.0f GFLOP/s on %d thread%s x %.2g rank%s "
                "(fp32 %.0f, bf16 %s)",
                gflops(), bf16 ? "bf16" : "fp32", per_rank_gflops(), threads,
                threads == 1 ? "" : "s", rank_equivalents, rank_equivalents == 1.0 ? "" : "s",
                fp32_gflops,
                bf16_gflops > 0 ? (std::to_string(int(bf16_gflops + 0.5)) + " native").c_str()
                                : "not native: widened to fp32");
  return buf;
}

MachinePeak measure_machine_peak(MPI_Comm world) {
  MachinePeak p;
  p.threads = omp_get_max_threads();
  int rank = 0;
  if (world != MPI_COMM_NULL) MPI_Comm_rank(world, &rank);
  double rates[2] = {0.0, 0.0};
  if (rank == 0 && default_device() == Device::CUDA) {
    // A GPU's peak is its dense bf16 tensor-core GEMM (Megatron's and PaLM's MFU): 8192³ fills
    // every SM; fp32 (no TF32) is not measured, it is never the peak.
    p.threads = 0;
    rates[1] = gemm_gflops(DType::BF16, 8192, DType::BF16);
  } else if (rank == 0) {
    rates[0] = gemm_gflops(DType::F32, 2048);
    if (kernels::cpu_features().native_bf16()) {
      rates[1] = gemm_gflops(DType::BF16, 2048);
    }
    remember_best(rates, p.threads);
  }
  if (world != MPI_COMM_NULL) {
    // Rank 0 measures alone; the others wait without spinning on the cores it is timing.
    MPI_Request req;
    MPI_Ibcast(rates, 2, MPI_DOUBLE, 0, world, &req);
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    double share = rank_share(world);
    MPI_Allreduce(&share, &p.rank_equivalents, 1, MPI_DOUBLE, MPI_SUM, world);
  } else {
    p.rank_equivalents = rank_share(MPI_COMM_NULL);
  }
  p.fp32_gflops = rates[0];
  p.bf16_gflops = rates[1];
  return p;
}

std::string describe_peaks(const StepMetrics& s) {
  std::string out;
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (s.peak_bytes[size_t(c)] == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(mem_category_name(MemCategory(c))) + " " +
           format_bytes(s.peak_bytes[size_t(c)]);
  }
  return out;
}

std::string progress_line(const StepMetrics& s, int64_t total_steps, double peak_gflops,
                          bool breakdown, double eta_s) {
  size_t mem = 0;
  for (size_t v : s.peak_bytes) mem += v;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "step %5lld/%lld | loss %.4f | lr %.3e | grad norm %.4f | %8.0f tok/s | MFU %5.1f%% "
      "| mem %s%s",
      static_cast<long long>(s.step), static_cast<long long>(total_steps), s.loss, double(s.lr),
      s.grad_norm, s.tokens_per_s, 100.0 * s.flops / s.seconds / 1e9 / peak_gflops,
      format_bytes(mem).c_str(), s.skipped ? " | skipped (overflow)" : "");
  std::string line = buf;
  if (s.trained_tokens != s.tokens) {  // a loss mask, packing: the targets trained are fewer
    std::snprintf(buf, sizeof buf, " | %.0f trained tok/s", s.trained_tokens_per_s);
    line += buf;
  }
  if (breakdown) {
    std::snprintf(buf, sizeof buf,
                  " | fwd %.3fs bwd %.3fs comm %.3fs gather %.3fs step %.3fs | wire %s",
                  s.forward_s, s.backward_s, s.comm_exposed_s, s.gather_exposed_s, s.optimizer_s,
                  format_bytes(size_t(s.comm_bytes)).c_str());
    line += buf;
  }
  if (eta_s >= 0) line += " | ETA " + format_duration(eta_s);
  return line;
}

std::string live_line(const StepMetrics& s, int64_t total_steps, double peak_gflops, double eta_s) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | %.0f tok/s | MFU %.1f%%",
                static_cast<long long>(s.step), static_cast<long long>(total_steps), s.loss,
                s.tokens_per_s, 100.0 * s.flops / s.seconds / 1e9 / peak_gflops);
  std::string line = buf;
  if (eta_s >= 0) line += " | ETA " + format_duration(eta_s);
  return line;
}

void EtaClock::step_done(int64_t step, double step_seconds) {
  const auto now = std::chrono::steady_clock::now();
  if (first_step_ < 0) first_step_ = step, first_seconds_ = step_seconds, first_end_ = now;
  last_step_ = step, last_end_ = now;
}

double EtaClock::eta_s(int64_t total_steps) const {
  if (first_step_ < 0 || last_step_ >= total_steps) return -1.0;
  const double left = double(total_steps - last_step_);
  if (last_step_ == first_step_) return first_seconds_ * left;
  const double since = std::chrono::duration<double>(last_end_ - first_end_).count();
  return since / double(last_step_ - first_step_) * left;
}

std::string val_line(int64_t step, double val_loss, double seconds) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %5lld | val loss %.4f | val ppl %.2f | %.2f s",
                static_cast<long long>(step), val_loss, std::exp(val_loss), seconds);
  return buf;
}

namespace {

// Keeps the rows of steps 1..last of a metrics file (atomically: a new file renamed over it).
void keep_rows_through(const std::string& path, int64_t last) {
  std::ifstream in(path);
  if (!in.good()) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const bool row = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    if (row && j["step"].get<int64_t>() <= last) kept += line + '\n';
  }
  in.close();
  try {
    atomic_write(path, kept, IoError::input);
  } catch (const InputError& e) {
    STRATA_INPUT_FAIL(e.what(), "; set train.run_dir (or --run-dir) to a writable path");
  }
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, int64_t resumed_step) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create run directory '", run_dir, "': ", ec.message(),
                     "; set train.run_dir (or --run-dir) to a writable path");
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  if (resumed_step > 0) keep_rows_through(path_, resumed_step);
  out_.open(path_, resumed_step > 0 ? std::ios::app : std::ios::trunc);
  STRATA_INPUT_CHECK(out_.good(), "cannot write ", path_,
                     "; set train.run_dir (or --run-dir) to a writable path");
}

void MetricsLog::write(const StepMetrics& s, double peak_gflops, std::optional<double> val_loss,
                       const nlohmann::json* stragglers) {
  nlohmann::json j;
  j["step"] = s.step;
  j["loss"] = s.loss;
  if (val_loss) {
    j["val_loss"] = *val_loss;
    j["val_ppl"] = std::exp(*val_loss);
  }
  j["lr"] = s.lr;
  j["grad_norm"] = s.grad_norm;
  j["loss_scale"] = s.loss_scale;
  j["skipped"] = s.skipped;
  j["tokens"] = s.tokens;
  j["trained_tokens"] = s.trained_tokens;
  j["step_time_s"] = s.seconds;
  j["forward_s"] = s.forward_s;
  j["backward_s"] = s.backward_s;
  j["optimizer_s"] = s.optimizer_s;
  j["comm_exposed_s"] = s.comm_exposed_s;
  j["gather_exposed_s"] = s.gather_exposed_s;
  j["comm_bytes"] = s.comm_bytes;
  j["cross_group_bytes"] = s.cross_group_bytes;
  j["tp_comm_s"] = s.tp_comm_s;
  j["tp_bytes"] = s.tp_bytes;
  if (s.ep_comm_s >= 0) j["ep_comm_s"] = s.ep_comm_s;
  j["recompute_s"] = s.recompute_s;
  j["pipeline_wait_s"] = s.pipeline_wait_s;
  if (!s.recompute_block_s.empty()) {
    j["recompute_block_s"] =
        std::vector<double>(s.recompute_block_s.begin(), s.recompute_block_s.end());
  }
  j["tokens_per_s"] = s.tokens_per_s;
  j["trained_tokens_per_s"] = s.trained_tokens_per_s;
  if (s.moe_aux_loss >= 0) j["moe_aux_loss"] = s.moe_aux_loss;
  if (s.moe_dropped >= 0) j["moe_dropped"] = s.moe_dropped;
  if (!s.expert_layers.empty()) {  // {"layer": [tokens of each expert]}
    nlohmann::json tokens = nlohmann::json::object();
    for (size_t i = 0; i < s.expert_layers.size(); ++i) {
      const auto row = s.expert_tokens.subspan(i * size_t(s.experts), size_t(s.experts));
      tokens[std::to_string(s.expert_layers[i])] = std::vector<double>(row.begin(), row.end());
    }
    j["expert_tokens"] = tokens;
  }
  j["mfu"] = s.flops / s.seconds / 1e9 / peak_gflops;
  nlohmann::json mem;
  for (int c = 0; c < kNumMemCategories; ++c) {
    mem[mem_category_name(MemCategory(c))] = s.peak_bytes[size_t(c)];
  }
  j["peak_bytes"] = mem;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["max_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;  // this process (rank 0), since it started
  if (stragglers != nullptr) j["stragglers"] = *stragglers;
  out_ << j.dump() << '\n';
  out_.flush();
}

}  // namespace strata
