// After the first steps (primitive creation, workspace growth), strata's code allocates nothing
// in a training step: no heap allocation on any thread (tests/alloc_hooks.h counts the malloc
// family and operator new) and no tracked buffer peaking above its level before the step.
#include <dnnl.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/train/engine.h"
#include "tests/alloc_hooks.h"
#include "tests/tiny_moe.h"

namespace strata {
namespace {

using test::AllocOrigin;
using test::AllocReport;

// Makes p escape, so that the compiler cannot drop an allocation whose block is never used.
[[maybe_unused]] void* keep(void* p) {
  asm volatile("" : : "g"(p) : "memory");
  return p;
}

TEST(AllocHooks, CountEveryAllocationFunctionAndThePeak) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  void* before = keep(std::malloc(5000));
  test::start_counting();
  std::free(before);  // allocated before the window: does not lower the peak
  void* a = keep(std::malloc(1000));
  void* b = keep(std::calloc(10, 200));
  std::free(a);
  b = keep(std::realloc(b, 3000));
  void* c = keep(std::aligned_alloc(256, 512));
  void* d = nullptr;
  EXPECT_EQ(posix_memalign(&d, 64, 128), 0);
  keep(d);
  std::free(keep(memalign(64, 96)));
  std::free(keep(valloc(100)));
  auto* e = static_cast<char*>(keep(new char[40]));
  auto* f = static_cast<double*>(keep(new double));
  struct alignas(128) Wide {
    char x[256];
  };
  auto* g = static_cast<Wide*>(keep(new Wide));
  delete g;
  delete f;
  delete[] e;
  std::free(d);
  std::free(c);
  std::free(b);
  const AllocReport r = test::stop_counting();
  SCOPED_TRACE(r.describe({AllocOrigin::Strata}));
  EXPECT_EQ(r.on_this_thread(AllocOrigin::Strata).calls, 10);
  EXPECT_EQ(r.on_this_thread(AllocOrigin::Strata).bytes,
            1000 + 2000 + 3000 + 512 + 128 + 96 + 100 + 40 + int64_t(sizeof(double)) + 256);
  // b grown to 3000 (after a's 1000 was freed) next to c, d, e, f and g.
  EXPECT_EQ(r.peak(AllocOrigin::Strata), 3000 + 512 + 128 + 40 + int64_t(sizeof(double)) + 256);
  EXPECT_EQ(r.live_at_end[int(AllocOrigin::Strata)], 0);
  EXPECT_EQ(r.stacks[int(AllocOrigin::Strata)].size(), 4u);
  EXPECT_FALSE(r.table_full);
  EXPECT_FALSE(test::allocates_nothing_of_its_own(r));
#endif
}

TEST(AllocHooks, CountOtherThreadsApart) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  std::atomic<int> stage{0};
  std::thread worker([&] {
    while (stage.load() == 0) std::this_thread::yield();
    delete[] static_cast<char*>(keep(new char[64]));
    stage = 2;
  });
  test::start_counting();
  stage = 1;
  while (stage.load() != 2) std::this_thread::yield();
  const AllocReport r = test::stop_counting();
  worker.join();
  EXPECT_EQ(r.on_other_threads(AllocOrigin::Strata).calls, 1) << r.describe();
  EXPECT_EQ(r.on_other_threads(AllocOrigin::Strata).bytes, 64);
  EXPECT_EQ(r.on_this_thread(AllocOrigin::Strata).calls, 0);
  EXPECT_FALSE(test::allocates_nothing_of_its_own(r));
#endif
}

// What the step test exempts is exactly what oneDNN allocates itself. libstdc++ called from
// strata's code counts as strata's; dnnl_primitive_attr_create appends to a std::string through
// libstdc++, which lands in the executable's own copy of std::string::_M_mutate, and still counts
// as oneDNN's. A tracked Buffer is seen by both the hooks and the tracker.
TEST(AllocHooks, AttributeThroughLibstdcxxAndExemptOnlyOneDnn) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  MemoryTracker& tracker = MemoryTracker::instance();
  const size_t workspace = tracker.current(MemCategory::Workspace);
  tracker.reset_peaks();
  test::start_counting();
  std::string s;
  s.reserve(1000);  // std::string's out-of-line members live in libstdc++.so
  keep(s.data());
  dnnl_primitive_attr_t attr = nullptr;
  const dnnl_status_t st = dnnl_primitive_attr_create(&attr);
  dnnl_primitive_attr_destroy(attr);
  { Buffer buf(MemCategory::Workspace, 4096); }
  const AllocReport r = test::stop_counting();
  ASSERT_EQ(st, dnnl_success);
  SCOPED_TRACE(r.describe({AllocOrigin::Strata}));
  // oneDNN's own allocations are exempt, but the string's and the Buffer's are strata's.
  EXPECT_EQ(r.calls(AllocOrigin::Strata), 2);
  EXPECT_EQ(r.on_this_thread(AllocOrigin::Strata).bytes, 1001 + 4096);
  EXPECT_GE(r.calls(AllocOrigin::OneDnn), 1);
  EXPECT_EQ(tracker.peak(MemCategory::Workspace), workspace + 4096);
  EXPECT_EQ(tracker.current(MemCategory::Workspace), workspace);
#endif
}

TEST(StepAllocations, SteadyStateStepAllocatesNothing) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  // GPT-2, Llama, and a mixture of experts (a gated shared expert, a dense layer, balancing and
  // z-losses, a capacity).
  nlohmann::json moe = test::tiny_qwen2_moe(3, 1);
  moe["moe"]["capacity_factor"] = 1.25;
  for (const nlohmann::json& model :
       {nlohmann::json{{"preset", "gpt2-tiny"}}, nlohmann::json{{"preset", "llama-tiny"}}, moe}) {
    const std::string preset = model.value("preset", std::string("qwen2_moe"));
    for (const char* precision : {"fp32", "bf16", "fp16"}) {
      // Activation checkpointing: none, full recompute into host checkpoints, selective with
      // per-block profiling.
      for (const char* recompute : {"", "full", "selective"}) {
        SCOPED_TRACE(preset + " " + precision + " " + recompute);
        nlohmann::json j = {{"train_batch_size", 4},
                            {"train_micro_batch_size_per_gpu", 2},
                            {"steps_per_print", 0},
                            {"model", model}};
        if (std::string(precision) != "fp32") j[precision] = {{"enabled", true}};
        if (*recompute != 0) {
          j["activation_checkpointing"] = {{"recompute_granularity", recompute}, {"profile", true}};
          const bool full = std::string(recompute) == "full";
          if (full) j["activation_checkpointing"]["cpu_checkpointing"] = true;
        }
        Config cfg = parse_config(j);
        resolve_batch(cfg, 1);
        Engine engine(cfg, nullptr);
        std::vector<int32_t> tokens(size_t(4 * cfg.model.seq_len));
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 5 % 64);
        for (int i = 0; i < 2; ++i) engine.train_batch_on(tokens.data(), tokens.data());
        for (int step = 0; step < 3; ++step) {
          const std::array<size_t, kNumMemCategories> level = test::tracker_levels();
          test::start_counting();
          const StepMetrics m = engine.train_batch_on(tokens.data(), tokens.data());
          const AllocReport r = test::stop_counting();
          if (step == 0)
            std::printf("%s %s, allocations in a step:\n%s", preset.c_str(), precision,
                        r.describe().c_str());
          EXPECT_TRUE(test::allocates_nothing_of_its_own(r)) << "step " << step;
          test::expect_tracker_back_at(level, m.peak_bytes);
          EXPECT_EQ(m.recompute_s > 0.0, *recompute != 0);
        }
      }
    }
  }
#endif
}

}  // namespace
}  // namespace strata
