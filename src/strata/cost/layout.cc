#include "strata/cost/layout.h"

#include <algorithm>
#include <cstdlib>

namespace strata::cost {

Layout layout_of(const Config& c) {
  Layout l;
  l.seq_len = c.model.seq_len, l.hidden = c.model.hidden, l.layers = c.model.layers;
  l.micro_batch = c.train_micro_batch_size_per_gpu;
  l.accumulation = c.gradient_accumulation_steps;
  l.zero = zero_options(c);
  const bool sgd = c.optimizer.type == "sgd";
  l.moments = sgd ? (c.optimizer.momentum != 0.0f ? 1 : 0) : 2;
  l.sequence_parallel = c.parallelism.sequence_parallel;
  l.recompute = recompute_options(c);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  l.local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  return l;
}

}  // namespace strata::cost
