// Heap allocation counting for tests that claim a step allocates nothing. alloc_hooks.cc replaces
// malloc, calloc, realloc, free, aligned_alloc, posix_memalign, memalign, valloc, pvalloc and
// every replaceable operator new and delete in the binary that links it (the executable's
// definitions interpose glibc's for the whole process, shared libraries included) and forwards
// them to glibc's (__libc_malloc and friends). While a window is open, each allocation on any
// thread is counted under the origin of its call stack, and the bytes it keeps live are tracked
// until it is freed.
//
// A sanitizer build (STRATA_SANITIZE) links no alloc_hooks.cc and defines STRATA_NO_ALLOC_HOOKS:
// ASan's runtime replaces the same functions, and only one definition can interpose glibc's. A
// test that counts allocations then compiles to GTEST_SKIP() << kNoAllocHooks.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/memory.h"

namespace strata::test {

inline constexpr const char* kNoAllocHooks =
    "allocation counting needs tests/alloc_hooks.cc, which a sanitizer build does not link (the "
    "sanitizer's runtime replaces malloc and operator new itself)";

// Where an allocation comes from: the module of the first frame of its call stack outside the
// allocation plumbing (libc, libstdc++, libgcc_s, the dynamic loader), so that libstdc++ code
// called by strata counts as strata's and libstdc++ code called by oneDNN as oneDNN's.
enum class AllocOrigin : int {
  Strata,  // the executable: strata's static libraries and the test itself
  OneDnn,  // libdnnl
  OpenMp,  // libgomp
  Mpi,     // libmpi, libopen-pal, libopen-rte, their plugins and the libraries only they use
  Other,   // any other module, or a stack that could not be attributed
};
inline constexpr int kNumAllocOrigins = 5;
const char* alloc_origin_name(AllocOrigin o);

struct AllocCounts {
  int64_t calls = 0;  // allocating calls; realloc counts once
  int64_t bytes = 0;  // bytes requested
};

struct AllocReport {
  // [origin][0: the thread that opened the window; 1: every other thread]
  std::array<std::array<AllocCounts, 2>, kNumAllocOrigins> counts{};
  // Per origin, the most bytes allocated inside the window and not yet freed at any moment of
  // it. Blocks that existed before the window are not subtracted when freed, so a step that
  // frees an old block and allocates a new one still shows the new one.
  std::array<int64_t, kNumAllocOrigins> peak_live{};
  std::array<int64_t, kNumAllocOrigins> live_at_end{};
  // The return addresses of the first few allocations per origin, innermost first.
  std::array<std::vector<std::vector<uintptr_t>>, kNumAllocOrigins> stacks;
  bool table_full = false;  // too many blocks to track: peaks are not reliable

  const AllocCounts& on_this_thread(AllocOrigin o) const { return counts[int(o)][0]; }
  const AllocCounts& on_other_threads(AllocOrigin o) const { return counts[int(o)][1]; }
  int64_t calls(AllocOrigin o) const { return counts[int(o)][0].calls + counts[int(o)][1].calls; }
  int64_t peak(AllocOrigin o) const { return peak_live[int(o)]; }
  // A line per origin with allocations ("strata: 3 calls (2 on this thread), 96 B, peak live
  // 64 B, live at end 0 B"), then the recorded stacks of the origins asked for, symbolised
  // (addr2line for the executable's frames).
  std::string describe(const std::vector<AllocOrigin>& with_stacks = {}) const;
};

// The verdict on a steady-state training step: nothing attributed to strata (its code on any
// thread: the compute thread, the communication thread, OpenMP's workers) nor to an unknown
// module; what oneDNN, libgomp and OpenMPI allocate internally is exempt within the limits that
// alloc_hooks.cc justifies. The failure message lists the origins and the offending stacks.
::testing::AssertionResult allocates_nothing_of_its_own(const AllocReport& r);

// The tracking allocator's current bytes per category, before a step.
inline std::array<size_t, kNumMemCategories> tracker_levels() {
  std::array<size_t, kNumMemCategories> level{};
  for (int c = 0; c < kNumMemCategories; ++c) {
    level[size_t(c)] = MemoryTracker::instance().current(MemCategory(c));
  }
  return level;
}

// After a steady-state step: no tracked category peaked above, or ended away from, its level
// before the step, by the tracker and by the step's own peak report.
inline void expect_tracker_back_at(const std::array<size_t, kNumMemCategories>& level,
                                   const std::array<size_t, kNumMemCategories>& step_peaks) {
  const MemoryTracker& tracker = MemoryTracker::instance();
  for (int c = 0; c < kNumMemCategories; ++c) {
    const char* name = mem_category_name(MemCategory(c));
    EXPECT_EQ(tracker.peak(MemCategory(c)), level[size_t(c)]) << name;
    EXPECT_EQ(step_peaks[size_t(c)], level[size_t(c)]) << name;
    EXPECT_EQ(tracker.current(MemCategory(c)), level[size_t(c)]) << name;
  }
}

// Opens a counting window; the calling thread is "this thread" of the report. One window at a
// time. Modules loaded later (dlopen) count as Other until the next window.
void start_counting();
// Closes the window and reports on it.
AllocReport stop_counting();

}  // namespace strata::test
