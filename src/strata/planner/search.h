// The layout planner behind `strata plan` (DESIGN.md §8): every layout a config's model and
// global batch allow on a cluster, each either refused with the first reason train would give
// (train's own config parser, batch resolution and layout checks) or predicted: memory per rank
// by category from the same functions the engine allocates by (cost::predict_memory for the model
// states, the chunks' arena layout for activations, workspace and checkpoints, the pipeline's
// buffers), and step time as compute + pipeline bubble + exposed communication by the cost
// model (cost/step_time.h) against a device profile (cost/device_profile.h). Rows are ranked by
// predicted step time.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/memory.h"
#include "strata/cost/device_profile.h"
#include "strata/cost/step_time.h"

namespace strata::planner {

struct Cluster {
  int devices = 1;   // ranks: one per GPU, or the CPU ranks of the job
  int per_node = 1;  // ranks per node (the hostfile's slots, or --devices-per-node)
  // (host, slots) in rank order; synthetic ("node0", ...) without a hostfile.
  std::vector<std::pair<std::string, int>> hosts;
};
// `devices` ranks on nodes of `per_node` (the last node may hold fewer).
Cluster uniform_cluster(int devices, int per_node);

struct Candidate {
  int dp = 1, tp = 1, pp = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  int zero = 0;
  int64_t mics = -1;  // zero_optimization.mics_shard_size (-1: the whole data-parallel group)
  bool sequence_parallel = false;
  int cp = 1;                            // parallelism.context
  std::string context_impl = "ulysses";  // ulysses | ring (with cp > 1)
  int ep = 1;                            // parallelism.expert (a mixture of experts)
  bool whole_experts = false;            // parallelism.expert_tensor 1 (tp > 1, with SP)
  std::string recompute = "none";        // none | selective | full
  int64_t micro_batch = 1, accumulation = 1;
};
// "dp4 tp2 pp2/1f1b z1 mb2x4 sp rc=full" and the like.
std::string describe(const Candidate& c);

// A layout's prediction: its memory by category (the stage whose rank holds the most), and its
// step's time by part (cost/step_time.h).
struct Prediction : cost::StepTime {
  std::array<size_t, kNumMemCategories> bytes{};  // the rank of the stage with the most memory
  size_t device_bytes = 0;     // of those, what lives in device memory (not HostCheckpoints)
  size_t node_host_bytes = 0;  // host memory of one node's ranks (CPU ranks: everything)
  int worst_stage = 0;
  // Every stage's rank (tensor-parallel rank 0), by category.
  std::vector<std::array<size_t, kNumMemCategories>> stage_bytes;
};

struct Row {
  Candidate c;
  std::string reason;  // empty: valid
  Prediction p;
  bool valid() const { return reason.empty(); }
};

struct PlanInput {
  nlohmann::json base;  // the user's config (DeepSpeed-style JSON)
  Cluster cluster;
  cost::DeviceProfile device;
};

// Every candidate for the base config's model and train_batch_size on the cluster (an
// InputError if the config has no train_batch_size, or the model cannot be read).
std::vector<Candidate> enumerate(const PlanInput& in);
// The base config with the candidate's layout keys set: what --emit-config writes.
nlohmann::json candidate_config(const nlohmann::json& base, const Candidate& c);
Row evaluate(const PlanInput& in, const Candidate& c);
// The same, sharing the model specs of each cut (tp, stages, shard group) with other calls.
struct SpecCache;
Row evaluate(const PlanInput& in, const Candidate& c, SpecCache& cache);
// Every candidate evaluated: the valid ones by predicted step time (equal to single precision: by
// device memory), then the refused ones.
std::vector<Row> plan(const PlanInput& in);
// The memory by category and the time split of one row, as text.
std::string explain(const PlanInput& in, const Row& r);

}  // namespace strata::planner
