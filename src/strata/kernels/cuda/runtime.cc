// The CUDA runtime of the backend (runtime.h): the selected device, its two streams, the events
// ops::record hands out, device and pinned host memory behind Buffer, scratch, and the copies
// between host and device.
#include "strata/kernels/cuda/runtime.h"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "strata/core/device_memory.h"
#include "strata/core/memory.h"
#include "strata/kernels/cuda/backend.h"

namespace strata::ops::cuda {

void fail(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // a sticky launch error would otherwise resurface at the next check
  detail::throw_error(file, line,
                      detail::concat("CUDA error ", cudaGetErrorName(e), " (",
                                     cudaGetErrorString(e), ") in ", call));
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  detail::throw_error(file, line,
                      detail::concat("cuBLAS error ", cublasLtGetStatusName(s), " (",
                                     cublasLtGetStatusString(s), ") in ", call));
}

namespace {

// Selects the process's device on the calling thread before its first CUDA call (below).
void bind_thread();

// An in-order queue of one stream's recorded events: event seq is the device event in slot
// seq % kSlots. A slot is recorded again only kSlots events later; a wait on a slot that has
// been re-recorded waits for the later work of the same stream, an order at least as strict as
// asked, and done() of an overwritten slot answers from the later event (false until it is done).
class StreamQueue final : public Completion {
 public:
  static constexpr uint64_t kSlots = 1024;

  void create(cudaStream_t stream) {
    stream_ = stream;
    for (cudaEvent_t& e : events_) {
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  cudaStream_t stream() const { return stream_; }

  Event record() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = ++recorded_;
    STRATA_CUDA_CHECK(cudaEventRecord(events_[seq % kSlots], stream_));
    return Event(this, seq);
  }
  cudaEvent_t event(uint64_t seq) const { return events_[seq % kSlots]; }

  // Any thread may ask (a comm thread, a host waiter): each binds first, as every CUDA call does.
  bool done(uint64_t seq) const override {
    bind_thread();
    const cudaError_t e = cudaEventQuery(events_[seq % kSlots]);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) fail(e, "cudaEventQuery", __FILE__, __LINE__);
    return true;
  }
  void wait(uint64_t seq) override {
    bind_thread();
    STRATA_CUDA_CHECK(cudaEventSynchronize(events_[seq % kSlots]));
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, kSlots> events_{};
  std::mutex mu_;
  uint64_t recorded_ = 0;
};

struct Runtime {
  std::once_flag once;
  int device = -1;
  cudaStream_t compute = nullptr, comm = nullptr;
  StreamQueue compute_queue, comm_queue;
  cublasLtHandle_t lt = nullptr;
  std::mutex scratch_mu;
  std::vector<std::pair<cudaStream_t, Buffer>> scratch;  // one per stream that asked
  Buffer lt_workspace;
};

// Never destroyed: buffers and streams released during static destruction would race the CUDA
// runtime's own teardown at exit.
Runtime& rt() {
  static Runtime* r = new Runtime;
  return *r;
}

thread_local cudaStream_t t_stream = nullptr;  // an OnStream scope's stream on this thread
thread_local bool t_bound = false;             // cudaSetDevice has run on this thread

// The CUDA runtime's current device is per thread: every thread that issues work (the comm
// threads too, and any thread that frees, pins or waits) selects the process's device before its
// first call. One that has not makes that call on device 0, creating a context there: on a node
// whose ranks see every GPU, one context of every rank on GPU 0.
void bind_thread() {
  if (t_bound || rt().device < 0) return;
  STRATA_CUDA_CHECK(cudaSetDevice(rt().device));
  t_bound = true;
}

// bind_thread for the releases, which run in destructors and at exit: never throws (an unloading
// runtime refuses cudaSetDevice; the release then reports what it can).
void bind_thread_quietly() {
  if (t_bound || rt().device < 0) return;
  if (cudaSetDevice(rt().device) == cudaSuccess) {
    t_bound = true;
  } else {
    cudaGetLastError();
  }
}

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

void* allocate_device(size_t bytes) {
  bind_thread();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;  // Buffer reports the out-of-memory error with what to change
  }
  if (e != cudaSuccess) fail(e, "cudaMalloc", __FILE__, __LINE__);
  // Zeroed as every Buffer is; synchronously, since the first user may be either stream.
  STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, rt().compute));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(rt().compute));
  return p;
}

void release_device(void* p, size_t) {
  bind_thread_quietly();
  // cudaFree waits for the device's work; at exit the runtime may already be unloading.
  const cudaError_t e = cudaFree(p);
  if (e != cudaSuccess && e != cudaErrorCudartUnloading) fail(e, "cudaFree", __FILE__, __LINE__);
}

void* allocate_pinned(size_t bytes) {
  bind_thread();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  if (e != cudaSuccess) fail(e, "cudaHostAlloc", __FILE__, __LINE__);
  std::memset(p, 0, bytes);
  return p;
}

void release_pinned(void* p, size_t) {
  bind_thread_quietly();
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess && e != cudaErrorCudartUnloading) {
    fail(e, "cudaFreeHost", __FILE__, __LINE__);
  }
}

void require_init() {
  STRATA_CHECK(rt().device >= 0,
               "the CUDA backend is used before a GPU is selected (ops::init_device)");
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver, or no device: not an error, there are none
    return 0;
  }
  return n;
}

void init(int ordinal) {
  Runtime& r = rt();
  const int n = device_count();
  STRATA_INPUT_CHECK(ordinal >= 0 && ordinal < n, "GPU ", ordinal, " does not exist: ", n,
                     " CUDA device", n == 1 ? " is" : "s are",
                     " visible to this process (CUDA_VISIBLE_DEVICES, the local rank)");
  STRATA_CHECK(r.device < 0 || r.device == ordinal, "this process already runs on GPU ", r.device,
               "; one process uses one GPU");
  std::call_once(r.once, [&] {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal));
    t_bound = true;
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&r.comm, cudaStreamNonBlocking));
    r.compute_queue.create(r.compute);
    r.comm_queue.create(r.comm);
    STRATA_CUBLAS_CHECK(cublasLtCreate(&r.lt));
    r.device = ordinal;
    device_memory::set_device_allocator(Device::CUDA, {allocate_device, release_device});
    device_memory::set_host_allocator({allocate_pinned, release_pinned});
  });
}

int current_device() {
  require_init();
  return rt().device;
}

cudaStream_t compute_stream() {
  require_init();
  bind_thread();
  return t_stream != nullptr ? t_stream : rt().compute;
}

cudaStream_t comm_stream() {
  require_init();
  bind_thread();
  return rt().comm;
}

cudaStream_t swap_thread_stream(cudaStream_t stream) {
  return std::exchange(t_stream, stream);
}

bool is_device_pointer(const void* p) {
  if (rt().device < 0) return false;
  bind_thread();
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

cublasLtHandle_t lt_handle() {
  require_init();
  return rt().lt;
}

void* scratch(size_t bytes) {
  require_init();
  Runtime& r = rt();
  const cudaStream_t s = compute_stream();
  std::lock_guard<std::mutex> lock(r.scratch_mu);
  for (auto& [stream, buf] : r.scratch) {
    if (stream != s) continue;
    // Growing frees the old block: cudaFree waits for the work that still reads it.
    if (buf.bytes() < bytes) buf = Buffer(MemCategory::Workspace, bytes, Device::CUDA);
    return buf.data();
  }
  r.scratch.emplace_back(s, Buffer(MemCategory::Workspace, bytes, Device::CUDA));
  return r.scratch.back().second.data();
}

void* lt_workspace(size_t* bytes) {
  require_init();
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.scratch_mu);
  if (r.lt_workspace.bytes() == 0) {
    r.lt_workspace = Buffer(MemCategory::Workspace, kLtWorkspaceBytes, Device::CUDA);
  }
  *bytes = r.lt_workspace.bytes();
  return r.lt_workspace.data();
}

ops::Event record_event(cudaStream_t stream) {
  require_init();
  bind_thread();
  Runtime& r = rt();
  if (stream == r.comm) return r.comm_queue.record();
  STRATA_CHECK(stream == r.compute, "record_event: not a stream of this device");
  return r.compute_queue.record();
}

void stream_wait(cudaStream_t stream, const ops::Event& e) {
  bind_thread();
  Runtime& r = rt();
  for (const StreamQueue* q : {&r.compute_queue, &r.comm_queue}) {
    if (e.queue() != q) continue;
    if (q->stream() != stream) STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream, q->event(e.seq())));
    return;  // an event of the same stream is ordered by the stream itself
  }
  e.wait();  // another queue's (a communicator's thread): the host waits, then issues
}

void synchronize_compute() {
  STRATA_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}

void synchronize_device() {
  require_init();
  bind_thread();
  STRATA_CUDA_CHECK(cudaStreamSynchronize(rt().compute));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(rt().comm));
}

// --- memory -----------------------------------------------------------------------------------

void fill_zero(Tensor t) {
  STRATA_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), compute_stream()));
}

void copy_from_host(Tensor dst, const void* src) {
  // From pageable memory the call returns once src is staged; from pinned memory the DMA reads
  // src later, so wait: either way the caller may reuse src when this returns.
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, compute_stream()));
  cudaPointerAttributes attr{};
  STRATA_CUDA_CHECK(cudaPointerGetAttributes(&attr, src));
  if (attr.type == cudaMemoryTypeHost) synchronize_compute();
}

void copy_2d(Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows, int64_t cols) {
  const size_t e = dtype_size(dst.dtype);
  STRATA_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dst_ld) * e, src.data, size_t(src_ld) * e,
                                      size_t(cols) * e, size_t(rows), cudaMemcpyDeviceToDevice,
                                      compute_stream()));
}

void copy_to_host(void* dst, Tensor src) {
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, compute_stream()));
  synchronize_compute();
}

}  // namespace strata::ops::cuda
