#include "strata/train/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "strata/core/check.h"
#include "strata/kernels/cpu/matmul.h"

namespace strata {

double measured_matmul_peak_gflops(DType dtype, int n) {
  static std::map<std::pair<DType, int>, double> cache;
  auto key = std::make_pair(dtype, n);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const size_t elems = size_t(n) * size_t(n);
  Buffer a(MemCategory::Workspace, elems * dtype_size(dtype));
  Buffer b(MemCategory::Workspace, elems * dtype_size(dtype));
  Buffer c(MemCategory::Workspace, elems * sizeof(float));
  const int64_t batch[2] = {1, 1};
  auto run = [&] {
    kernels::matmul({c.data(), DType::F32, n}, {a.data(), dtype, n, 1}, {b.data(), dtype, 1, n}, n,
                    n, n, batch);
  };
  run();  // warm-up: JIT and first touch
  // The best of several runs: the machine's capability, not its momentary load.
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double gflops = 2.0 * double(n) * n * n / best / 1e9;
  cache[key] = gflops;
  return gflops;
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
                          bool breakdown) {
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
  if (breakdown) {
    std::snprintf(buf, sizeof buf,
                  " | fwd %.3fs bwd %.3fs comm %.3fs gather %.3fs step %.3fs | wire %s",
                  s.forward_s, s.backward_s, s.comm_exposed_s, s.gather_exposed_s, s.optimizer_s,
                  format_bytes(size_t(s.comm_bytes)).c_str());
    line += buf;
  }
  return line;
}

MetricsLog::MetricsLog(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create run directory '", run_dir, "': ", ec.message(),
                     "; set train.run_dir (or --run-dir) to a writable path");
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  out_.open(path_, std::ios::trunc);
  STRATA_INPUT_CHECK(out_.good(), "cannot write ", path_,
                     "; set train.run_dir (or --run-dir) to a writable path");
}

void MetricsLog::write(const StepMetrics& s, double peak_gflops) {
  nlohmann::json j;
  j["step"] = s.step;
  j["loss"] = s.loss;
  j["lr"] = s.lr;
  j["grad_norm"] = s.grad_norm;
  j["loss_scale"] = s.loss_scale;
  j["skipped"] = s.skipped;
  j["tokens"] = s.tokens;
  j["step_time_s"] = s.seconds;
  j["forward_s"] = s.forward_s;
  j["backward_s"] = s.backward_s;
  j["optimizer_s"] = s.optimizer_s;
  j["comm_exposed_s"] = s.comm_exposed_s;
  j["gather_exposed_s"] = s.gather_exposed_s;
  j["comm_bytes"] = s.comm_bytes;
  j["cross_group_bytes"] = s.cross_group_bytes;
  j["tokens_per_s"] = s.tokens_per_s;
  j["mfu"] = s.flops / s.seconds / 1e9 / peak_gflops;
  nlohmann::json mem;
  for (int c = 0; c < kNumMemCategories; ++c) {
    mem[mem_category_name(MemCategory(c))] = s.peak_bytes[size_t(c)];
  }
  j["peak_bytes"] = mem;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["max_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;  // this process (rank 0), since it started
  out_ << j.dump() << '\n';
  out_.flush();
}

}  // namespace strata
