#include "strata/cost/device_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"

namespace strata::cost {

using nlohmann::json;

double DeviceProfile::peak_flops(DType dtype) const {
  switch (dtype) {
    case DType::BF16:
      return bf16_flops > 0 ? bf16_flops : fp32_flops;
    case DType::F16:
      return fp16_flops > 0 ? fp16_flops : peak_flops(DType::BF16);
    default:
      return fp32_flops;
  }
}

namespace {

// The fraction of the peak a GEMM of `flops` reaches: the measured points interpolated in
// log(flops), the first point's fraction below it and the last's beyond it.
double efficiency(const std::vector<std::pair<double, double>>& curve, double flops) {
  if (curve.empty()) return 1.0;
  if (flops <= curve.front().first) return curve.front().second;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (flops <= curve[i].first) {
      const double a = std::log(curve[i - 1].first), b = std::log(curve[i].first);
      const double t = (std::log(flops) - a) / (b - a);
      return curve[i - 1].second + t * (curve[i].second - curve[i - 1].second);
    }
  }
  return curve.back().second;
}

// A CPU rate was measured with threads_per_rank threads; `ranks` ranks on the host's cores get
// cores / ranks threads each (at least one; oversubscribed ranks share a core).
double cpu_share(const DeviceProfile& p, int ranks) {
  if (p.gpu) return 1.0;
  const double per_rank = double(std::max(1, p.cores)) / double(std::max(1, ranks));
  return std::min(per_rank, double(std::max(1, p.cores))) / double(std::max(1, p.threads_per_rank));
}

}  // namespace

double DeviceProfile::gemm_seconds(double flops, DType dtype, int ranks_sharing) const {
  return gemm_seconds(flops, 0.0, dtype, ranks_sharing);
}

double DeviceProfile::gemm_seconds(double flops, double rows, DType dtype,
                                   int ranks_sharing) const {
  if (flops <= 0) return 0.0;
  // By rows where the profile has that curve and the caller the rows, else by FLOPs.
  const double eff = !gemm_efficiency_rows.empty() && rows > 0
                         ? efficiency(gemm_efficiency_rows, rows)
                         : efficiency(gemm_efficiency, flops);
  return flops / (peak_flops(dtype) * eff * cpu_share(*this, ranks_sharing));
}

double DeviceProfile::memory_seconds(double bytes, int ranks_sharing) const {
  if (bytes <= 0 || memory_bytes_per_s <= 0) return 0.0;
  // Memory bandwidth is the host's: ranks sharing it divide it.
  const double share = gpu ? 1.0 : 1.0 / double(std::max(1, ranks_sharing));
  return bytes / (memory_bytes_per_s * share);
}

double DeviceProfile::elementwise_seconds(double bytes, const std::string& family,
                                          int ranks_sharing) const {
  for (const auto& [f, rate] : elementwise_bytes_per_s) {
    if (f == family && rate > 0 && bytes > 0)
      return bytes / (rate * cpu_share(*this, ranks_sharing));
  }
  return memory_seconds(bytes, ranks_sharing);
}

double DeviceProfile::attention_seconds(double flops, double T, DType dtype,
                                        int ranks_sharing) const {
  if (flops <= 0) return 0.0;
  if (attention_flops.empty()) return gemm_seconds(flops, dtype, ranks_sharing);
  // The measured rates interpolated in log T, the first's below it and the last's beyond.
  double rate = attention_flops.front().second;
  for (size_t i = 1; i < attention_flops.size(); ++i) {
    const auto& [t0, r0] = attention_flops[i - 1];
    const auto& [t1, r1] = attention_flops[i];
    if (T <= t0) break;
    rate = r1;
    if (T <= t1) {
      rate = r0 + (std::log(T) - std::log(t0)) / (std::log(t1) - std::log(t0)) * (r1 - r0);
      break;
    }
  }
  return flops / (rate * cpu_share(*this, ranks_sharing));
}

double DeviceProfile::overhead_seconds(double calls, int ranks_sharing) const {
  // Ranks beyond the cores take turns on them.
  const double turns =
      gpu ? 1.0 : std::max(1.0, double(ranks_sharing) * threads_per_rank / std::max(1, cores));
  return calls * op_overhead_s * turns;
}

namespace {

constexpr double kGB = 1e9, kGiB = 1073741824.0;

// The efficiency of cuBLASLt bf16 GEMMs against the datasheet's dense peak, measured on one H200
// by scripts/gpu_check.sh (bench/results_gpu_2026-12-04.txt): GPT-2-124M's K = 768 shapes (7.7e10
// to 2.4e11 FLOPs per call), 2048·2048·13312 and 8192³ / 4096·4096·16384.
const std::vector<std::pair<double, double>> kHopperCurve = {
    {1e9, 0.30}, {7.7e10, 0.63}, {2.4e11, 0.68}, {1.1e12, 0.82}, {2.2e12, 0.85}};

DeviceProfile gpu_profile(const std::string& name, double bf16_tflops, double fp32_tflops,
                          double mem_gb, double hbm_tbps, double nvlink_gbps, double ib_gbps,
                          const std::string& source) {
  DeviceProfile p;
  p.name = name, p.gpu = true, p.source = source;
  p.memory_bytes = uint64_t(mem_gb * kGB);
  p.host_memory_bytes = uint64_t(2048 * kGiB);  // a DGX/HGX node's host memory
  p.devices_per_node = 8;
  p.fp32_flops = fp32_tflops * 1e12, p.bf16_flops = p.fp16_flops = bf16_tflops * 1e12;
  p.gemm_efficiency = kHopperCurve;
  p.memory_bytes_per_s = hbm_tbps * 1e12;
  p.op_overhead_s = 5e-6;  // a kernel launch, CUDA's typical figure
  // NCCL's small-message latency inside a node (NVLink/NVSwitch) and across (InfiniBand):
  // typical figures, not measured here.
  p.intra_node = {8e-6, nvlink_gbps * kGB};
  p.inter_node = {20e-6, ib_gbps * kGB};
  return p;
}

DeviceProfile builtin(const std::string& name) {
  const std::string links =
      "; links: NVLink per direction and one 200/400 Gb/s InfiniBand NIC per GPU, NCCL latencies "
      "8 us / 20 us assumed; GEMM efficiency by size measured on an H200 "
      "(bench/results_gpu_2026-12-04.txt) and assumed alike";
  if (name == "a100") {
    return gpu_profile("a100", 312, 19.5, 80, 2.039, 300, 25,
                       "datasheet: NVIDIA A100 SXM4 80GB, dense bf16 312 TFLOP/s, fp32 19.5, "
                       "80 GB HBM2e at 2.0 TB/s" +
                           links);
  }
  if (name == "h100") {
    return gpu_profile("h100", 989.5, 67, 80, 3.35, 450, 50,
                       "datasheet: NVIDIA H100 SXM5, dense bf16 989.5 TFLOP/s, fp32 67, 80 GB "
                       "HBM3 at 3.35 TB/s" +
                           links);
  }
  if (name == "h200") {
    DeviceProfile p = gpu_profile("h200", 989.5, 67, 141, 4.8, 450, 50,
                                  "datasheet: NVIDIA H200 SXM, dense bf16 989.5 TFLOP/s, fp32 67, "
                                  "141 GB HBM3e at 4.8 TB/s" +
                                      links);
    return p;
  }
  STRATA_INPUT_FAIL("unknown device \"", name, "\"");
}

json link_json(const Link& l) {
  return {{"alpha_us", l.alpha_s * 1e6}, {"bandwidth_gbps", l.bytes_per_s / kGB}};
}

Link read_link(const json& j, const std::string& path, const char* key) {
  STRATA_INPUT_CHECK(j.is_object() && j.contains("alpha_us") && j.contains("bandwidth_gbps") &&
                         j["alpha_us"].is_number() && j["bandwidth_gbps"].is_number() &&
                         j["bandwidth_gbps"].get<double>() > 0 && j["alpha_us"].get<double>() >= 0,
                     "device profile ", path, ": \"", key,
                     "\" must be {\"alpha_us\": >= 0, \"bandwidth_gbps\": > 0}");
  return {j["alpha_us"].get<double>() * 1e-6, j["bandwidth_gbps"].get<double>() * kGB};
}

// An optional list of [x, y] pairs at j[key], sorted by x: x >= x_min, 0 < y (<= y_max where
// y_max > 0).
std::vector<std::pair<double, double>> read_curve(const json& j, const std::string& path,
                                                  const char* key, const char* x, double x_min,
                                                  const char* y, double y_max) {
  std::vector<std::pair<double, double>> curve;
  if (!j.contains(key)) return curve;
  const json& c = j[key];
  STRATA_INPUT_CHECK(c.is_array(), "device profile ", path, ": \"", key, "\" must be a list of [",
                     x, ", ", y, "] pairs");
  for (const json& e : c) {
    STRATA_INPUT_CHECK(e.is_array() && e.size() == 2 && e[0].is_number() && e[1].is_number() &&
                           e[0].get<double>() >= x_min && e[1].get<double>() > 0 &&
                           (y_max <= 0 || e[1].get<double>() <= y_max),
                       "device profile ", path, ": each \"", key, "\" entry must be [", x,
                       x_min < 1 ? " > 0" : " >= 1", ", ", y,
                       y_max > 0 ? " in (0, " + std::to_string(y_max).substr(0, 3) + "]" : " > 0",
                       "]");
    curve.emplace_back(e[0].get<double>(), e[1].get<double>());
  }
  std::sort(curve.begin(), curve.end());
  return curve;
}

}  // namespace

std::vector<std::string> builtin_profile_names() {
  return {"a100", "h100", "h200"};
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("STRATA_CALIBRATION"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return std::string(x) + "/strata/calibration.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/tmp") +
         "/.cache/strata/calibration.json";
}

DeviceProfile read_profile(const std::string& path) {
  std::ifstream in(path);
  STRATA_INPUT_CHECK(in.good(), "cannot read device profile ", path,
                     ": it does not exist or is not readable (write one with strata bench "
                     "--calibrate --output ",
                     path, ")");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  STRATA_INPUT_CHECK(!j.is_discarded() && j.is_object(), "device profile ", path,
                     " is not a JSON object");
  STRATA_INPUT_CHECK(j.value("strata_device_profile", 0) == 1, "device profile ", path,
                     " lacks \"strata_device_profile\": 1 (not a file strata bench --calibrate "
                     "wrote?)");
  auto num = [&](const char* key, double lo) {
    STRATA_INPUT_CHECK(j.contains(key) && j[key].is_number() && j[key].get<double>() >= lo,
                       "device profile ", path, ": \"", key, "\" must be a number >= ", lo);
    return j[key].get<double>();
  };
  DeviceProfile p;
  p.name = j.value("name", path);
  STRATA_INPUT_CHECK(
      j.contains("kind") && j["kind"].is_string() && (j["kind"] == "cpu" || j["kind"] == "gpu"),
      "device profile ", path, ": \"kind\" must be \"cpu\" or \"gpu\"");
  p.gpu = j["kind"] == "gpu";
  p.source = j.value("source", std::string("file ") + path);
  p.memory_bytes = uint64_t(num("memory_bytes", 1));
  p.host_memory_bytes =
      j.contains("host_memory_bytes") ? uint64_t(num("host_memory_bytes", 1)) : p.memory_bytes;
  p.devices_per_node = int(j.contains("devices_per_node") ? num("devices_per_node", 0) : 1);
  p.cores = int(j.contains("cores") ? num("cores", 1) : 1);
  p.threads_per_rank = int(j.contains("threads_per_rank") ? num("threads_per_rank", 1) : 1);
  const json& g = j.contains("gemm_tflops") ? j["gemm_tflops"] : json();
  STRATA_INPUT_CHECK(
      g.is_object() && g.contains("fp32") && g["fp32"].is_number() && g["fp32"].get<double>() > 0,
      "device profile ", path,
      ": \"gemm_tflops\" must hold \"fp32\" > 0 (and "
      "optionally \"bf16\", \"fp16\")");
  p.fp32_flops = g["fp32"].get<double>() * 1e12;
  if (g.contains("bf16") && g["bf16"].is_number()) p.bf16_flops = g["bf16"].get<double>() * 1e12;
  if (g.contains("fp16") && g["fp16"].is_number()) p.fp16_flops = g["fp16"].get<double>() * 1e12;
  p.gemm_efficiency = read_curve(j, path, "gemm_efficiency", "flops", 1e-300, "fraction", 1.5);
  p.gemm_efficiency_rows = read_curve(j, path, "gemm_efficiency_rows", "rows", 1, "fraction", 1.5);
  p.memory_bytes_per_s = num("memory_bandwidth_gbps", 0) * kGB;
  if (j.contains("elementwise_gbps")) {
    const json& e = j["elementwise_gbps"];
    STRATA_INPUT_CHECK(e.is_object(), "device profile ", path,
                       ": \"elementwise_gbps\" must be an object of family: rate > 0");
    for (const auto& [family, rate] : e.items()) {
      STRATA_INPUT_CHECK(rate.is_number() && rate.get<double>() > 0, "device profile ", path,
                         ": \"elementwise_gbps\".", family, " must be a number > 0");
      p.elementwise_bytes_per_s.emplace_back(family, rate.get<double>() * kGB);
    }
  }
  p.attention_flops = read_curve(j, path, "attention_tflops", "seq_len", 1, "TFLOP/s", 0);
  for (auto& [T, rate] : p.attention_flops) rate *= 1e12;
  if (j.contains("op_overhead_us")) p.op_overhead_s = num("op_overhead_us", 0) * 1e-6;
  STRATA_INPUT_CHECK(j.contains("intra_node"), "device profile ", path,
                     ": \"intra_node\" {\"alpha_us\", \"bandwidth_gbps\"} is missing");
  p.intra_node = read_link(j["intra_node"], path, "intra_node");
  p.inter_node =
      j.contains("inter_node") ? read_link(j["inter_node"], path, "inter_node") : p.intra_node;
  if (j.contains("step_fits")) {
    STRATA_INPUT_CHECK(j["step_fits"].is_array(), "device profile ", path,
                       ": \"step_fits\" must be a list (strata plan --fit writes it)");
    for (const json& f : j["step_fits"]) {
      auto field = [&](const char* key, double lo) {
        STRATA_INPUT_CHECK(
            f.is_object() && f.contains(key) && f[key].is_number() && f[key].get<double>() >= lo,
            "device profile ", path, ": each \"step_fits\" entry needs \"", key, "\" >= ", lo,
            "; remove the entry and run strata plan --fit again");
        return f[key].get<double>();
      };
      StepFit s;
      s.ranks_per_node = int(field("ranks_per_node", 1));
      s.model_scale = field("model_scale", 0);
      s.per_collective_s = field("per_collective_us", 0) * 1e-6;
      s.per_message_s = field("per_message_us", 0) * 1e-6;
      s.per_call_s = f.contains("per_call_us") ? field("per_call_us", 0) * 1e-6 : 0.0;
      s.per_gather_s = f.contains("per_gather_us") ? field("per_gather_us", 0) * 1e-6 : 0.0;
      s.per_tp_beside_s = f.contains("per_tp_beside_reductions_us")
                              ? field("per_tp_beside_reductions_us", 0) * 1e-6
                              : 0.0;
      s.per_contended_s = f.contains("per_contended_collective_us")
                              ? field("per_contended_collective_us", 0) * 1e-6
                              : 0.0;
      s.per_step_s = field("per_step_us", 0) * 1e-6;
      s.probes = int(f.value("probes", 0));
      s.source = f.value("source", std::string());
      STRATA_INPUT_CHECK(p.step_fit(s.ranks_per_node) == nullptr, "device profile ", path,
                         ": two \"step_fits\" for ranks_per_node ", s.ranks_per_node);
      p.step_fits.push_back(s);
    }
  }
  return p;
}

const StepFit* DeviceProfile::step_fit(int ranks_per_node) const {
  for (const StepFit& f : step_fits) {
    if (f.ranks_per_node == ranks_per_node) return &f;
  }
  return nullptr;
}

void write_profile(const DeviceProfile& p, const std::string& path) {
  json curve = json::array();
  for (const auto& [f, e] : p.gemm_efficiency) curve.push_back({f, e});
  json j = {{"strata_device_profile", 1},
            {"name", p.name},
            {"kind", p.gpu ? "gpu" : "cpu"},
            {"source", p.source},
            {"memory_bytes", p.memory_bytes},
            {"host_memory_bytes", p.host_memory_bytes},
            {"devices_per_node", p.devices_per_node},
            {"cores", p.cores},
            {"threads_per_rank", p.threads_per_rank},
            {"gemm_tflops",
             {{"fp32", p.fp32_flops / 1e12},
              {"bf16", p.bf16_flops / 1e12},
              {"fp16", p.fp16_flops / 1e12}}},
            {"gemm_efficiency", curve},
            {"memory_bandwidth_gbps", p.memory_bytes_per_s / kGB},
            {"op_overhead_us", p.op_overhead_s * 1e6},
            {"intra_node", link_json(p.intra_node)},
            {"inter_node", link_json(p.inter_node)}};
  if (!p.gemm_efficiency_rows.empty()) {
    json rows = json::array();
    for (const auto& [m, e] : p.gemm_efficiency_rows) rows.push_back({m, e});
    j["gemm_efficiency_rows"] = rows;
  }
  if (!p.elementwise_bytes_per_s.empty()) {
    json e = json::object();
    for (const auto& [family, rate] : p.elementwise_bytes_per_s) e[family] = rate / kGB;
    j["elementwise_gbps"] = e;
  }
  if (!p.attention_flops.empty()) {
    json a = json::array();
    for (const auto& [T, rate] : p.attention_flops) a.push_back({T, rate / 1e12});
    j["attention_tflops"] = a;
  }
  if (!p.step_fits.empty()) {
    json fits = json::array();
    for (const StepFit& f : p.step_fits) {
      fits.push_back({{"ranks_per_node", f.ranks_per_node},
                      {"model_scale", f.model_scale},
                      {"per_collective_us", f.per_collective_s * 1e6},
                      {"per_message_us", f.per_message_s * 1e6},
                      {"per_call_us", f.per_call_s * 1e6},
                      {"per_gather_us", f.per_gather_s * 1e6},
                      {"per_tp_beside_reductions_us", f.per_tp_beside_s * 1e6},
                      {"per_contended_collective_us", f.per_contended_s * 1e6},
                      {"per_step_us", f.per_step_s * 1e6},
                      {"probes", f.probes},
                      {"source", f.source}});
    }
    j["step_fits"] = fits;
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  }
  atomic_write(path, j.dump(2) + "\n", IoError::input);
}

DeviceProfile load_profile(const std::string& name_or_path, const std::string& cpu_calibration) {
  const std::vector<std::string> names = builtin_profile_names();
  if (std::find(names.begin(), names.end(), name_or_path) != names.end()) {
    return builtin(name_or_path);
  }
  if (name_or_path == "cpu") {
    STRATA_INPUT_CHECK(std::filesystem::exists(cpu_calibration),
                       "--device cpu: no calibration of this machine at ", cpu_calibration,
                       "; measure it first with `strata bench --calibrate` (or give a profile "
                       "file with --device FILE)");
    return read_profile(cpu_calibration);
  }
  STRATA_INPUT_CHECK(
      name_or_path.find('/') != std::string::npos || name_or_path.find('.') != std::string::npos,
      "unknown --device \"", name_or_path,
      "\": one of cpu, a100, h100, h200, or "
      "the path of a device profile (strata bench --calibrate --output FILE)");
  return read_profile(name_or_path);
}

}  // namespace strata::cost
