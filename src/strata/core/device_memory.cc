#include "strata/core/device_memory.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "strata/core/check.h"

namespace strata::device_memory {

namespace {

// The guarded device: one reserved region, carved first-fit into page-aligned blocks. Freed
// blocks are zeroed, so a reused block reads as zeros.
//
// Every kernel call opens and closes the region (two mprotect calls over all of it), so the cost
// of a call is the kernel's work to change each page's protection. The region is backed by
// transparent huge pages where the kernel offers them (MADV_HUGEPAGE) and its protection always
// changes in whole huge pages ([0, mapped)): one page-table entry per 2 MiB instead of 512. An
// equivalence test on the guarded device measured 11x slower than on the plain one with 4 KiB
// pages (tests/pp at 4 ranks); docs/tests.md has the figures with huge pages.
constexpr size_t kHugePage = size_t(2) << 20;

struct Guard {
  std::mutex mu;
  std::atomic<bool> on{false};
  bool allocated = false;  // a device allocation happened: the mode is fixed
  char* base = nullptr;
  size_t reserved = 0, top = 0, page = 4096;
  size_t mapped = 0;  // top rounded up to a huge page: the extent whose protection changes
  int open = 0;       // Access scopes alive, over every thread
  std::map<size_t, size_t> free_;  // offset → bytes of the free blocks below top
  struct sigaction previous {};

  Guard() {
    const char* env = std::getenv("STRATA_GUARDED_DEVICE");
    on.store(env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0);
  }
};

Guard& guard() {
  static Guard g;
  return g;
}

void protect(Guard& g, size_t from, size_t to, int prot) {
  if (to > from && ::mprotect(g.base + from, to - from, prot) != 0) {
    std::perror("strata: mprotect of the guarded device's memory");
    std::abort();
  }
}

// A fault inside the region is host code touching device memory: say so before dying. Any other
// fault belongs to whoever handled SIGSEGV before (the default action, ASan, a debugger).
void on_fault(int sig, siginfo_t* info, void* context) {
  Guard& g = guard();
  const char* addr = static_cast<const char*>(info->si_addr);
  if (g.base != nullptr && addr >= g.base && addr < g.base + g.reserved) {
    char msg[256];
    const int n = std::snprintf(
        msg, sizeof msg,
        "strata: host code touched guarded device memory at %p (offset %zu of the device "
        "region) outside the kernel interface; reach device memory through kernels/ops.h "
        "(copy, copy_to_host, copy_from_host, fill_zero)\n",
        info->si_addr, size_t(addr - g.base));
    if (n > 0) (void)!::write(STDERR_FILENO, msg, size_t(n));
    void* frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
    ::signal(SIGABRT, SIG_DFL);
    std::abort();
  }
  if (g.previous.sa_flags & SA_SIGINFO) {
    if (g.previous.sa_sigaction != nullptr) return g.previous.sa_sigaction(sig, info, context);
  } else if (g.previous.sa_handler != SIG_DFL && g.previous.sa_handler != SIG_IGN) {
    return g.previous.sa_handler(sig);
  }
  ::signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now takes the default
}

void reserve(Guard& g) {
  g.page = size_t(::sysconf(_SC_PAGESIZE));
  // As much address space as the machine has memory: any model that fits in memory fits here.
  g.reserved = size_t(::sysconf(_SC_PHYS_PAGES)) * g.page / kHugePage * kHugePage;
  // One huge page more than that, to start the region on a huge page's boundary.
  void* p = ::mmap(nullptr, g.reserved + kHugePage, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  STRATA_CHECK(p != MAP_FAILED, "cannot reserve ", g.reserved,
               " bytes of address space for the guarded device: ", std::strerror(errno));
  const uintptr_t at = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  g.base = reinterpret_cast<char*>(at);
  // Where the kernel has no transparent huge pages this fails, and 4 KiB pages serve.
  (void)::madvise(g.base, g.reserved, MADV_HUGEPAGE);
  struct sigaction sa {};
  sa.sa_sigaction = &on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGSEGV, &sa, &g.previous);
}

}  // namespace

bool guarded() {
  return guard().on.load(std::memory_order_relaxed);
}

void set_guarded(bool on) {
  Guard& g = guard();
  std::lock_guard<std::mutex> lock(g.mu);
  STRATA_CHECK(!g.allocated || g.on.load() == on,
               "the device was chosen at its first allocation; select the guarded device before "
               "any device memory is allocated");
  g.on.store(on);
}

void* allocate(size_t bytes) {
  Guard& g = guard();
  if (!g.on.load(std::memory_order_relaxed)) {
    {
      std::lock_guard<std::mutex> lock(g.mu);
      g.allocated = true;
    }
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded >= bytes ? std::aligned_alloc(64, rounded) : nullptr;  // no wrap-around
    if (p != nullptr) std::memset(p, 0, rounded);
    return p;
  }
  std::lock_guard<std::mutex> lock(g.mu);
  g.allocated = true;
  if (g.base == nullptr) reserve(g);
  const size_t need = (bytes + g.page - 1) / g.page * g.page;
  if (need < bytes) return nullptr;
  for (auto it = g.free_.begin(); it != g.free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t at = it->first, left = it->second - need;
    g.free_.erase(it);
    if (left > 0) g.free_[at + need] = left;
    return g.base + at;  // released pages read as zeros; their protection is the region's
  }
  if (need > g.reserved - g.top) return nullptr;
  const size_t at = g.top;
  g.top += need;
  const size_t was = g.mapped;
  g.mapped = std::min(g.reserved, (g.top + kHugePage - 1) / kHugePage * kHugePage);
  if (g.open > 0) protect(g, was, g.mapped, PROT_READ | PROT_WRITE);
  return g.base + at;
}

void release(void* p, size_t bytes) {
  if (p == nullptr) return;
  Guard& g = guard();
  if (!contains(p)) return std::free(p);
  std::lock_guard<std::mutex> lock(g.mu);
  const size_t need = (bytes + g.page - 1) / g.page * g.page;
  size_t at = size_t(static_cast<char*>(p) - g.base), n = need;
  // Zeroed here rather than given back (MADV_DONTNEED), which would split its huge page.
  if (g.open == 0) protect(g, 0, g.mapped, PROT_READ | PROT_WRITE);
  std::memset(p, 0, need);
  if (g.open == 0) protect(g, 0, g.mapped, PROT_NONE);
  // Coalesce with the free neighbours on either side.
  auto next = g.free_.lower_bound(at);
  if (next != g.free_.end() && next->first == at + n) n += next->second, next = g.free_.erase(next);
  if (next != g.free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) at = prev->first, n += prev->second, g.free_.erase(prev);
  }
  g.free_[at] = n;
}

bool contains(const void* p) {
  const Guard& g = guard();
  const char* c = static_cast<const char*>(p);
  return g.base != nullptr && c >= g.base && c < g.base + g.reserved;
}

Access::Access(bool open) : open_(open && guarded()) {
  if (!open_) return;
  Guard& g = guard();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.open++ == 0) protect(g, 0, g.mapped, PROT_READ | PROT_WRITE);
}

Access::~Access() {
  if (!open_) return;
  Guard& g = guard();
  std::lock_guard<std::mutex> lock(g.mu);
  if (--g.open == 0) protect(g, 0, g.mapped, PROT_NONE);
}

namespace {
Allocator g_cuda_allocator;
Allocator g_host_allocator;
std::atomic<bool> g_host_pinned{false};
}  // namespace

void set_device_allocator(Device device, Allocator a) {
  STRATA_CHECK(device == Device::CUDA, "set_device_allocator: the CPU device's memory is core's");
  g_cuda_allocator = a;
}

const Allocator& device_allocator(Device device) {
  STRATA_CHECK(device == Device::CUDA && g_cuda_allocator.allocate != nullptr,
               "device memory on CUDA needs the CUDA backend and a selected GPU (ops::init_device)",
               " before the first allocation");
  return g_cuda_allocator;
}

void set_host_allocator(Allocator a) {
  g_host_allocator = a;
  g_host_pinned.store(a.allocate != nullptr);
}

const Allocator* host_allocator() {
  return g_host_pinned.load() ? &g_host_allocator : nullptr;
}

}  // namespace strata::device_memory
