// After the first steps (primitive creation, workspace growth), strata's code allocates nothing
// in a training step: no C++ heap allocation and no tracked buffer. This binary counts operator
// new. oneDNN 2.6 itself builds a small argument map inside every primitive execution
// (dnnl_primitive_execute); allocations made from inside libdnnl are therefore not counted.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "strata/core/memory.h"
#include "strata/train/config.h"
#include "strata/train/engine.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

// GCC cannot see that these operators pair malloc with free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) {
    Dl_info caller;
    if (dladdr(__builtin_return_address(0), &caller) == 0 || caller.dli_fname == nullptr ||
        std::strstr(caller.dli_fname, "libdnnl") == nullptr) {
      g_allocations.fetch_add(1);
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace strata {
namespace {

TEST(StepAllocations, SteadyStateStepAllocatesNothing) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (bool bf16 : {false, true}) {
      nlohmann::json j = {{"train_batch_size", 4},
                          {"train_micro_batch_size_per_gpu", 2},
                          {"steps_per_print", 0},
                          {"model", {{"preset", preset}}}};
      if (bf16) j["bf16"] = {{"enabled", true}};
      Config cfg = parse_config(j);
      resolve_batch(cfg, 1);
      Engine engine(cfg, nullptr);
      std::vector<int32_t> tokens(size_t(4 * cfg.model.seq_len));
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 5 % 64);
      for (int i = 0; i < 2; ++i) engine.train_batch_on(tokens.data(), tokens.data());
      const size_t tracked = MemoryTracker::instance().current_total();
      g_allocations = 0;
      g_counting = true;
      for (int i = 0; i < 3; ++i) engine.train_batch_on(tokens.data(), tokens.data());
      g_counting = false;
      EXPECT_EQ(g_allocations.load(), 0) << preset << (bf16 ? " bf16" : " fp32");
      EXPECT_EQ(MemoryTracker::instance().current_total(), tracked) << preset;
    }
  }
}

}  // namespace
}  // namespace strata
