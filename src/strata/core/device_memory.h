// Device memory and the guarded test device (DESIGN.md §10). Memory on a device is owned by it:
// host code reaches it only through the kernel interface (kernels/ops.h: copy, fill and the
// compute ops) and the communication layer's transport (MPI on the CPU device, as NCCL reads a
// GPU's memory itself). On the CPU backend device memory is host memory, so nothing stops host
// code from reading it directly, and such code would break on a GPU.
//
// The guarded CPU device makes that mistake fail on every commit without a GPU: device buffers
// come from one reserved region whose pages are inaccessible (PROT_NONE) except while some thread
// is inside an Access scope, which only the kernel interface and the transport open. A host read
// or write of device memory outside them faults, and the fault is reported as such (the address,
// its offset in the device region, a backtrace) before the process aborts. Selected by
// STRATA_GUARDED_DEVICE=1 in the environment (read once, at the first device allocation) or by
// set_guarded() before it; tests of the training path run on it (tests/CMakeLists.txt).
//
// The guard is a process-wide state: while one thread is inside a scope (the comm thread in a
// collective, say) another thread's stray access goes unnoticed. It catches accesses made while
// no kernel or transfer runs, which is where host code outside the kernel interface runs.
#pragma once

#include <cstddef>

#include "strata/core/device.h"

namespace strata::device_memory {

// A device backend's memory (kernels/cuda registers its own when a process selects a GPU,
// ops::init_device): device memory for Buffers on that device, and the pinned host memory that
// Buffer::host hands out from then on, so that copies between the two run asynchronously. Core
// cannot link a backend; the backend hands core these instead. allocate returns zeroed memory,
// at least 64-byte aligned, or nullptr when there is no room.
struct Allocator {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p, size_t bytes) = nullptr;
};
void set_device_allocator(Device device, Allocator a);
// Where none is registered: an error naming the device (no such backend built or selected).
const Allocator& device_allocator(Device device);
void set_host_allocator(Allocator a);
// The registered pinned host allocator, or nullptr for plain (aligned, zeroed) host memory.
const Allocator* host_allocator();

// Whether device memory is guarded (the STRATA_GUARDED_DEVICE environment variable, or the last
// set_guarded()).
bool guarded();
// Selects the guarded device; only before the first device allocation of the process (an
// error after it).
void set_guarded(bool on);

// bytes of zeroed device memory, 64-byte aligned; nullptr when the device has no room.
void* allocate(size_t bytes);
void release(void* p, size_t bytes);
// Whether p lies in the guarded device's region (false on the plain CPU device).
bool contains(const void* p);

// While an Access exists on any thread, device memory is readable and writable from the host.
// Opened by the kernel interface for the duration of each call and by the communication layer
// around its transport's reads and writes; nothing else may open one. Nests; costs a relaxed
// load when the device is not guarded.
class Access {
 public:
  explicit Access(bool open = true);
  ~Access();
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;

 private:
  bool open_;
};

}  // namespace strata::device_memory
