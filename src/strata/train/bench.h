// strata bench: the step time of a model on random tokens, in the units the peers report
// (tokens/s, MFU against the machine's peak, memory by category), on one rank or every rank of
// the job; with --report the figures strata plan --verify and --fit read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct BenchOptions {
  std::string model = "bench-23M";
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  int64_t micro_batch = 8;
  int seq_len = 0;  // 0: the preset's
  int steps = 5;
  int warmup = 1;
  // Data parallelism, when launched on several ranks (strata launch -n N -- bench ...).
  std::string overlap = "on";
  int64_t bucket = 500000000;  // reduce_bucket_size, elements
  // Tensor parallelism over groups of this many ranks (dp = ranks / tensor).
  int tensor = 1;
  bool sequence_parallel = false;
  // Context parallelism: each sequence split over this many ranks, by "ulysses" or "ring".
  int context = 1;
  std::string context_impl = "ulysses";
  // Pipeline parallelism: stages, schedule, micro-batches per step, virtual stages.
  int pipeline = 1;
  std::string schedule = "1f1b";
  int micro = 1;
  int virtual_stages = 1;
  std::string partition = "time";
  int layers = 0;                      // 0: the preset's
  std::vector<std::string> overrides;  // --set a.b.c=value
  std::string device = "cpu";          // train.device: cpu | cuda
  std::string config;                  // --config: the model and layout from a config file
  std::string report;                  // --report: the median step and memory, as JSON
};

// Times warmup + steps steps for each dtype and prints the median step.
void run_bench(const BenchOptions& o);

}  // namespace strata
