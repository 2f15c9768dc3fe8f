// ops.h: dry runs, memory, token checks, streams and events (the dispatch: dispatch.h).
#include "strata/kernels/ops.h"

#include <tuple>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/elementwise.h"
#include "strata/kernels/cpu/embedding.h"
#include "strata/kernels/cpu/optimizer.h"
#include "strata/kernels/dispatch.h"
#if STRATA_HAVE_CUDA
#include "strata/kernels/cuda/runtime.h"
#endif

namespace strata::ops {

using namespace dispatch;

DryRun::DryRun() {
  ++dry_runs;
}
DryRun::~DryRun() {
  --dry_runs;
}
bool dry_run() {
  return dry_runs > 0;
}

// --- memory ---------------------------------------------------------------------------------

void fill_zero(Tensor t) {
  constexpr const char* op = "fill_zero";
  const Call access = on_device(op, {t});
  if (access.dry || t.data == nullptr) return;
  STRATA_ON_CUDA(access, fill_zero(t));
  std::memset(t.data, 0, t.nbytes());
}

void synchronize(Device device) {
  if (device == Device::CPU || dry_run()) return;
#if STRATA_HAVE_CUDA
  cuda::synchronize_device();
#else
  STRATA_FAIL("synchronize: this strata is built without the CUDA backend");
#endif
}

void copy(Tensor dst, Tensor src) {
  constexpr const char* op = "copy";
  const Call access = on_device(op, {dst, src});
  if (access.dry) return;
  expect_numel(op, "dst", dst, src.numel());
  STRATA_ON_CUDA(access, copy(dst, src));
  convert(dst.data, dst.dtype, src.data, src.dtype, size_t(src.numel()));
}

void copy_2d(Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows, int64_t cols) {
  constexpr const char* op = "copy_2d";
  const Call access = on_device(op, {dst, src});
  if (access.dry || rows == 0 || cols == 0) return;
  same_dtype(op, {dst, src});
  STRATA_CHECK(rows > 0 && cols > 0 && cols <= dst_ld && cols <= src_ld, op, ": ", rows, " x ",
               cols, " with row strides ", dst_ld, " and ", src_ld);
  for (const auto& [name, t, ld] : {std::tuple{"dst", dst, dst_ld}, {"src", src, src_ld}}) {
    STRATA_CHECK(t.numel() >= (rows - 1) * ld + cols, op, ": ", name, " ", t.shape_str(),
                 " holds fewer than ", rows, " rows of ", cols, " at stride ", ld);
  }
  STRATA_ON_CUDA(access, copy_2d(dst, dst_ld, src, src_ld, rows, cols));
  const size_t e = dtype_size(dst.dtype), row = size_t(cols) * e;
  char* d = static_cast<char*>(dst.data);
  const char* s = static_cast<const char*>(src.data);
#pragma omp parallel for schedule(static) if (rows * cols >= kernels::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(d + size_t(r * dst_ld) * e, s + size_t(r * src_ld) * e, row);
  }
}

void copy_from_host(Tensor dst, const void* src) {
  constexpr const char* op = "copy_from_host";
  const Call access = on_device(op, {dst});
  if (access.dry) return;
  STRATA_ON_CUDA(access, copy_from_host(dst, src));
  std::memcpy(dst.data, src, dst.nbytes());  // the host is the CPU backend's device
}

void copy_to_host(void* dst, Tensor src) {
  constexpr const char* op = "copy_to_host";
  const Call access = on_device(op, {src});
  if (access.dry) return;
  STRATA_ON_CUDA(access, copy_to_host(dst, src));
  std::memcpy(dst, src.data, src.nbytes());
}

void* host_address(Tensor t) {
  return t.device == Device::CPU && !device_memory::guarded() ? t.data : nullptr;
}

void add_inplace(Tensor y, Tensor x) {
  constexpr const char* op = "add_inplace";
  const Call access = on_device(op, {y, x});
  if (access.dry) return;
  same_dtype(op, {y, x});
  expect_numel(op, "x", x, y.numel());
  STRATA_ON_CUDA(access, add_inplace(y, x));
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::add_inplace(p<S>(y), p<const S>(x), size_t(y.numel()));
  });
}

void add_bias(Tensor y, Tensor b) {
  constexpr const char* op = "add_bias";
  const Call access = on_device(op, {y, b});
  if (access.dry) return;
  same_dtype(op, {y, b});
  const int64_t N = b.numel(), M = rows_of(op, "y", y, N);
  STRATA_ON_CUDA(access, add_bias(y, b));
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::add_bias(p<S>(y), p<const S>(b), M, N);
  });
}

void scale_inplace(Tensor t, float s) {
  constexpr const char* op = "scale_inplace";
  const Call access = on_device(op, {t});
  if (access.dry) return;
  STRATA_ON_CUDA(access, scale_inplace(t, s));
  with_s(op, t.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::scale_inplace(p<S>(t), size_t(t.numel()), s);
  });
}

double sum_squares(Tensor t) {
  constexpr const char* op = "sum_squares";
  const Call access = on_device(op, {t});
  if (access.dry) return 0;
  STRATA_ON_CUDA(access, sum_squares(t));
  return kernels::sum_squares(t.data, t.dtype, size_t(t.numel()));
}

double sum(Tensor t) {
  constexpr const char* op = "sum";
  const Call access = on_device(op, {t});
  if (access.dry) return 0;
  expect_f32(op, "t", t);
  STRATA_ON_CUDA(access, sum(t));
  return kernels::sum(p<const float>(t), size_t(t.numel()));
}

// --- tokens --------------------------------------------------------------------------------------

namespace {

// The first token of t (n) outside [lo, hi), or -1, and the token at i, on either device.
int64_t find_outside(const Call& call, const int32_t* t, int64_t n, int64_t lo, int64_t hi) {
#if STRATA_HAVE_CUDA
  if (call.cuda) return cuda::find_token_outside(t, n, lo, hi);
#endif
  static_cast<void>(call);
  return kernels::find_token_outside(t, n, lo, hi);
}
int32_t token_at(const Call& call, const int32_t* t, int64_t i) {
  if (i < 0) return 0;
  int32_t v = 0;
  if (call.cuda) {
    copy_to_host(&v, Tensor(const_cast<int32_t*>(t + i), DType::I32, {1}, Device::CUDA));
  } else {
    v = t[i];
  }
  return v;
}

}  // namespace

int64_t check_tokens(Tensor inputs, Tensor targets, int64_t V) {
  constexpr const char* op = "check_tokens";
  const Call access = on_device(op, {inputs, targets});
  if (access.dry) return 0;
  if (inputs.data != nullptr) {
    const int32_t* in = tokens_of(op, inputs);
    const int64_t bad = find_outside(access, in, inputs.numel(), 0, V);
    STRATA_INPUT_CHECK(bad < 0, "input token ", token_at(access, in, bad), " at position ", bad,
                       " is outside the vocabulary [0, ", V,
                       "): the data was tokenized for another vocabulary (model.vocab)");
  }
  if (targets.data == nullptr) return 0;
  const int32_t* tg = tokens_of(op, targets);
  const int64_t bad = find_outside(access, tg, targets.numel(), INT32_MIN, V);
  STRATA_INPUT_CHECK(bad < 0, "target token ", token_at(access, tg, bad), " at position ", bad,
                     " is outside the vocabulary [0, ", V,
                     "): the data was tokenized for another vocabulary (model.vocab)");
#if STRATA_HAVE_CUDA
  if (access.cuda) return cuda::count_nonnegative(tg, targets.numel());
#endif
  return kernels::count_nonnegative(tg, targets.numel());
}

// --- streams and events --------------------------------------------------------------------------

Event record(Stream s) {
  STRATA_CHECK(s.kind == StreamKind::Compute,
               "record: a communication stream's events come from its operations' handles");
  if (s.device == Device::CUDA) {
#if STRATA_HAVE_CUDA
    return dry_run() ? Event() : cuda::record_event(cuda::compute_stream());
#else
    STRATA_FAIL("record: this strata is built without the CUDA backend");
#endif
  }
  return {};  // the CPU's compute stream has finished its work when a kernel returns
}

void wait(Stream s, const Event& e) {
  if (s.device == Device::CUDA) {
#if STRATA_HAVE_CUDA
    if (dry_run()) return;
    cuda::stream_wait(s.kind == StreamKind::Compute ? cuda::compute_stream() : cuda::comm_stream(),
                      e);
    return;
#else
    STRATA_FAIL("wait: this strata is built without the CUDA backend");
#endif
  }
  e.wait();
}

Stream compute_stream() {
  return {default_device(), StreamKind::Compute};
}

Device device_of(const void* p) {
#if STRATA_HAVE_CUDA
  if (p != nullptr && cuda::is_device_pointer(p)) return Device::CUDA;
#endif
  static_cast<void>(p);
  return Device::CPU;
}

OnStream::OnStream(Stream s) {
#if STRATA_HAVE_CUDA
  if (s.device == Device::CUDA && !dry_run()) {
    previous_ =
        cuda::swap_thread_stream(s.kind == StreamKind::Compute ? nullptr : cuda::comm_stream());
    active_ = true;
  }
#endif
  static_cast<void>(s);
}

OnStream::~OnStream() {
#if STRATA_HAVE_CUDA
  if (active_) cuda::swap_thread_stream(static_cast<cudaStream_t>(previous_));
#endif
}

// --- devices -------------------------------------------------------------------------------------

int device_count(Device device) {
  if (device == Device::CPU) return 1;
#if STRATA_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

void init_device(Device device, int ordinal) {
  if (device == Device::CPU) return;
#if STRATA_HAVE_CUDA
  cuda::init(ordinal);
#else
  STRATA_INPUT_FAIL(
      "GPU ", ordinal, " was asked for, but this strata is built without the CUDA ",
      "backend: build it where nvcc is found (the CUDA toolkit) and -DSTRATA_CUDA=ON");
#endif
}

void synchronize(const Event& e) {
  e.wait();
}

}  // namespace strata::ops
