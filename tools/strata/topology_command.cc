// strata topology: the rank grid a config gives on N processes, and its process groups.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct TopologyArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world = 1;
  std::string hostfile;
};

void run_topology(const TopologyArgs& a) {
  Config cfg = load_config(a.config, a.overrides);
  const ParallelismConfig& p = cfg.parallelism;
  comm::RankGrid grid(a.world, p.tensor, p.pipeline, p.order, p.context);
  resolve_batch(cfg, grid.dp());  // the checks train makes once dp is known
  if (!a.hostfile.empty()) comm::check_tp_within_hosts(grid, comm::parse_hostfile(a.hostfile));
  std::printf("%s", grid.describe().c_str());
}

}  // namespace

void add_topology_command(CLI::App& app) {
  auto args = std::make_shared<TopologyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "topology", "Print the rank grid (dp x tp x pp) and process groups for a config");
  cmd->add_option("--config,-c", args->config, "config file")->required();
  cmd->add_option("--set", args->overrides, "override a key: --set a.b.c=value (repeatable)");
  cmd->add_option("-n,--world-size", args->world, "number of processes")->required();
  cmd->add_option("--hostfile", args->hostfile,
                  "check that tensor-parallel groups stay inside one host");
  cmd->callback([args] { run_topology(*args); });
}

}  // namespace strata::cli
