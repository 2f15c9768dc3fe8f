// Tracked storage. Every buffer is tagged with a category; the tracker keeps current and peak
// bytes per category for this process (one process is one rank). Logs and tests read it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <string>

#include "strata/core/device.h"

namespace strata {

enum class MemCategory : int {
  Params,
  MasterParams,
  Grads,
  OptimizerState,
  Activations,
  CheckpointedActivations,  // inputs kept by fully recomputed blocks, in device memory
  CommBuffers,
  Workspace,
  HostCheckpoints,  // the same, moved to host memory (activation_checkpointing.cpu_checkpointing)
};
inline constexpr int kNumMemCategories = 9;
const char* mem_category_name(MemCategory c);  // snake_case, e.g. "optimizer_state"

class MemoryTracker {
 public:
  static MemoryTracker& instance();
  void on_alloc(MemCategory c, size_t bytes);
  void on_free(MemCategory c, size_t bytes);
  size_t current(MemCategory c) const { return current_[int(c)].load(); }
  size_t peak(MemCategory c) const { return peak_[int(c)].load(); }
  size_t current_total() const;
  size_t peak_total() const { return peak_total_.load(); }
  // Starts a new peak window: peaks become the current values.
  void reset_peaks();

 private:
  std::array<std::atomic<size_t>, kNumMemCategories> current_{};
  std::array<std::atomic<size_t>, kNumMemCategories> peak_{};
  std::atomic<size_t> total_{0};
  std::atomic<size_t> peak_total_{0};
};

// An owning, 64-byte-aligned, zero-initialised allocation counted under one category: device
// memory (core/device_memory.h: host code reaches it only through kernels/ops.h), or host memory
// from host().
class Buffer {
 public:
  Buffer() = default;
  // Device memory; a device other than the CPU needs its backend built and the device selected
  // (ops::init_device): an error otherwise.
  Buffer(MemCategory category, size_t bytes, Device device = default_device());
  // Host memory that host code reads and writes (staging for checkpoints and transfers, token
  // ids, host-resident activation checkpoints); pinned where a backend has such memory.
  static Buffer host(MemCategory category, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  // Gives the allocation up without freeing it: for memory another thread may still write while
  // the process is dying (a collective in flight when an error unwinds the stack).
  void leak() { data_ = nullptr, bytes_ = 0; }
  bool on_host() const { return host_; }
  Device device() const { return device_; }

 private:
  void allocate(bool host);
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::Workspace;
  Device device_ = Device::CPU;
  bool host_ = false;
  bool pinned_ = false;  // host memory from the backend's pinned allocator
};

std::string format_bytes(size_t bytes);  // "12.3 MiB"

}  // namespace strata
