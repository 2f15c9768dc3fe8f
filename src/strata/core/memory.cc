#include "strata/core/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "strata/core/check.h"
#include "strata/core/device_memory.h"

namespace strata {

namespace {
std::atomic<Device> g_default_device{Device::CPU};
}  // namespace

const char* device_name(Device d) {
  return d == Device::CUDA ? "cuda" : "cpu";
}

Device default_device() {
  return g_default_device.load(std::memory_order_relaxed);
}

void set_default_device(Device d) {
  g_default_device.store(d, std::memory_order_relaxed);
}

const char* mem_category_name(MemCategory c) {
  static constexpr const char* kNames[kNumMemCategories] = {
      "params",          "master_params", "grads",
      "optimizer_state", "activations",   "checkpointed_activations",
      "comm_buffers",    "workspace",     "host_checkpoints"};
  return kNames[int(c)];
}

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker tracker;
  return tracker;
}

namespace {
void raise_max(std::atomic<size_t>& peak, size_t value) {
  size_t prev = peak.load();
  while (prev < value && !peak.compare_exchange_weak(prev, value)) {
  }
}
}  // namespace

void MemoryTracker::on_alloc(MemCategory c, size_t bytes) {
  size_t now = current_[int(c)].fetch_add(bytes) + bytes;
  raise_max(peak_[int(c)], now);
  raise_max(peak_total_, total_.fetch_add(bytes) + bytes);
}

void MemoryTracker::on_free(MemCategory c, size_t bytes) {
  current_[int(c)].fetch_sub(bytes);
  total_.fetch_sub(bytes);
}

size_t MemoryTracker::current_total() const {
  return total_.load();
}

void MemoryTracker::reset_peaks() {
  for (int i = 0; i < kNumMemCategories; ++i) peak_[i].store(current_[i].load());
  peak_total_.store(total_.load());
}

Buffer::Buffer(MemCategory category, size_t bytes, Device device)
    : bytes_(bytes), category_(category), device_(device) {
  allocate(false);
}

Buffer Buffer::host(MemCategory category, size_t bytes) {
  Buffer b;
  b.bytes_ = bytes, b.category_ = category;
  b.allocate(true);
  return b;
}

void Buffer::allocate(bool host) {
  host_ = host;
  if (bytes_ == 0) return;
  if (host && device_memory::host_allocator() != nullptr) {
    data_ = device_memory::host_allocator()->allocate(bytes_);
    pinned_ = true;
  } else if (host) {
    const size_t rounded = (bytes_ + 63) / 64 * 64;
    data_ = rounded >= bytes_ ? std::aligned_alloc(64, rounded) : nullptr;  // no wrap-around
    if (data_ != nullptr) std::memset(data_, 0, rounded);
  } else if (device_ == Device::CPU) {
    data_ = device_memory::allocate(bytes_);
  } else {
    data_ = device_memory::device_allocator(device_).allocate(bytes_);
  }
  if (data_ == nullptr) {
    // The user's model or batch does not fit: what to change, not where strata noticed.
    const size_t held = MemoryTracker::instance().current_total();
    const size_t bytes = bytes_;
    bytes_ = 0;
    STRATA_RUNTIME_FAIL("out of memory: cannot allocate ", format_bytes(bytes), " of ",
                        mem_category_name(category_),
                        held > 0 ? " with " + format_bytes(held) + " allocated already" : "",
                        "; reduce train_micro_batch_size_per_gpu, model.seq_len or the model, or "
                        "run on several ranks with zero_optimization.stage 1-3 to shard the model "
                        "states");
  }
  MemoryTracker::instance().on_alloc(category_, bytes_);
}

Buffer::~Buffer() {
  release();
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_),
      bytes_(o.bytes_),
      category_(o.category_),
      device_(o.device_),
      host_(o.host_),
      pinned_(o.pinned_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    device_ = o.device_;
    host_ = o.host_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (data_ != nullptr) {
    if (pinned_) {
      device_memory::host_allocator()->release(data_, bytes_);
    } else if (host_) {
      std::free(data_);
    } else if (device_ == Device::CPU) {
      device_memory::release(data_, bytes_);
    } else {
      device_memory::device_allocator(device_).release(data_, bytes_);
    }
    MemoryTracker::instance().on_free(category_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }
}

std::string format_bytes(size_t bytes) {
  char buf[32];
  double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  } else if (b >= 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  }
  return buf;
}

}  // namespace strata
