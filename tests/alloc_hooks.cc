// Replacements for glibc's allocation functions and C++'s operator new and delete (see
// alloc_hooks.h). Each forwards to glibc's implementation; while a window is open it also walks
// the call stack (backtrace, DWARF unwinding: safe without frame pointers), attributes the block
// to an origin and remembers it in a fixed table so that its free is subtracted from the same
// origin's live bytes (a table rather than malloc_usable_size on free: a free must find the
// origin of its block, and blocks from before the window must not lower the peak). Bookkeeping
// that itself allocates (backtrace's first call loads libgcc_s) passes through uncounted: a
// thread-local flag marks the hook as busy.
#include "tests/alloc_hooks.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

extern "C" {
void* __libc_malloc(size_t n);
void* __libc_calloc(size_t n, size_t size);
void* __libc_realloc(void* p, size_t n);
void* __libc_memalign(size_t align, size_t n);
void* __libc_valloc(size_t n);
void* __libc_pvalloc(size_t n);
void __libc_free(void* p);
}

namespace strata::test {
namespace {

constexpr int kMaxFrames = 48;
constexpr int kStacksKept = 4;  // per origin

// The kinds of code a return address can lie in: the origins, then the plumbing to look through.
enum class Module : uint8_t { Strata, OneDnn, OpenMp, Mpi, Other, Plumbing };

Module module_kind(const char* path) {
  if (path == nullptr || path[0] == '\0') return Module::Strata;  // the executable
  const char* slash = std::strrchr(path, '/');
  const char* name = slash ? slash + 1 : path;
  auto starts = [name](const char* prefix) {
    return std::strncmp(name, prefix, std::strlen(prefix)) == 0;
  };
  if (starts("libdnnl")) return Module::OneDnn;
  if (starts("libgomp")) return Module::OpenMp;
  for (const char* p :
       {"libmpi", "libopen-", "libompi", "mca_", "libmca_", "libpmix", "libevent", "libhwloc",
        "libucp", "libucs", "libuct", "libucm", "libfabric", "libibverbs", "librdmacm", "libpsm"}) {
    if (starts(p)) return Module::Mpi;
  }
  for (const char* p : {"libc.so", "libstdc++", "libgcc_s", "ld-linux", "libm.so", "libpthread",
                        "libdl", "librt"}) {
    if (starts(p)) return Module::Plumbing;
  }
  return Module::Other;
}

// Executable segments of the loaded modules, read when a window opens.
struct Range {
  uintptr_t begin, end;
  Module kind;
};
constexpr int kMaxRanges = 1024;
Range g_ranges[kMaxRanges];
int g_num_ranges = 0;
uintptr_t g_exe_base = 0;

int add_module(dl_phdr_info* info, size_t, void*) {
  const bool exe = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
  if (exe && g_exe_base == 0) g_exe_base = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum && g_num_ranges < kMaxRanges; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    g_ranges[g_num_ranges++] = {begin, begin + ph.p_memsz, module_kind(info->dlpi_name)};
  }
  return 0;
}

Module kind_at(uintptr_t address) {
  for (int i = 0; i < g_num_ranges; ++i) {
    if (address >= g_ranges[i].begin && address < g_ranges[i].end) return g_ranges[i].kind;
  }
  return Module::Other;  // not in any module known when the window opened
}

// A frame in the executable is not necessarily strata's: the libstdc++ template instances the
// executable emits and exports (std::string::_M_mutate) interpose libstdc++'s own, so oneDNN
// calling libstdc++ can land back in the executable. Those are the only functions of the
// executable that dladdr names (strata's own are not exported).
bool std_library_symbol(uintptr_t address) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(address), &info) == 0 || info.dli_sname == nullptr) {
    return false;
  }
  for (const char* p : {"_ZSt", "_ZNSt", "_ZNKSt", "_ZN9__gnu_cxx", "_ZNK9__gnu_cxx"}) {
    if (std::strncmp(info.dli_sname, p, std::strlen(p)) == 0) return true;
  }
  return false;
}

std::atomic<bool> g_counting{false};
thread_local bool t_busy = false;   // in the bookkeeping: allocations pass through uncounted
thread_local bool t_owner = false;  // the thread that opened the window

std::atomic<int64_t> g_calls[kNumAllocOrigins][2];
std::atomic<int64_t> g_bytes[kNumAllocOrigins][2];
std::atomic<int64_t> g_live[kNumAllocOrigins];
std::atomic<int64_t> g_peak[kNumAllocOrigins];

struct Stack {
  std::atomic<bool> ready{false};
  int n = 0;
  uintptr_t frames[kMaxFrames];
};
Stack g_stacks[kNumAllocOrigins][kStacksKept];
std::atomic<int> g_stacks_taken[kNumAllocOrigins];

// Blocks allocated inside the window: open addressing keyed by address; a freed entry becomes a
// tombstone that a later insertion may reuse. An address is removed before glibc frees it, so it
// is never in the table twice.
constexpr int kTableBits = 16;
constexpr size_t kSlots = size_t(1) << kTableBits;
constexpr uintptr_t kEmpty = 0, kTombstone = 1;
struct Slot {
  std::atomic<uintptr_t> key{kEmpty};
  int64_t bytes = 0;
  int origin = 0;
};
Slot g_table[kSlots];
std::atomic<bool> g_table_full{false};

size_t slot_of(uintptr_t key) {
  return size_t(((key >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - kTableBits));
}

void remember(uintptr_t key, int64_t bytes, int origin) {
  for (size_t i = 0, s = slot_of(key); i < kSlots; ++i, s = (s + 1) % kSlots) {
    uintptr_t k = g_table[s].key.load(std::memory_order_acquire);
    if ((k == kEmpty || k == kTombstone) && g_table[s].key.compare_exchange_strong(k, key)) {
      g_table[s].bytes = bytes;
      g_table[s].origin = origin;
      return;
    }
  }
  g_table_full = true;
}

void forget(uintptr_t key) {
  for (size_t i = 0, s = slot_of(key); i < kSlots; ++i, s = (s + 1) % kSlots) {
    const uintptr_t k = g_table[s].key.load(std::memory_order_acquire);
    if (k == kEmpty) return;  // allocated before the window
    if (k == key) {
      g_live[g_table[s].origin].fetch_sub(g_table[s].bytes);
      g_table[s].key.store(kTombstone, std::memory_order_release);
      return;
    }
  }
}

void raise_max(std::atomic<int64_t>& peak, int64_t value) {
  int64_t prev = peak.load();
  while (prev < value && !peak.compare_exchange_weak(prev, value)) {
  }
}

// caller: the return address into the code that called the replaced function.
[[gnu::noinline]] void record(void* p, size_t bytes, void* caller) {
  t_busy = true;
  void* raw[kMaxFrames];
  const int n = backtrace(raw, kMaxFrames);
  // Frames from the caller outwards; the ones before it are this file's.
  uintptr_t frames[kMaxFrames];
  int m = 0;
  frames[m++] = uintptr_t(caller);
  for (int i = 0; i < n; ++i) {
    if (raw[i] != caller) continue;
    for (int j = i + 1; j < n && m < kMaxFrames; ++j) frames[m++] = uintptr_t(raw[j]);
    break;
  }
  int origin = int(AllocOrigin::Other);
  for (int i = 0; i < m; ++i) {
    const Module k = kind_at(frames[i]);
    if (k == Module::Plumbing || (k == Module::Strata && std_library_symbol(frames[i]))) continue;
    origin = int(k);
    break;
  }
  const int thread = t_owner ? 0 : 1;
  g_calls[origin][thread].fetch_add(1);
  g_bytes[origin][thread].fetch_add(int64_t(bytes));
  remember(uintptr_t(p), int64_t(bytes), origin);
  raise_max(g_peak[origin], g_live[origin].fetch_add(int64_t(bytes)) + int64_t(bytes));
  const int taken = g_stacks_taken[origin].fetch_add(1);
  if (taken < kStacksKept) {
    Stack& s = g_stacks[origin][taken];
    s.n = m;
    std::copy(frames, frames + m, s.frames);
    s.ready.store(true, std::memory_order_release);
  }
  t_busy = false;
}

bool counting() {
  return g_counting.load(std::memory_order_acquire) && !t_busy;
}

void* counted(void* p, size_t bytes, void* caller) {
  if (p != nullptr && counting()) record(p, bytes, caller);
  return p;
}

void release(void* p) {
  if (p != nullptr && counting()) forget(uintptr_t(p));
  __libc_free(p);
}

bool valid_alignment(size_t align) {
  return align != 0 && (align & (align - 1)) == 0;
}

void* new_block(size_t n, size_t align, void* caller) {
  if (n == 0) n = 1;
  void* p = align <= alignof(std::max_align_t) ? __libc_malloc(n) : __libc_memalign(align, n);
  return counted(p, n, caller);
}

void* new_or_throw(size_t n, size_t align, void* caller) {
  if (void* p = new_block(n, align, caller)) return p;
  throw std::bad_alloc();
}

std::string format_bytes(int64_t b) {
  char buf[32];
  if (b < 10 * 1024) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  }
  return buf;
}

// One line per frame: "module+0xoffset symbol", and for the executable's frames addr2line's
// "function at file:line".
std::vector<std::string> symbolise(const std::vector<uintptr_t>& frames) {
  std::vector<std::string> lines;
  std::string exe_addresses;
  std::vector<size_t> exe_lines;
  for (uintptr_t a : frames) {
    Dl_info info{};
    char buf[512];
    if (dladdr(reinterpret_cast<void*>(a), &info) == 0 || info.dli_fname == nullptr) {
      std::snprintf(buf, sizeof buf, "  0x%lx", static_cast<unsigned long>(a));
      lines.emplace_back(buf);
      continue;
    }
    const uintptr_t offset = a - uintptr_t(info.dli_fbase);
    const char* slash = std::strrchr(info.dli_fname, '/');
    std::snprintf(buf, sizeof buf, "  %s+0x%lx %s", slash ? slash + 1 : info.dli_fname,
                  static_cast<unsigned long>(offset), info.dli_sname ? info.dli_sname : "");
    lines.emplace_back(buf);
    if (uintptr_t(info.dli_fbase) == g_exe_base) {
      std::snprintf(buf, sizeof buf, " 0x%lx", static_cast<unsigned long>(offset - 1));
      exe_addresses += buf;
      exe_lines.push_back(lines.size() - 1);
    }
  }
  if (exe_addresses.empty()) return lines;
  const std::string command = "addr2line -Cfp -e /proc/" + std::to_string(getpid()) + "/exe" +
                              exe_addresses + " 2>/dev/null";
  if (FILE* f = popen(command.c_str(), "r")) {
    char buf[1024];
    for (size_t i = 0; i < exe_lines.size() && std::fgets(buf, sizeof buf, f) != nullptr; ++i) {
      buf[std::strcspn(buf, "\n")] = '\0';
      lines[exe_lines[i]] += buf;
    }
    pclose(f);
  }
  return lines;
}

}  // namespace

const char* alloc_origin_name(AllocOrigin o) {
  static constexpr const char* kNames[kNumAllocOrigins] = {"strata", "onednn", "openmp", "mpi",
                                                           "other"};
  return kNames[int(o)];
}

void start_counting() {
  void* prime[2];
  backtrace(prime, 2);  // loads libgcc_s now, not inside a window
  g_num_ranges = 0;
  dl_iterate_phdr(add_module, nullptr);
  for (int o = 0; o < kNumAllocOrigins; ++o) {
    for (int t = 0; t < 2; ++t) g_calls[o][t] = 0, g_bytes[o][t] = 0;
    g_live[o] = 0;
    g_peak[o] = 0;
    g_stacks_taken[o] = 0;
    for (Stack& s : g_stacks[o]) s.ready = false;
  }
  for (Slot& s : g_table) s.key.store(kEmpty, std::memory_order_relaxed);
  g_table_full = false;
  t_owner = true;
  g_counting.store(true, std::memory_order_release);
}

AllocReport stop_counting() {
  g_counting.store(false, std::memory_order_release);
  t_owner = false;
  AllocReport r;
  for (int o = 0; o < kNumAllocOrigins; ++o) {
    for (int t = 0; t < 2; ++t) r.counts[o][t] = {g_calls[o][t].load(), g_bytes[o][t].load()};
    r.peak_live[o] = g_peak[o].load();
    r.live_at_end[o] = g_live[o].load();
    for (const Stack& s : g_stacks[o]) {
      if (s.ready.load(std::memory_order_acquire)) {
        r.stacks[o].emplace_back(s.frames, s.frames + s.n);
      }
    }
  }
  r.table_full = g_table_full.load();
  return r;
}

std::string AllocReport::describe(const std::vector<AllocOrigin>& with_stacks) const {
  std::string out;
  for (int o = 0; o < kNumAllocOrigins; ++o) {
    const int64_t n = counts[o][0].calls + counts[o][1].calls;
    if (n == 0) continue;
    out += std::string(alloc_origin_name(AllocOrigin(o))) + ": " + std::to_string(n) + " calls (" +
           std::to_string(counts[o][0].calls) + " on this thread), " +
           format_bytes(counts[o][0].bytes + counts[o][1].bytes) + ", peak live " +
           format_bytes(peak_live[o]) + ", live at end " + format_bytes(live_at_end[o]) + "\n";
  }
  if (table_full) out += "(too many blocks to track: peaks are not reliable)\n";
  for (AllocOrigin o : with_stacks) {
    for (const std::vector<uintptr_t>& s : stacks[int(o)]) {
      out += std::string("allocation from ") + alloc_origin_name(o) + ":\n";
      for (const std::string& line : symbolise(s)) out += line + "\n";
    }
  }
  return out;
}

// What a steady-state step may allocate, measured on gpt2-tiny and llama-tiny (micro-batch 2),
// single-process and under ZeRO stages 2-3 at dp = 2 after warm-up steps:
// - oneDNN 2.6 allocates inside every execution: dnnl_primitive_execute builds an argument map on
//   the calling thread, and its JIT GEMM driver mallocs each thread's packing workspace inside
//   its parallel region on every call (gpt2-tiny fp32: 600 calls, 13.6 MiB requested, under
//   150 KiB live at once, per step). oneDNN's working memory, not strata's buffers; it must all
//   be freed again within the step.
// - libgomp caches a parallel region's team descriptor only for teams of several threads; a
//   region that runs on one thread (an if clause that is false, OMP_NUM_THREADS=1) mallocs and
//   frees one (about 1.5 KiB) in GOMP_parallel.
//   Bookkeeping, not data: freed within the step, and never more than kOpenMpPeak live.
// - OpenMPI 4.1's coll/base algorithms malloc a temporary buffer on every call
//   (reduce_scatter_block's recursive halving and butterfly, allreduce's recursive doubling and
//   ring: 18 to 34 calls, under 0.5 MiB per gpt2-tiny ZeRO step at dp = 2), and pml/ob1's free
//   lists still grow now and then on a larger message, a block MPI keeps cached. Warm-up does not
//   make MPI allocation-free, so its frames are exempt outright.
constexpr int64_t kOpenMpPeak = 64 << 10;

::testing::AssertionResult allocates_nothing_of_its_own(const AllocReport& r) {
  std::vector<AllocOrigin> wrong;
  for (AllocOrigin o : {AllocOrigin::Strata, AllocOrigin::Other}) {
    if (r.calls(o) != 0) wrong.push_back(o);
  }
  if (r.live_at_end[int(AllocOrigin::OneDnn)] != 0) wrong.push_back(AllocOrigin::OneDnn);
  if (r.live_at_end[int(AllocOrigin::OpenMp)] != 0 || r.peak(AllocOrigin::OpenMp) > kOpenMpPeak) {
    wrong.push_back(AllocOrigin::OpenMp);
  }
  if (wrong.empty() && !r.table_full) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "the step allocated on strata's account, or a library kept what it allocated:\n"
         << r.describe(wrong);
}

}  // namespace strata::test

using strata::test::counted;
using strata::test::new_block;
using strata::test::new_or_throw;
using strata::test::release;
using strata::test::valid_alignment;

extern "C" {

void* malloc(size_t n) noexcept {
  return counted(__libc_malloc(n), n, __builtin_return_address(0));
}

void* calloc(size_t n, size_t size) noexcept {
  return counted(__libc_calloc(n, size), n * size, __builtin_return_address(0));
}

void* realloc(void* p, size_t n) noexcept {
  // The old block leaves the books before glibc may hand its address to another thread.
  if (p != nullptr && strata::test::counting()) strata::test::forget(uintptr_t(p));
  return counted(__libc_realloc(p, n), n, __builtin_return_address(0));
}

void free(void* p) noexcept {
  release(p);
}

void* memalign(size_t align, size_t n) noexcept {
  return counted(__libc_memalign(align, n), n, __builtin_return_address(0));
}

void* aligned_alloc(size_t align, size_t n) noexcept {
  if (!valid_alignment(align)) {
    errno = EINVAL;
    return nullptr;
  }
  return counted(__libc_memalign(align, n), n, __builtin_return_address(0));
}

int posix_memalign(void** out, size_t align, size_t n) noexcept {
  if (!valid_alignment(align) || align % sizeof(void*) != 0) return EINVAL;
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return ENOMEM;
  *out = counted(p, n, __builtin_return_address(0));
  return 0;
}

void* valloc(size_t n) noexcept {
  return counted(__libc_valloc(n), n, __builtin_return_address(0));
}

void* pvalloc(size_t n) noexcept {
  return counted(__libc_pvalloc(n), n, __builtin_return_address(0));
}

}  // extern "C"

void* operator new(size_t n) {
  return new_or_throw(n, 0, __builtin_return_address(0));
}
void* operator new[](size_t n) {
  return new_or_throw(n, 0, __builtin_return_address(0));
}
void* operator new(size_t n, std::align_val_t a) {
  return new_or_throw(n, size_t(a), __builtin_return_address(0));
}
void* operator new[](size_t n, std::align_val_t a) {
  return new_or_throw(n, size_t(a), __builtin_return_address(0));
}
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return new_block(n, 0, __builtin_return_address(0));
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return new_block(n, 0, __builtin_return_address(0));
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return new_block(n, size_t(a), __builtin_return_address(0));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return new_block(n, size_t(a), __builtin_return_address(0));
}

void operator delete(void* p) noexcept {
  release(p);
}
void operator delete[](void* p) noexcept {
  release(p);
}
void operator delete(void* p, size_t) noexcept {
  release(p);
}
void operator delete[](void* p, size_t) noexcept {
  release(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  release(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  release(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  release(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  release(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  release(p);
}
