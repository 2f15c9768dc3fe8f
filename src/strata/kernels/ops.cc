// ops.h: dry runs, memory, token checks, streams and events (the dispatch: dispatch.h).
#include "strata/kernels/ops.h"

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/elementwise.h"
#include "strata/kernels/cpu/embedding.h"
#include "strata/kernels/cpu/optimizer.h"
#include "strata/kernels/dispatch.h"

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
  const Call access = on_cpu(op, {t});
  if (access.dry) return;
  if (t.data != nullptr) std::memset(t.data, 0, t.nbytes());
}

void synchronize(Device device) {
  if (device == Device::CUDA) STRATA_FAIL("synchronize: no CUDA backend is built into strata");
}

void copy(Tensor dst, Tensor src) {
  constexpr const char* op = "copy";
  const Call access = on_cpu(op, {dst, src});
  if (access.dry) return;
  expect_numel(op, "dst", dst, src.numel());
  convert(dst.data, dst.dtype, src.data, src.dtype, size_t(src.numel()));
}

void copy_from_host(Tensor dst, const void* src) {
  constexpr const char* op = "copy_from_host";
  const Call access = on_cpu(op, {dst});
  if (access.dry) return;
  std::memcpy(dst.data, src, dst.nbytes());  // the host is the CPU backend's device
}

void copy_to_host(void* dst, Tensor src) {
  constexpr const char* op = "copy_to_host";
  const Call access = on_cpu(op, {src});
  if (access.dry) return;
  std::memcpy(dst, src.data, src.nbytes());
}

void* host_address(Tensor t) {
  return t.device == Device::CPU && !device_memory::guarded() ? t.data : nullptr;
}

void add_inplace(Tensor y, Tensor x) {
  constexpr const char* op = "add_inplace";
  const Call access = on_cpu(op, {y, x});
  if (access.dry) return;
  same_dtype(op, {y, x});
  expect_numel(op, "x", x, y.numel());
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::add_inplace(p<S>(y), p<const S>(x), size_t(y.numel()));
  });
}

void add_bias(Tensor y, Tensor b) {
  constexpr const char* op = "add_bias";
  const Call access = on_cpu(op, {y, b});
  if (access.dry) return;
  same_dtype(op, {y, b});
  const int64_t N = b.numel(), M = rows_of(op, "y", y, N);
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::add_bias(p<S>(y), p<const S>(b), M, N);
  });
}

void scale_inplace(Tensor t, float s) {
  constexpr const char* op = "scale_inplace";
  const Call access = on_cpu(op, {t});
  if (access.dry) return;
  with_s(op, t.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::scale_inplace(p<S>(t), size_t(t.numel()), s);
  });
}

double sum_squares(Tensor t) {
  constexpr const char* op = "sum_squares";
  const Call access = on_cpu(op, {t});
  if (access.dry) return 0;
  return kernels::sum_squares(t.data, t.dtype, size_t(t.numel()));
}

double sum(Tensor t) {
  constexpr const char* op = "sum";
  const Call access = on_cpu(op, {t});
  if (access.dry) return 0;
  expect_f32(op, "t", t);
  return kernels::sum(p<const float>(t), size_t(t.numel()));
}

// --- tokens --------------------------------------------------------------------------------------

int64_t check_tokens(Tensor inputs, Tensor targets, int64_t V) {
  constexpr const char* op = "check_tokens";
  const Call access = on_cpu(op, {inputs, targets});
  if (access.dry) return 0;
  if (inputs.data != nullptr) {
    const int32_t* in = tokens_of(op, inputs);
    const int64_t bad = kernels::find_token_outside(in, inputs.numel(), 0, V);
    STRATA_INPUT_CHECK(bad < 0, "input token ", in[bad], " at position ", bad,
                       " is outside the vocabulary [0, ", V,
                       "): the data was tokenized for another vocabulary (model.vocab)");
  }
  if (targets.data == nullptr) return 0;
  const int32_t* tg = tokens_of(op, targets);
  const int64_t bad = kernels::find_token_outside(tg, targets.numel(), INT32_MIN, V);
  STRATA_INPUT_CHECK(bad < 0, "target token ", tg[bad], " at position ", bad,
                     " is outside the vocabulary [0, ", V,
                     "): the data was tokenized for another vocabulary (model.vocab)");
  return kernels::count_nonnegative(tg, targets.numel());
}

// --- streams and events --------------------------------------------------------------------------

Event record(Stream s) {
  if (s.device == Device::CUDA) STRATA_FAIL("record: no CUDA backend is built into strata");
  STRATA_CHECK(s.kind == StreamKind::Compute,
               "record: a communication stream's events come from its operations' handles");
  return {};  // the CPU's compute stream has finished its work when a kernel returns
}

void wait(Stream s, const Event& e) {
  if (s.device == Device::CUDA) STRATA_FAIL("wait: no CUDA backend is built into strata");
  e.wait();
}

void synchronize(const Event& e) {
  e.wait();
}

}  // namespace strata::ops
