// What the planner (planner/search.h) knows of one device and its links: the rates its time model
// divides by, the memory a rank may fill, and where each figure comes from. Built in for the
// GPUs users plan for (datasheet figures, saying so), measured for this machine by
// `strata bench --calibrate`, or read from a JSON file of the same form (write_profile):
//
//   {"strata_device_profile": 1, "name": "...", "kind": "cpu" | "gpu", "source": "...",
//    "memory_bytes": N, "host_memory_bytes": N, "devices_per_node": K,
//    "cores": N, "threads_per_rank": T,
//    "gemm_tflops": {"fp32": x, "bf16": y, "fp16": z},
//    "gemm_efficiency": [[flops_per_call, fraction_of_peak], ...],
//    "gemm_efficiency_rows": [[rows, fraction_of_peak], ...],
//    "memory_bandwidth_gbps": x, "op_overhead_us": x,
//    "elementwise_gbps": {"gpt2": x, "llama": y},
//    "attention_tflops": [[seq_len, rate], ...],
//    "intra_node": {"alpha_us": a, "bandwidth_gbps": b},
//    "inter_node": {"alpha_us": a, "bandwidth_gbps": b},
//    "step_fits": [{"ranks_per_node": R, "model_scale": a, "per_collective_us": b,
//                   "per_gather_us": g, "per_message_us": c, "per_call_us": e,
//                   "per_tp_beside_reductions_us": h, "per_contended_collective_us": k,
//                   "per_step_us": d, "probes": K,
//                   "source": "..."}]}
//
// Rates are per device (a GPU) or per rank's share of a host's cores (a CPU; see cpu_share). A
// GEMM of F FLOPs runs at gemm_tflops[dtype] × efficiency(F), the efficiency interpolated in log F
// between the measured points (1 beyond the last). Measured here, a point is a linear layer's
// forward and backward products together (y = x·wᵀ, dx = dy·w, dw += dyᵀ·x) with its weights
// cold, as a step meets each layer's once a micro-batch; a calibration also keys the same points
// by the products' rows (gemm_efficiency_rows), which carries over between models of other widths
// where FLOPs do not (a CPU's small products are bound by streaming their weights), and the
// planner uses that curve where it has one. A calibration also times the model's own kernels: a
// block's elementwise ones (norms, activation, residual adds, RoPE) per family, as bytes of the
// planner's count per second (elementwise_gbps; memory_bandwidth_gbps where a family was not
// measured), and causal attention's forward and backward as the planner's 4·T²·width FLOPs per
// second by sequence length (attention_tflops, interpolated in log T; the GEMM rate where absent).
// Collectives follow the α–β model: a message of n bytes over a link costs alpha + n / bandwidth.
//
// A step fit corrects the model where it cannot see: what a step of R ranks on one node costs
// beyond the α–β and FLOP model (the scheduler's slices between ranks that share cores, the
// progress of MPI calls, thread wake-ups). `strata plan --fit K` measures K probe layouts of a
// config at R ranks and fits step = a·model + b·collectives + g·ZeRO-3 gathers + c·messages +
// e·kernel calls + h·tensor-parallel collectives beside background reductions + d
// (non-negative least squares); plans of R ranks per node then use it, and say so.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/dtype.h"

namespace strata::cost {

struct Link {
  double alpha_s = 0.0;      // latency per message
  double bytes_per_s = 0.0;  // bandwidth of one rank's link
  double seconds(double bytes) const { return alpha_s + bytes / bytes_per_s; }
};

struct StepFit {
  int ranks_per_node = 0;         // the ranks sharing one node when it was measured
  double model_scale = 1.0;       // a: of the modelled step
  double per_collective_s = 0.0;  // b: per collective call on the critical rank
  double per_message_s = 0.0;     // c: per pipeline send or receive
  double per_call_s = 0.0;        // e: per kernel call
  double per_gather_s = 0.0;      // g: per ZeRO-3 parameter gather
  double per_tp_beside_s = 0.0;   // h: per tp collective beside overlap_comm's reductions
  double per_contended_s = 0.0;   // k: per tp/cp collective on cores another stage shares
  double per_step_s = 0.0;        // d: per step
  int probes = 0;
  std::string source;  // "strata plan --fit 12 on <config>, <date>"
};

struct DeviceProfile {
  std::string name;  // "h100", "cpu: Intel(R) Xeon(R) ..."
  bool gpu = false;
  std::string source;         // "datasheet: ...", "measured by strata bench --calibrate on ..."
  uint64_t memory_bytes = 0;  // one device's memory (a CPU host's: its RAM)
  uint64_t host_memory_bytes = 0;  // one node's host memory (pinned checkpoints, CPU ranks)
  int devices_per_node = 1;        // GPUs per node (a CPU host: 0, ranks share its cores)
  int cores = 1;                   // a CPU host's cores the calibration ran on
  int threads_per_rank = 1;        // threads the calibration's GEMM rates were measured with
  double fp32_flops = 0.0, bf16_flops = 0.0, fp16_flops = 0.0;  // dense GEMM peak per device
  std::vector<std::pair<double, double>> gemm_efficiency;       // (FLOPs per call, fraction)
  std::vector<std::pair<double, double>> gemm_efficiency_rows;  // (rows, fraction)
  double memory_bytes_per_s = 0.0;  // streaming ops (the optimizer): bytes read + written per s
  // A family's ("gpt2", "llama") block elementwise kernels: the planner's bytes per second.
  std::vector<std::pair<std::string, double>> elementwise_bytes_per_s;
  std::vector<std::pair<double, double>> attention_flops;  // (seq_len, FLOP/s), by seq_len
  double op_overhead_s = 0.0;  // fixed cost of one kernel call (launch, threads' fork-join)
  Link intra_node, inter_node;
  std::vector<StepFit> step_fits;  // by ranks_per_node (at most one each)

  // The fit for ranks_per_node ranks on a node, or nullptr.
  const StepFit* step_fit(int ranks_per_node) const;

  // The dense GEMM rate for dtype (fp16 falls back to bf16's where not given).
  double peak_flops(DType dtype) const;
  // Seconds of one GEMM of `flops` FLOPs in dtype on one rank, `ranks_sharing` ranks sharing this
  // device's (a CPU host's) cores.
  double gemm_seconds(double flops, DType dtype, int ranks_sharing = 1) const;
  // The same for a product of `rows` rows: by gemm_efficiency_rows where the profile has it (and
  // rows > 0).
  double gemm_seconds(double flops, double rows, DType dtype, int ranks_sharing) const;
  // Seconds of streaming work moving `bytes`.
  double memory_seconds(double bytes, int ranks_sharing = 1) const;
  // Seconds of a `family` block's elementwise kernels moving `bytes` (the planner's count).
  double elementwise_seconds(double bytes, const std::string& family, int ranks_sharing = 1) const;
  // Seconds of causal attention's `flops` (4·T²·width a sequence and pass) at sequence length T.
  double attention_seconds(double flops, double T, DType dtype, int ranks_sharing = 1) const;
  // Seconds of `calls` kernel calls' fixed cost.
  double overhead_seconds(double calls, int ranks_sharing = 1) const;
};

// The built-in profiles: "a100" (A100 SXM 80 GB), "h100" (H100 SXM), "h200" (H200 SXM). Each
// figure is the vendor's datasheet (dense, without sparsity) or, for links, the interconnect's
// nominal rate; source says which.
std::vector<std::string> builtin_profile_names();
// "cpu" / a built-in name / a path to a profile file; "cpu" reads `cpu_calibration` when it
// exists and otherwise fails naming `strata bench --calibrate`. An unknown name or a bad file is
// an InputError naming what is wrong.
DeviceProfile load_profile(const std::string& name_or_path, const std::string& cpu_calibration);
DeviceProfile read_profile(const std::string& path);
// Writes atomically (no half-written file on failure).
void write_profile(const DeviceProfile& p, const std::string& path);
// Where `strata bench --calibrate` writes and `strata plan --device cpu` reads by default:
// $STRATA_CALIBRATION, else $XDG_CACHE_HOME/strata/calibration.json, else
// ~/.cache/strata/calibration.json.
std::string default_calibration_path();

}  // namespace strata::cost
