// The CUDA runtime of the backend (kernels/cuda/backend.h): the process's device (one rank per
// GPU: the local rank's), its two streams (compute and communication, docs/devices.md), the
// events ops::record/wait hand out, the allocator behind device_memory for Device::CUDA (counted
// by the same tracker as every Buffer) and pinned host memory, a per-stream scratch arena, and
// the cuBLASLt handle. Internal to kernels/ and comm/ (the NCCL transport runs on comm_stream()).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "strata/core/check.h"
#include "strata/core/dtype.h"
#include "strata/core/stream.h"

namespace strata::ops::cuda {

// Fails with the CUDA error's name and text, the call that raised it and where.
[[noreturn]] void fail(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);
#define STRATA_CUDA_CHECK(call)                                             \
  do {                                                                      \
    const cudaError_t strata_cuda_e_ = (call);                              \
    if (strata_cuda_e_ != cudaSuccess)                                      \
      ::strata::ops::cuda::fail(strata_cuda_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define STRATA_CUBLAS_CHECK(call)                                                    \
  do {                                                                               \
    const cublasStatus_t strata_cublas_s_ = (call);                                  \
    if (strata_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::strata::ops::cuda::fail_cublas(strata_cublas_s_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: the launch's own error (bad configuration), not the kernel's result.
#define STRATA_CUDA_LAUNCHED() STRATA_CUDA_CHECK(cudaGetLastError())

// The number of visible devices (0 without a driver or GPU: never an error).
int device_count();
// Selects the device this process runs on (ordinal in [0, device_count())) and creates its
// streams and handles; the first CUDA call of a process. Idempotent for the same ordinal.
void init(int ordinal);
// The selected device; fails if init has not run.
int current_device();

// The stream the calling thread's kernels run on: the device's compute stream, or another one the
// thread has switched to (ops::OnStream: the communication layer converts and stages on its own).
cudaStream_t compute_stream();
cudaStream_t comm_stream();
// Makes `stream` the calling thread's (nullptr: back to the compute stream); returns the previous
// setting.
cudaStream_t swap_thread_stream(cudaStream_t stream);
// Whether p is device memory of the CUDA runtime (cudaPointerGetAttributes); false for host
// memory, pinned or not, and without a device.
bool is_device_pointer(const void* p);
cublasLtHandle_t lt_handle();

// Scratch device memory for the duration of work issued on the compute stream: valid until the
// next call of scratch() (callers take it once per kernel call, never hold it across calls).
// Grows, never shrinks; counted as Workspace.
void* scratch(size_t bytes);

// The cuBLASLt workspace (32 MiB, Hopper's recommendation), on the compute stream.
void* lt_workspace(size_t* bytes);

// An event of the work issued to `stream` so far (this device's compute or comm stream): an
// ops::Event whose queue is the runtime's, so that ops::wait and stream_wait order on the device.
ops::Event record_event(cudaStream_t stream);
// Makes `stream` wait for e: on the device for an event of record_event, on the host (e.wait())
// for any other (a comm thread's completion).
void stream_wait(cudaStream_t stream, const ops::Event& e);

// Blocks until the compute stream's work has finished; rethrows its error.
void synchronize_compute();
// Blocks until both of the device's streams have finished their work.
void synchronize_device();

// One launch configuration helper: blocks of `threads` covering n items (at least one block).
inline unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads > 0 ? (n + threads - 1) / threads : 1);
}

}  // namespace strata::ops::cuda
