// strata elastic: the DeepSpeed elasticity plan of a config: the global batch size, the GPU counts
// it stays valid on and, for one count, the micro-batch and gradient accumulation.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/config/elasticity.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct ElasticArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world = 0;  // 0: not given
};

void run_elastic(const ElasticArgs& a) {
  const Config cfg = load_config(a.config, a.overrides);
  const ElasticityConfig& e = cfg.elasticity;
  const ElasticPlan plan = compute_elastic(e, a.world);
  std::printf("elasticity version %.1f\n", e.version);
  std::printf("train_batch_size %lld\n", static_cast<long long>(plan.train_batch_size));
  std::printf("valid world sizes (%zu):", plan.valid_world_sizes.size());
  for (int n : plan.valid_world_sizes) std::printf(" %d", n);
  std::printf("\n");
  if (a.world > 0) {
    const ElasticStep s = elastic_step(e, plan, a.world);
    const int dp = a.world / e.model_parallel_size;
    std::printf(
        "world size %d: dp %d x model parallel %d; micro batch %lld x accumulation %lld x "
        "dp %d = %lld\n",
        a.world, dp, e.model_parallel_size, static_cast<long long>(s.micro_batch),
        static_cast<long long>(s.grad_accum), dp, static_cast<long long>(plan.train_batch_size));
  }
}

}  // namespace

void add_elastic_command(CLI::App& app) {
  auto args = std::make_shared<ElasticArgs>();
  CLI::App* cmd = app.add_subcommand(
      "elastic", "Print the elasticity block's batch size and the GPU counts it is valid on");
  cmd->add_option("--config,-c", args->config, "config file")->required();
  cmd->add_option("--set", args->overrides, "override a key: --set a.b.c=value (repeatable)");
  cmd->add_option("-n,--world-size", args->world,
                  "number of GPUs: print its micro-batch and accumulation")
      ->check(CLI::PositiveNumber);
  cmd->callback([args] { run_elastic(*args); });
}

}  // namespace strata::cli
