// The search follows deepspeed/elasticity/elasticity.py: each micro-batch size and their LCM is a
// base, scaled by the largest highly composite number that keeps it within the maximum batch; the
// candidate with the most GPU counts in [min_gpus, max_gpus] dividing it into micro-batches wins,
// ties going to the larger (or smaller) batch. Version 0.2 runs the same search over nodes.
#include "strata/config/elasticity.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>
#include <string>

#include "strata/core/check.h"

namespace strata {

namespace {

// DeepSpeed's HCN_LIST: the 38 smallest highly composite numbers.
constexpr int64_t kHighlyComposite[] = {
    1,      2,      4,      6,      12,     24,     36,     48,    60,    120,
    180,    240,    360,    720,    840,    1260,   1680,   2520,  5040,  7560,
    10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440, 83160, 110880,
    166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

template <typename T>
std::string list_text(const std::vector<T>& v) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << ']';
  return s.str();
}

// The largest highly composite number <= v (v >= 1); 720720 beyond the list, as DeepSpeed.
int64_t highly_composite_at_most(int64_t v) {
  int64_t h = 1;
  for (int64_t x : kHighlyComposite) {
    if (x <= v) h = x;
  }
  return h;
}

// Candidate batches: every base <= max_batch scaled up by a highly composite number. A base above
// the maximum (only the LCM can be) is dropped, as scaling would only grow it.
std::vector<int64_t> candidate_batch_sizes(const std::vector<int64_t>& micro, int64_t max_batch) {
  std::vector<int64_t> bases = micro;
  int64_t lcm = 1;
  for (int64_t m : micro) {
    const int64_t g = std::gcd(lcm, m);
    if (lcm / g > max_batch / m) {  // lcm / g × m > max_batch, without overflow
      lcm = 0;
      break;
    }
    lcm = lcm / g * m;
  }
  if (lcm > 0) bases.push_back(lcm);
  std::set<int64_t> out;
  for (int64_t base : bases) {
    if (base > max_batch) continue;
    out.insert(base == max_batch ? base : highly_composite_at_most(max_batch / base) * base);
  }
  return {out.begin(), out.end()};
}

// GPU counts in [lo, hi] at which `batch` splits into whole micro-batches of one listed size:
// batch / m itself and its divisors up to half of it.
std::vector<int> valid_gpus(int64_t batch, const std::vector<int64_t>& micro, int lo, int hi) {
  std::set<int> out;
  for (int64_t m : micro) {
    if (batch % m != 0) continue;
    const int64_t n = batch / m;
    if (lo <= n && n <= hi) out.insert(static_cast<int>(n));
    for (int64_t i = lo; i <= std::min<int64_t>(n / 2, hi); ++i) {
      if (n % i == 0) out.insert(static_cast<int>(i));
    }
  }
  return {out.begin(), out.end()};
}

struct Search {
  int64_t batch = 0;
  std::vector<int> valid;
};

// DeepSpeed's _get_compatible_gpus_v01. `what` names the maximum in messages.
Search search_v01(const std::vector<int64_t>& micro, int64_t max_batch, int min_gpus, int max_gpus,
                  bool prefer_larger, const std::string& what) {
  const int64_t smallest = *std::min_element(micro.begin(), micro.end());
  const int64_t largest = *std::max_element(micro.begin(), micro.end());
  STRATA_INPUT_CHECK(largest <= max_batch, "elasticity.micro_batch_sizes=", list_text(micro),
                     ": every micro-batch must be at most ", what, "=", max_batch);
  const int lo = min_gpus > 0 ? min_gpus : 1;
  const int hi =
      max_gpus > 0 ? max_gpus : static_cast<int>(std::min<int64_t>(max_batch / smallest, 1 << 30));
  Search best{smallest, {}};
  size_t most = 0;
  for (int64_t batch : candidate_batch_sizes(micro, max_batch)) {
    std::vector<int> valid = valid_gpus(batch, micro, lo, hi);
    const bool tie_won = prefer_larger ? batch > best.batch : batch < best.batch;
    if (valid.size() > most || (valid.size() == most && tie_won)) {
      most = valid.size();
      best = {batch, std::move(valid)};
    }
  }
  STRATA_INPUT_CHECK(!best.valid.empty(), "elasticity: no batch size up to ", what, "=", max_batch,
                     " splits into micro_batch_sizes=", list_text(micro), " on any count in [", lo,
                     ", ", hi,
                     "]; widen elasticity.min_gpus/max_gpus or raise max_train_batch_size");
  return best;
}

}  // namespace

ElasticPlan compute_elastic(const ElasticityConfig& e, int world_size) {
  STRATA_INPUT_CHECK(e.enabled, "elasticity.enabled is false; set it true to compute a plan");
  STRATA_INPUT_CHECK(e.max_train_batch_size > 0,
                     "elasticity.max_train_batch_size is required when elasticity.enabled is true");
  STRATA_INPUT_CHECK(!e.micro_batch_sizes.empty(),
                     "elasticity.micro_batch_sizes is required when elasticity.enabled is true");
  STRATA_INPUT_CHECK(e.min_gpus <= e.max_gpus, "elasticity.min_gpus=", e.min_gpus,
                     " cannot be greater than max_gpus=", e.max_gpus);
  const bool v01 = std::abs(e.version - 0.1) < 1e-9;
  const bool v02 = std::abs(e.version - 0.2) < 1e-9;
  STRATA_INPUT_CHECK(v01 || v02, "elasticity.version=", e.version,
                     " is not an elasticity version; use 0.1 or 0.2");
  const int mp = e.model_parallel_size;
  ElasticPlan plan;
  if (v01) {
    STRATA_INPUT_CHECK(mp == 1, "elasticity.model_parallel_size=", mp,
                       " needs elasticity.version 0.2");
    Search s = search_v01(e.micro_batch_sizes, e.max_train_batch_size, e.min_gpus, e.max_gpus,
                          e.prefer_larger_batch, "elasticity.max_train_batch_size");
    plan.train_batch_size = s.batch;
    plan.valid_dp_sizes = std::move(s.valid);
  } else {
    const int per_node = e.num_gpus_per_node;
    STRATA_INPUT_CHECK(per_node % mp == 0, "elasticity.num_gpus_per_node=", per_node,
                       " is not divisible by elasticity.model_parallel_size=", mp,
                       "; a model-parallel group must fit in a node");
    const int dp_per_node = per_node / mp;
    // Over nodes: the batch per node's data-parallel ranks, node counts.
    const Search s = search_v01(e.micro_batch_sizes, e.max_train_batch_size / dp_per_node,
                                e.min_gpus / per_node, e.max_gpus / per_node, e.prefer_larger_batch,
                                "elasticity.max_train_batch_size / data-parallel ranks per node");
    plan.train_batch_size = s.batch * dp_per_node;
    for (int nodes : s.valid) plan.valid_dp_sizes.push_back(nodes * dp_per_node);
    if (world_size > 0) {
      STRATA_INPUT_CHECK(world_size % mp == 0, "world size ", world_size,
                         " is not a multiple of elasticity.model_parallel_size=", mp);
      const int dp = world_size / mp;
      if (std::find(plan.valid_dp_sizes.begin(), plan.valid_dp_sizes.end(), dp) ==
          plan.valid_dp_sizes.end()) {
        // DeepSpeed's fallback: a batch for this data-parallel size only.
        std::vector<int64_t> batches;
        for (int64_t m : e.micro_batch_sizes) {
          batches.push_back(e.max_train_batch_size / (m * dp) * (m * dp));
        }
        const int64_t batch = e.prefer_larger_batch
                                  ? *std::max_element(batches.begin(), batches.end())
                                  : *std::min_element(batches.begin(), batches.end());
        STRATA_INPUT_CHECK(batch > 0, "elasticity: at ", world_size, " GPUs (data-parallel size ",
                           dp, ") no micro-batch of ", list_text(e.micro_batch_sizes),
                           " fits elasticity.max_train_batch_size=", e.max_train_batch_size);
        plan.train_batch_size = batch;
        plan.valid_dp_sizes = {dp};
      }
    }
  }
  for (int dp : plan.valid_dp_sizes) plan.valid_world_sizes.push_back(dp * mp);
  return plan;
}

ElasticStep elastic_step(const ElasticityConfig& e, const ElasticPlan& plan, int world_size) {
  const int mp = e.model_parallel_size;
  STRATA_INPUT_CHECK(world_size > 0 && world_size % mp == 0, "world size ", world_size,
                     " is not a positive multiple of elasticity.model_parallel_size=", mp);
  const int dp = world_size / mp;
  STRATA_INPUT_CHECK(std::find(plan.valid_dp_sizes.begin(), plan.valid_dp_sizes.end(), dp) !=
                         plan.valid_dp_sizes.end(),
                     "world size ", world_size,
                     " is not valid for the elasticity block: the batch of ", plan.train_batch_size,
                     " needs one of the GPU counts ", list_text(plan.valid_world_sizes));
  const int64_t per_rank = plan.train_batch_size / dp;
  ElasticStep step;
  for (int64_t m : e.micro_batch_sizes) {
    if (per_rank % m == 0) step.micro_batch = std::max(step.micro_batch, m);
  }
  STRATA_CHECK(step.micro_batch > 0, "no micro-batch of ", list_text(e.micro_batch_sizes),
               " divides the batch per rank ", per_rank);
  step.grad_accum = per_rank / step.micro_batch;
  return step;
}

void apply_elastic_batch(Config& c, int world_size) {
  const ElasticityConfig& e = c.elasticity;
  if (!e.enabled) return;
  const int mp = c.parallelism.tensor * c.parallelism.pipeline;
  STRATA_INPUT_CHECK(mp == e.model_parallel_size,
                     "elasticity.model_parallel_size=", e.model_parallel_size,
                     " but parallelism.tensor x pipeline = ", mp,
                     "; they must agree, or the elastic batch would not match the job's "
                     "data-parallel size");
  const bool given =
      c.given_train_batch_size > 0 || c.given_micro_batch > 0 || c.given_grad_accum > 0;
  STRATA_INPUT_CHECK(!given || e.ignore_non_elastic_batch_info,
                     "with elasticity.enabled the batch comes from the elasticity block, so "
                     "train_batch_size, train_micro_batch_size_per_gpu and "
                     "gradient_accumulation_steps would not be used: remove them or set "
                     "elasticity.ignore_non_elastic_batch_info to true");
  const ElasticPlan plan = compute_elastic(e, world_size);
  const ElasticStep step = elastic_step(e, plan, world_size);
  c.given_train_batch_size = plan.train_batch_size;
  c.given_micro_batch = step.micro_batch;
  c.given_grad_accum = step.grad_accum;
}

}  // namespace strata
