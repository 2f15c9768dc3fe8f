#include "strata/elastic/layout.h"

#include <algorithm>
#include <utility>

#include "strata/comm/topology.h"
#include "strata/config/elasticity.h"
#include "strata/core/check.h"

namespace strata {

namespace {

// (tensor, pipeline, context) to try: as configured, then the smaller divisors, most model
// parallelism first and, at equal products, the larger tensor size (its groups stay inside a
// host), then the larger context size (activations per rank fall with it).
struct ModelParallel {
  int tp = 1, pp = 1, cp = 1;
  int product() const { return tp * pp * cp; }
};
std::vector<ModelParallel> model_parallel_candidates(int tp, int pp, int cp) {
  std::vector<ModelParallel> c;
  for (int t = tp; t >= 1; --t) {
    for (int p = pp; p >= 1; --p) {
      for (int x = cp; x >= 1; --x) {
        if (tp % t != 0 || pp % p != 0 || cp % x != 0) continue;
        if (!(t == tp && p == pp && x == cp)) c.push_back({t, p, x});
      }
    }
  }
  std::stable_sort(c.begin(), c.end(), [](const ModelParallel& a, const ModelParallel& b) {
    if (a.product() != b.product()) return a.product() > b.product();
    return a.tp != b.tp ? a.tp > b.tp : a.cp > b.cp;
  });
  c.insert(c.begin(), {tp, pp, cp});
  return c;
}

// Ranks per host for `world` ranks in groups of `tp`, filling hosts in order; empty if they do
// not fit.
std::vector<int> place(const std::vector<ElasticHost>& hosts, int world, int tp) {
  std::vector<int> per_host;
  int left = world;
  for (const ElasticHost& h : hosts) {
    const int n = std::min(left, h.slots / tp * tp);
    per_host.push_back(n);
    left -= n;
  }
  if (left > 0) return {};
  return per_host;
}

// Train's checks for this layout; the resolved config, or InputError.
Config check(const ConfigLoader& load, const ElasticLayout& l,
             const std::vector<ElasticHost>& hosts) {
  Config cfg = load(l.overrides);
  const comm::RankGrid grid(l.world, cfg.parallelism.tensor, cfg.parallelism.pipeline,
                            cfg.parallelism.order, cfg.parallelism.context);
  std::vector<std::pair<std::string, int>> used;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (l.ranks_per_host[h] > 0) used.emplace_back(hosts[h].name, l.ranks_per_host[h]);
  }
  comm::check_tp_within_hosts(grid, used);
  apply_elastic_batch(cfg, l.world);
  resolve_batch(cfg, grid.dp());
  check_expert_grid(cfg, grid.dp() * grid.cp());
  const int64_t g = cfg.zero.mics_shard_size;
  const bool mics = cfg.zero.stage >= 1 && grid.dp() > 1 && g > 0 && g != grid.dp();
  STRATA_INPUT_CHECK(!mics || (g < grid.dp() && grid.dp() % g == 0),
                     "zero_optimization.mics_shard_size=", g,
                     " does not divide the data-parallel size ", grid.dp());
  return cfg;
}

}  // namespace

std::string ElasticLayout::describe() const {
  return strata::detail::concat(
      "dp ", dp, context > 1 ? strata::detail::concat(" x cp ", context) : "", " x tp ", tensor,
      " x pp ", pipeline, expert > 1 ? strata::detail::concat(" (ep ", expert, ")") : "", " = ",
      world, " ranks; batch ", batch, " = micro ", micro, " x accumulation ", accumulation,
      " x dp ", dp);
}

ElasticLayout choose_elastic_layout(const ConfigLoader& load, const std::vector<ElasticHost>& hosts,
                                    int min_ranks, int max_ranks, int64_t batch) {
  STRATA_INPUT_CHECK(min_ranks >= 1 && min_ranks <= max_ranks, "--min-ranks ", min_ranks,
                     " and --max-ranks ", max_ranks, ": need 1 <= min <= max");
  const Config base = load({});
  const int slots = [&] {
    int n = 0;
    for (const ElasticHost& h : hosts) n += h.slots;
    return n;
  }();
  const int64_t micro0 = base.given_micro_batch;
  const bool elastic_batch = base.elasticity.enabled;
  std::string last_error;
  const ParallelismConfig& bp = base.parallelism;
  for (const auto& [tp, pp, cp] : model_parallel_candidates(bp.tensor, bp.pipeline, bp.context)) {
    const bool same = tp == bp.tensor && pp == bp.pipeline && cp == bp.context;
    for (int world = std::min(max_ranks, slots); world >= min_ranks; --world) {
      if (world % (tp * pp * cp) != 0) continue;
      ElasticLayout l;
      l.world = world, l.tensor = tp, l.pipeline = pp, l.context = cp;
      l.dp = world / (tp * pp * cp);
      l.ranks_per_host = place(hosts, world, tp);
      if (l.ranks_per_host.empty()) continue;
      std::vector<std::string> parallel;
      if (!same) {
        parallel = {"parallelism.tensor=" + std::to_string(tp),
                    "parallelism.pipeline=" + std::to_string(pp)};
        if (cp != bp.context) parallel.push_back("parallelism.context=" + std::to_string(cp));
      }
      // The experts stay over the configured ranks where they divide the data × context ones
      // (whole experts: the tensor × data × context ones), else over the largest divisor of
      // them that does (each rank then holds more experts). Experts split over tp follow its
      // new size.
      ParallelismConfig np = bp;
      np.tensor = tp;
      const int expert_ranks = np.expert_ranks(l.dp * cp);
      l.expert = bp.expert;
      while (l.expert > 1 && (expert_ranks % l.expert != 0 || bp.expert % l.expert != 0)) {
        --l.expert;
      }
      if (l.expert != bp.expert) {
        parallel.push_back("parallelism.expert=" + std::to_string(l.expert));
      }
      if (bp.expert_tensor > 1 && tp != bp.tensor) {
        parallel.push_back("parallelism.expert_tensor=" + std::to_string(tp));
      }
      // The micro-batches to try: the config's own triangle (first start, or the elasticity
      // block deciding), else the largest micro-batch <= the configured one dividing the batch.
      std::vector<int64_t> micros;
      if (batch == 0 || elastic_batch) {
        micros = {0};
      } else {
        const int64_t top = micro0 > 0 ? micro0 : batch / l.dp;
        for (int64_t m = top; m >= 1; --m) {
          if (batch % (m * l.dp) == 0) micros.push_back(m);
        }
      }
      for (int64_t m : micros) {
        l.overrides = parallel;
        if (m > 0) {
          l.overrides.insert(l.overrides.end(),
                             {"train_batch_size=" + std::to_string(batch),
                              "train_micro_batch_size_per_gpu=" + std::to_string(m),
                              "gradient_accumulation_steps=" + std::to_string(batch / (m * l.dp))});
        }
        try {
          const Config cfg = check(load, l, hosts);
          l.batch = cfg.train_batch_size;
          l.micro = cfg.train_micro_batch_size_per_gpu;
          l.accumulation = cfg.gradient_accumulation_steps;
          return l;
        } catch (const InputError& e) {
          last_error = strata::detail::concat(world, " ranks (tp ", tp, ", pp ", pp,
                                              cp > 1 ? strata::detail::concat(", cp ", cp) : "",
                                              "): ", e.what());
        }
      }
    }
  }
  STRATA_INPUT_FAIL("no valid layout for ", min_ranks, "..", max_ranks, " ranks on ", slots,
                    " available worker(s)",
                    last_error.empty()
                        ? std::string(" (too few for tensor x pipeline x context groups)")
                        : "; the last tried, " + last_error);
}

}  // namespace strata
