// The layout `strata launch --elastic` (re)starts a job in, on the workers still available: the
// largest valid world size, tensor × pipeline × context kept where they fit, the data-parallel
// size what remains, the expert-parallel size kept or shrunk to a divisor of it that divides the
// data × context ranks, and the gradient accumulation recomputed so that the global batch stays
// the same.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/config/config.h"

namespace strata {

struct ElasticHost {
  std::string name;
  int slots = 0;  // workers (processes) this host can run
};

struct ElasticLayout {
  int world = 0, tensor = 1, pipeline = 1, context = 1, dp = 1;
  int expert = 1;  // parallelism.expert
  int64_t batch = 0, micro = 0, accumulation = 0;
  std::vector<int> ranks_per_host;  // by host, in order; each a multiple of `tensor`
  // "--set" values that give `strata train` this layout (empty: the config as written).
  std::vector<std::string> overrides;
  // "dp 2 x tp 2 x pp 1 = 4 ranks; batch 12 = micro 1 x accumulation 6 x dp 2"
  std::string describe() const;
};

// Loads the user's config with these extra overrides (their own --set ones applied first).
using ConfigLoader = std::function<Config(const std::vector<std::string>& overrides)>;

// The layout for `hosts` with min_ranks..max_ranks processes. `batch` is the global batch to keep;
// 0 takes the config's own batch triangle (the first start), and the result's `batch` is then the
// one to keep. Tries tensor × pipeline × context as configured, then (only where they cannot
// fit) smaller divisors of them, tensor kept longest, then context; within that the most ranks;
// within that the largest micro-batch not above the configured one. Every candidate goes through
// train's own checks (the elasticity block, the batch triangle, sequence, context and pipeline
// splits, MiCS shard groups).
// A tensor-parallel group never spans hosts; ranks fill the hosts in order (mpirun's by-slot
// mapping). Throws InputError saying why when nothing fits.
ElasticLayout choose_elastic_layout(const ConfigLoader& load, const std::vector<ElasticHost>& hosts,
                                    int min_ranks, int max_ranks, int64_t batch);

}  // namespace strata
