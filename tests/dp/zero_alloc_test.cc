// ZeRO under mpirun at dp = 2: after warm-up steps, a step allocates nothing in strata's code on
// any thread (the compute thread, the communication thread that runs the collectives, OpenMP's
// workers), and no tracked buffer peaks above its level before the step. Counted with
// tests/alloc_hooks.h, which says what oneDNN, libgomp and OpenMPI may allocate themselves.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/train/engine.h"
#include "strata/zero/zero_sync.h"
#include "tests/alloc_hooks.h"

namespace strata {
namespace {

using test::AllocOrigin;
using test::AllocReport;

TEST(ZeroAllocations, SteadyStateStepAllocatesNothing) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  comm::Communicator world(MPI_COMM_WORLD, "dp");
  const std::vector<nlohmann::json> layouts = {
      {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 3000}},
      {{"stage", 3}, {"overlap_comm", true}},
      // Every unit gathered, with prefetch.
      {{"stage", 3},
       {"overlap_comm", true},
       {"stage3_param_persistence_threshold", 0},
       {"stage3_prefetch_bucket_size", 40000}},
  };
  for (const nlohmann::json& zero : layouts) {
    SCOPED_TRACE(zero.dump());
    nlohmann::json j = {{"train_batch_size", 8},
                        {"train_micro_batch_size_per_gpu", 2},
                        {"steps_per_print", 0},
                        {"model", {{"preset", "gpt2-tiny"}}}};
    j["zero_optimization"] = zero;
    Config cfg = parse_config(j);
    resolve_batch(cfg, world.size());
    Engine engine(cfg, nullptr, &world);
    ASSERT_NE(engine.zero(), nullptr);
    const int64_t local = cfg.train_batch_size / world.size();
    std::vector<int32_t> tokens(size_t(local * cfg.model.seq_len));
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = int32_t((i * 5 + size_t(world.rank())) % 64);
    }
    for (int i = 0; i < 3; ++i) engine.train_batch_on(tokens.data(), tokens.data());
    for (int step = 0; step < 3; ++step) {
      const std::array<size_t, kNumMemCategories> level = test::tracker_levels();
      test::start_counting();
      const StepMetrics m = engine.train_batch_on(tokens.data(), tokens.data());
      const AllocReport r = test::stop_counting();
      if (step == 0 && world.rank() == 0) {
        std::printf("%s, allocations in a step on rank 0:\n%s", zero.dump().c_str(),
                    r.describe().c_str());
      }
      EXPECT_FALSE(engine.zero()->in_flight());
      EXPECT_TRUE(test::allocates_nothing_of_its_own(r))
          << "rank " << world.rank() << " step " << step;
      test::expect_tracker_back_at(level, m.peak_bytes);
    }
  }
#endif
}

// A pipeline step (2 stages, 1F1B and zero-bubble, ZeRO-1 and 3 inside each stage's dp group of
// one) allocates nothing either: the transfers use the buffers and send ring made at
// construction, stage 3's gathers the buffers and the gather order made there.
TEST(ZeroAllocations, PipelineStepAllocatesNothing) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  const comm::RankGrid grid(2, 1, 2);
  comm::ProcessGroups groups(grid, MPI_COMM_WORLD);
  for (const auto& [schedule, zero] : {std::pair{"1f1b", 1}, std::pair{"zero_bubble", 1},
                                       std::pair{"1f1b", 3}, std::pair{"zero_bubble", 3}}) {
    SCOPED_TRACE(std::string(schedule) + " zero " + std::to_string(zero));
    nlohmann::json j = {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 2},
        {"steps_per_print", 0},
        {"model", {{"preset", "gpt2-tiny"}}},
        {"parallelism", {{"pipeline", 2}, {"schedule", schedule}}},
        {"zero_optimization",
         {{"stage", zero}, {"overlap_comm", true}, {"stage3_param_persistence_threshold", 0}}}};
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine engine(cfg, nullptr, &groups.dp(), &groups.tp(), &groups.pp());
    std::vector<int32_t> tokens(size_t(cfg.train_batch_size * cfg.model.seq_len));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 5) % 64);
    for (int i = 0; i < 3; ++i) engine.train_batch_on(tokens.data(), tokens.data());
    for (int step = 0; step < 3; ++step) {
      const std::array<size_t, kNumMemCategories> level = test::tracker_levels();
      test::start_counting();
      const StepMetrics m = engine.train_batch_on(tokens.data(), tokens.data());
      const AllocReport r = test::stop_counting();
      EXPECT_TRUE(test::allocates_nothing_of_its_own(r))
          << "stage " << engine.stage() << " step " << step << "\n"
          << r.describe();
      test::expect_tracker_back_at(level, m.peak_bytes);
    }
  }
#endif
}

}  // namespace
}  // namespace strata
