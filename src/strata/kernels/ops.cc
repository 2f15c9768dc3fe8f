// Dispatch of ops.h: every call checks that its views share one device, refuses CUDA (no such
// backend is built yet), derives the sizes from the views' shapes, checks that they agree, and
// calls the kernels/cpu template for the views' dtypes.
#include "strata/kernels/ops.h"

#include <climits>
#include <cstring>
#include <initializer_list>

#include "strata/core/device_memory.h"
#include "strata/kernels/cpu/activation.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cross_entropy.h"
#include "strata/kernels/cpu/elementwise.h"
#include "strata/kernels/cpu/embedding.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/cpu/norm.h"
#include "strata/kernels/cpu/optimizer.h"
#include "strata/kernels/cpu/rope.h"

namespace strata::ops {

namespace {

// The non-empty views of a call live on one device, and that device has a backend. The call runs
// inside the returned scope: on the guarded test device, the only time host code may touch device
// memory (core/device_memory.h).
thread_local int dry_runs = 0;

// A call of the interface: on a dry run (DryRun) it touches nothing; otherwise it holds the device
// open for its duration.
struct Call {
  explicit Call(bool dry_run) : dry(dry_run), access(!dry_run) {}
  const bool dry;
  device_memory::Access access;
};

[[nodiscard]] Call on_cpu(const char* op, std::initializer_list<Tensor> views) {
  const Tensor* first = nullptr;
  for (const Tensor& t : views) {
    if (t.data == nullptr) continue;
    if (first == nullptr) first = &t;
    STRATA_CHECK(t.device == first->device, op, ": all views of one call must be on one device");
  }
  if (first != nullptr && first->device == Device::CUDA) {
    STRATA_FAIL(op, ": no CUDA backend is built into strata");
  }
  return Call(dry_runs > 0);
}

// f(S{}) for the storage type S that dtype t names.
template <typename F>
decltype(auto) with_s(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(float{});
    case DType::BF16:
      return f(bf16{});
    case DType::F16:
      return f(f16{});
    case DType::I32:
      break;
  }
  STRATA_FAIL(op, ": no kernel for ", dtype_name(t), " values");
}

// f(S{}, G{}) for a (storage, gradient) pair the kernels are built for (STRATA_FOR_EACH_SG).
template <typename F>
decltype(auto) with_sg(const char* op, DType s, DType g, F&& f) {
#define STRATA_SG_CASE(S, G) \
  if (s == dtype_of<S>() && g == dtype_of<G>()) return f(S{}, G{});
  STRATA_FOR_EACH_SG(STRATA_SG_CASE)
#undef STRATA_SG_CASE
  STRATA_FAIL(op, ": no kernel for ", dtype_name(s), " values with ", dtype_name(g), " gradients");
}

// The view's elements as T (null for an empty view).
template <typename T>
T* p(const Tensor& t) {
  return static_cast<T*>(t.data);
}

const int32_t* tokens_of(const char* op, const Tensor& t) {
  STRATA_CHECK(t.dtype == DType::I32, op, ": token views are int32, got ", dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

void same_dtype(const char* op, std::initializer_list<Tensor> views) {
  const Tensor* first = nullptr;
  for (const Tensor& t : views) {
    if (t.data == nullptr) continue;
    if (first == nullptr) first = &t;
    STRATA_CHECK(t.dtype == first->dtype, op, ": views mix ", dtype_name(first->dtype), " and ",
                 dtype_name(t.dtype));
  }
}

void expect_f32(const char* op, const char* name, const Tensor& t) {
  STRATA_CHECK(t.data == nullptr || t.dtype == DType::F32, op, ": ", name, " must be fp32, got ",
               dtype_name(t.dtype));
}

// An absent view passes; a present one holds exactly n elements.
void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  STRATA_CHECK(t.data == nullptr || t.numel() == n, op, ": ", name, " has ", t.numel(),
               " elements ", t.shape_str(), ", expected ", n);
}

// The last dimension of t, and numel / it, the number of rows.
int64_t last_dim(const char* op, const char* name, const Tensor& t) {
  STRATA_CHECK(t.ndim >= 1 && t.dim(-1) > 0, op, ": ", name, " needs a last dimension, got ",
               t.shape_str());
  return t.dim(-1);
}
int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t width) {
  STRATA_CHECK(width > 0 && t.numel() % width == 0, op, ": ", name, " ", t.shape_str(),
               " is not a whole number of rows of ", width);
  return t.numel() / width;
}

// N rows of C elements, as the CPU kernels take them.
struct Rows {
  int N, C;
};

// The CPU kernels take int sizes where a dimension is bounded by a model size.
int as_int(const char* op, int64_t v) {
  STRATA_CHECK(v >= 0 && v <= INT_MAX, op, ": size ", v, " exceeds the kernels' int range");
  return int(v);
}

}  // namespace

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

// --- matmul ---------------------------------------------------------------------------------

namespace {

// The operand op(X) (rows, cols) of a row-major X stored with row stride ld: transposed, its
// rows run along X's columns. X must hold the last element the product reads.
kernels::MatOperand operand(const char* name, const Tensor& x, int64_t rows, int64_t cols,
                            int64_t ld, bool trans) {
  const int64_t stored_rows = trans ? cols : rows, stored_cols = trans ? rows : cols;
  STRATA_CHECK(ld >= stored_cols && (stored_rows - 1) * ld + stored_cols <= x.numel(),
               "gemm: ", name, " ", x.shape_str(), " with row stride ", ld, " does not hold (",
               stored_rows, ", ", stored_cols, ")");
  return trans ? kernels::MatOperand{x.data, x.dtype, 1, ld}
               : kernels::MatOperand{x.data, x.dtype, ld, 1};
}

}  // namespace

void gemm(Tensor c, Tensor a, Tensor b, const Gemm& g) {
  constexpr const char* op = "gemm";
  const Call access = on_cpu(op, {c, a, b});
  if (access.dry) return;
  STRATA_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "gemm: empty product M=", g.M, " N=", g.N,
               " K=", g.K);
  STRATA_CHECK(g.ldc >= g.N && (g.M - 1) * g.ldc + g.N <= c.numel(), "gemm: c ", c.shape_str(),
               " with row stride ", g.ldc, " does not hold (", g.M, ", ", g.N, ")");
  const int64_t batch[2] = {1, 1};
  kernels::matmul({c.data, c.dtype, g.ldc}, operand("a", a, g.M, g.K, g.lda, g.trans_a),
                  operand("b", b, g.K, g.N, g.ldb, g.trans_b), g.M, g.N, g.K, batch, g.alpha,
                  g.accumulate);
}

bool gemm_widens(DType t, int64_t rows) {
  return kernels::matmul_widens(t, rows);
}

namespace {

// (M, K, N) of a linear layer from its weight (N, K) and an activation x (M, K).
struct LinearSize {
  int64_t M, K, N;
};
LinearSize linear_size(const char* op, const Tensor& w, const Tensor& x) {
  const int64_t K = last_dim(op, "weight", w), N = rows_of(op, "weight", w, K);
  return {rows_of(op, "input", x, K), K, N};
}

}  // namespace

void linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
  constexpr const char* op = "linear_forward";
  const Call access = on_cpu(op, {y, x, w, b});
  if (access.dry) return;
  same_dtype(op, {y, x, w, b});
  const auto [M, K, N] = linear_size(op, w, x);
  expect_numel(op, "y", y, M * N);
  expect_numel(op, "bias", b, N);
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::linear_forward(p<S>(y), p<const S>(x), p<const S>(w), p<const S>(b), M, K, N);
  });
}

void linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
  constexpr const char* op = "linear_backward_input";
  const Call access = on_cpu(op, {dx, dy, w});
  if (access.dry) return;
  same_dtype(op, {dx, dy, w});
  const auto [M, K, N] = linear_size(op, w, dx);
  expect_numel(op, "dy", dy, M * N);
  with_s(op, dy.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::linear_backward_input(p<S>(dx), p<const S>(dy), p<const S>(w), M, K, N, accumulate);
  });
}

void linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x) {
  constexpr const char* op = "linear_backward_weight";
  const Call access = on_cpu(op, {dw, db, dy, x});
  if (access.dry) return;
  same_dtype(op, {dy, x});
  same_dtype(op, {dw, db});
  STRATA_CHECK(dw.data != nullptr || db.data != nullptr, op, ": neither dw nor db is given");
  // Without dw, the bias gradient alone: N from db, and x is not read.
  const auto [M, K, N] = dw.data != nullptr
                             ? linear_size(op, dw, x)
                             : LinearSize{rows_of(op, "dy", dy, db.numel()), 0, db.numel()};
  expect_numel(op, "dy", dy, M * N);
  expect_numel(op, "db", db, N);
  with_sg(op, dy.dtype, (dw.data != nullptr ? dw : db).dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::linear_backward_weight(p<G>(dw), p<G>(db), p<const S>(dy), p<const S>(x), M, K, N);
  });
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w) {
  constexpr const char* op = "linear_backward";
  const Call access = on_cpu(op, {dx, dw, db, dy, x, w});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  same_dtype(op, {dw, db});
  const auto [M, K, N] = linear_size(op, w, x);
  expect_numel(op, "dw", dw, N * K);
  expect_numel(op, "dy", dy, M * N);
  expect_numel(op, "dx", dx, M * K);
  expect_numel(op, "db", db, N);
  with_sg(op, dy.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::linear_backward(p<S>(dx), p<G>(dw), p<G>(db), p<const S>(dy), p<const S>(x),
                             p<const S>(w), M, K, N);
  });
}

// --- normalisation ----------------------------------------------------------------------------

namespace {

// (N, C) of a norm over x (N, C) with C elements per parameter; the statistics (fp32, optional
// where the kernel allows) hold N.
Rows norm_size(const char* op, const Tensor& x, int64_t C, std::initializer_list<Tensor> stats) {
  const int64_t N = rows_of(op, "x", x, C);
  for (const Tensor& s : stats) {
    expect_f32(op, "mean/rstd", s);
    expect_numel(op, "mean/rstd", s, N);
  }
  return {as_int(op, N), as_int(op, C)};
}

void expect_scratch(const char* op, const Tensor& scratch, const Rows& n) {
  expect_f32(op, "scratch", scratch);
  STRATA_CHECK(scratch.data != nullptr &&
                   size_t(scratch.numel()) >= kernels::norm_backward_scratch_floats(n.N, n.C),
               op, ": scratch ", scratch.shape_str(), " is smaller than ",
               kernels::norm_backward_scratch_floats(n.N, n.C),
               " floats (norm_backward_scratch_floats)");
}

}  // namespace

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                       float eps) {
  constexpr const char* op = "layernorm_forward";
  const Call access = on_cpu(op, {out, mean, rstd, x, w, b});
  if (access.dry) return;
  same_dtype(op, {out, x, w, b});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "out", out, x.numel());
  expect_numel(op, "bias", b, w.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::layernorm_forward(p<S>(out), p<float>(mean), p<float>(rstd), p<const S>(x),
                               p<const S>(w), p<const S>(b), n.N, n.C, eps);
  });
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  const Call access = on_cpu(op, {out, rstd, x, w});
  if (access.dry) return;
  same_dtype(op, {out, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "out", out, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::rmsnorm_forward(p<S>(out), p<float>(rstd), p<const S>(x), p<const S>(w), n.N, n.C,
                             eps);
  });
}

size_t norm_backward_scratch_floats(int64_t N, int64_t C) {
  return kernels::norm_backward_scratch_floats(as_int("norm_backward_scratch_floats", N),
                                               as_int("norm_backward_scratch_floats", C));
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                        Tensor w, Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward";
  const Call access = on_cpu(op, {dx, dw, db, scratch, dy, x, w, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  same_dtype(op, {dw, db});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "dw", dw, n.C);
  expect_numel(op, "db", db, n.C);
  expect_scratch(op, scratch, n);
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::layernorm_backward(p<S>(dx), p<G>(dw), p<G>(db), p<float>(scratch), p<const S>(dy),
                                p<const S>(x), p<const S>(w), p<const float>(mean),
                                p<const float>(rstd), n.N, n.C);
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor w,
                      Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward";
  const Call access = on_cpu(op, {dx, dw, scratch, dy, x, w, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "dw", dw, n.C);
  expect_scratch(op, scratch, n);
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::rmsnorm_backward(p<S>(dx), p<G>(dw), p<float>(scratch), p<const S>(dy), p<const S>(x),
                              p<const S>(w), p<const float>(rstd), n.N, n.C);
  });
}

void layernorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward_input";
  const Call access = on_cpu(op, {dx, dy, x, w, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::layernorm_backward_input(p<S>(dx), p<const S>(dy), p<const S>(x), p<const S>(w),
                                      p<const float>(mean), p<const float>(rstd), n.N, n.C);
  });
}

void layernorm_backward_weight(Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                               Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward_weight";
  const Call access = on_cpu(op, {dw, db, scratch, dy, x, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dy, x});
  same_dtype(op, {dw, db});
  const Rows n = norm_size(op, x, dw.numel(), {mean, rstd});
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "db", db, n.C);
  expect_scratch(op, scratch, n);
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::layernorm_backward_weight(p<G>(dw), p<G>(db), p<float>(scratch), p<const S>(dy),
                                       p<const S>(x), p<const float>(mean), p<const float>(rstd),
                                       n.N, n.C);
  });
}

void rmsnorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward_input";
  const Call access = on_cpu(op, {dx, dy, x, w, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::rmsnorm_backward_input(p<S>(dx), p<const S>(dy), p<const S>(x), p<const S>(w),
                                    p<const float>(rstd), n.N, n.C);
  });
}

void rmsnorm_backward_weight(Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward_weight";
  const Call access = on_cpu(op, {dw, scratch, dy, x, rstd});
  if (access.dry) return;
  same_dtype(op, {dy, x});
  const Rows n = norm_size(op, x, dw.numel(), {rstd});
  expect_numel(op, "dy", dy, x.numel());
  expect_scratch(op, scratch, n);
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::rmsnorm_backward_weight(p<G>(dw), p<float>(scratch), p<const S>(dy), p<const S>(x),
                                     p<const float>(rstd), n.N, n.C);
  });
}

// --- attention --------------------------------------------------------------------------------

namespace {

// Checks the shape and the qkv-like view; returns qkv's row width groups·(rep+2)·hd.
int64_t check_attention(const char* op, const AttentionShape& s, const Tensor& qkv) {
  STRATA_CHECK(s.B > 0 && s.T > 0 && s.groups > 0 && s.rep > 0 && s.hd > 0, op,
               ": empty attention shape B=", s.B, " T=", s.T, " groups=", s.groups, " rep=", s.rep,
               " hd=", s.hd);
  const int64_t row = int64_t(s.groups) * (s.rep + 2) * s.hd;
  expect_numel(op, "qkv", qkv, int64_t(s.B) * s.T * row);
  return row;
}

}  // namespace

void attention_forward(Tensor out, Tensor att, Tensor qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  const Call access = on_cpu(op, {out, att, qkv});
  if (access.dry) return;
  same_dtype(op, {out, att, qkv});
  check_attention(op, s, qkv);
  const int NH = s.groups * s.rep;
  if (out.data != nullptr) expect_numel(op, "out", out, int64_t(s.B) * s.T * NH * s.hd);
  expect_numel(op, "att", att, int64_t(s.B) * NH * s.T * s.T);
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_forward(p<S>(out), p<S>(att), p<const S>(qkv), s.B, s.T, NH, s.groups, s.hd);
  });
}

size_t attention_backward_scratch_floats(const AttentionShape& s) {
  return kernels::attention_backward_scratch_floats(s.B, s.T, s.groups * s.rep, s.groups, s.hd);
}

void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  const Call access = on_cpu(op, {dqkv, scratch, dout, qkv, att});
  if (access.dry) return;
  same_dtype(op, {dqkv, dout, qkv, att});
  check_attention(op, s, qkv);
  const int NH = s.groups * s.rep;
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, int64_t(s.B) * s.T * NH * s.hd);
  expect_numel(op, "att", att, int64_t(s.B) * NH * s.T * s.T);
  expect_f32(op, "scratch", scratch);
  STRATA_CHECK(size_t(scratch.numel()) >= attention_backward_scratch_floats(s), op, ": scratch ",
               scratch.shape_str(), " is smaller than attention_backward_scratch_floats");
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_backward(p<S>(dqkv), p<float>(scratch), p<const S>(dout), p<const S>(qkv),
                                p<const S>(att), s.B, s.T, NH, s.groups, s.hd);
  });
}

namespace {

// The rep query heads and the key head of every group rotate; the value heads do not.
void rope(const char* op, Tensor qkv, const AttentionShape& s, float theta, bool forward) {
  const Call access = on_cpu(op, {qkv});
  if (access.dry) return;
  const int64_t row = check_attention(op, s, qkv);
  const int64_t group = int64_t(s.rep + 2) * s.hd;
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if (forward) {
      kernels::rope_forward(p<S>(qkv), s.B, s.T, s.groups, s.rep + 1, s.hd, group, row, theta);
    } else {
      kernels::rope_backward(p<S>(qkv), s.B, s.T, s.groups, s.rep + 1, s.hd, group, row, theta);
    }
  });
}

}  // namespace

void rope_forward(Tensor qkv, const AttentionShape& s, float theta) {
  rope("rope_forward", qkv, s, theta, true);
}

void rope_backward(Tensor dqkv, const AttentionShape& s, float theta) {
  rope("rope_backward", dqkv, s, theta, false);
}

// --- activations --------------------------------------------------------------------------------

void gelu_forward(Tensor out, Tensor x) {
  constexpr const char* op = "gelu_forward";
  const Call access = on_cpu(op, {out, x});
  if (access.dry) return;
  same_dtype(op, {out, x});
  expect_numel(op, "out", out, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::gelu_forward(p<S>(out), p<const S>(x), size_t(x.numel()));
  });
}

void gelu_backward(Tensor dx, Tensor x, Tensor dy) {
  constexpr const char* op = "gelu_backward";
  const Call access = on_cpu(op, {dx, x, dy});
  if (access.dry) return;
  same_dtype(op, {dx, x, dy});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::gelu_backward(p<S>(dx), p<const S>(x), p<const S>(dy), size_t(x.numel()));
  });
}

namespace {

// (N, F) of a SwiGLU output (N, F) with input (N, 2F).
Rows swiglu_size(const char* op, const Tensor& y, const Tensor& x) {
  const int64_t F = last_dim(op, "out", y);
  expect_numel(op, "x", x, 2 * y.numel());
  return {as_int(op, y.numel() / F), as_int(op, F)};
}

}  // namespace

void swiglu_forward(Tensor out, Tensor x) {
  constexpr const char* op = "swiglu_forward";
  const Call access = on_cpu(op, {out, x});
  if (access.dry) return;
  same_dtype(op, {out, x});
  const Rows n = swiglu_size(op, out, x);
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::swiglu_forward(p<S>(out), p<const S>(x), n.N, n.C);
  });
}

void swiglu_backward(Tensor dx, Tensor dy, Tensor x) {
  constexpr const char* op = "swiglu_backward";
  const Call access = on_cpu(op, {dx, dy, x});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x});
  const Rows n = swiglu_size(op, dy, x);
  expect_numel(op, "dx", dx, x.numel());
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::swiglu_backward(p<S>(dx), p<const S>(dy), p<const S>(x), n.N, n.C);
  });
}

// --- embeddings ----------------------------------------------------------------------------------

namespace {

// Width C of the embedding rows [row_begin, row_end) held in rows (row_end − row_begin, C).
int embedding_width(const char* op, const Tensor& rows, int64_t row_begin, int64_t row_end) {
  const int64_t R = row_end - row_begin;
  STRATA_CHECK(row_begin >= 0 && R > 0 && rows.numel() % R == 0, op, ": rows ", rows.shape_str(),
               " do not hold the embedding rows [", row_begin, ", ", row_end, ")");
  return as_int(op, rows.numel() / R);
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor rows, int64_t row_begin, int64_t row_end) {
  constexpr const char* op = "embedding_forward";
  const Call access = on_cpu(op, {out, tokens, rows});
  if (access.dry) return;
  same_dtype(op, {out, rows});
  const int C = embedding_width(op, rows, row_begin, row_end);
  const int N = as_int(op, tokens.numel());
  expect_numel(op, "out", out, int64_t(N) * C);
  with_s(op, rows.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::embedding_forward(p<S>(out), tokens_of(op, tokens), p<const S>(rows), row_begin,
                               row_end, 1, N, C);
  });
}

void embedding_backward(Tensor drows, Tensor dout, Tensor tokens, int64_t row_begin,
                        int64_t row_end) {
  constexpr const char* op = "embedding_backward";
  const Call access = on_cpu(op, {drows, dout, tokens});
  if (access.dry) return;
  const int C = embedding_width(op, drows, row_begin, row_end);
  const int N = as_int(op, tokens.numel());
  expect_numel(op, "dout", dout, int64_t(N) * C);
  with_sg(op, dout.dtype, drows.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::embedding_backward(p<G>(drows), row_begin, row_end, p<const S>(dout),
                                tokens_of(op, tokens), 1, N, C);
  });
}

void position_forward(Tensor out, Tensor wpe, int64_t T, int64_t pos0) {
  constexpr const char* op = "position_forward";
  const Call access = on_cpu(op, {out, wpe});
  if (access.dry) return;
  same_dtype(op, {out, wpe});
  const int64_t C = last_dim(op, "out", out);
  STRATA_CHECK(T > 0 && pos0 >= 0 && wpe.numel() >= T * C, op, ": wpe ", wpe.shape_str(),
               " does not hold T=", T, " positions of ", C, " (pos0=", pos0, ")");
  with_s(op, out.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::position_forward(p<S>(out), p<const S>(wpe), out.numel() / C, as_int(op, T),
                              as_int(op, C), pos0);
  });
}

void position_backward(Tensor dwpe, Tensor dout, int64_t T, int64_t pos0) {
  constexpr const char* op = "position_backward";
  const Call access = on_cpu(op, {dwpe, dout});
  if (access.dry) return;
  const int64_t C = last_dim(op, "dout", dout);
  STRATA_CHECK(T > 0 && pos0 >= 0 && dwpe.numel() >= T * C, op, ": dwpe ", dwpe.shape_str(),
               " does not hold T=", T, " positions of ", C, " (pos0=", pos0, ")");
  with_sg(op, dout.dtype, dwpe.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::position_backward(p<G>(dwpe), p<const S>(dout), dout.numel() / C, as_int(op, T),
                               as_int(op, C), pos0);
  });
}

// --- cross-entropy -------------------------------------------------------------------------------

namespace {

// (N, V) of logits for targets (N); losses and the other per-row fp32 views hold N.
Rows ce_size(const char* op, const Tensor& logits, const Tensor& targets,
             std::initializer_list<Tensor> per_row) {
  const int64_t N = targets.numel();
  STRATA_CHECK(N > 0, op, ": no targets");
  const int64_t V = rows_of(op, "logits", logits, N);  // logits hold N rows of V
  for (const Tensor& t : per_row) {
    expect_f32(op, "per-row statistics", t);
    expect_numel(op, "per-row statistics", t, N);
  }
  return {as_int(op, N), as_int(op, V)};
}

void check_valid(const char* op, int64_t v0, int64_t valid, int V) {
  STRATA_CHECK(v0 >= 0 && valid >= 0 && valid <= V, op, ": valid=", valid, " columns from v0=", v0,
               " in a shard of ", V);
}

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  constexpr const char* op = "cross_entropy_forward";
  const Call access = on_cpu(op, {losses, logits, targets});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {losses});
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::cross_entropy_forward(p<float>(losses), p<const S>(logits), tokens_of(op, targets),
                                   n.N, n.C);
  });
}

void cross_entropy_forward_backward(Tensor losses, Tensor logits, Tensor targets, float dloss) {
  constexpr const char* op = "cross_entropy_forward_backward";
  const Call access = on_cpu(op, {losses, logits, targets});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {losses});
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::cross_entropy_forward_backward(p<float>(losses), p<S>(logits), tokens_of(op, targets),
                                            n.N, n.C, dloss);
  });
}

void cross_entropy_stats(Tensor losses, Tensor stats, Tensor logits, Tensor targets) {
  constexpr const char* op = "cross_entropy_stats";
  const Call access = on_cpu(op, {losses, stats, logits, targets});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {losses});
  expect_f32(op, "stats", stats);
  expect_numel(op, "stats", stats, 3 * int64_t(n.N));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::cross_entropy_stats(p<float>(losses), p<float>(stats), p<const S>(logits),
                                 tokens_of(op, targets), n.N, n.C);
  });
}

void ce_dlogits(Tensor out, int64_t ldo, Tensor logits, Tensor targets, Tensor stats, int64_t c0,
                int64_t cols, int64_t v0, int64_t valid, float dloss) {
  constexpr const char* op = "ce_dlogits";
  const Call access = on_cpu(op, {out, logits, targets, stats});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {});
  check_valid(op, v0, valid, n.C);
  expect_f32(op, "stats", stats);
  expect_numel(op, "stats", stats, 3 * int64_t(n.N));
  STRATA_CHECK(c0 >= 0 && cols > 0 && c0 + cols <= n.C && ldo >= cols &&
                   (n.N - 1) * ldo + cols <= out.numel(),
               op, ": columns [", c0, ", ", c0 + cols, ") of ", n.C, " into ", out.shape_str(),
               " with row stride ", ldo);
  STRATA_CHECK(out.dtype == logits.dtype || out.dtype == DType::F32, op,
               ": out must be the logits' dtype or fp32, got ", dtype_name(out.dtype));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    if (out.dtype == DType::F32) {
      kernels::ce_dlogits(p<float>(out), ldo, p<const S>(logits), tokens_of(op, targets),
                          p<const float>(stats), n.N, n.C, c0, cols, v0, int(valid), dloss);
    } else {
      kernels::ce_dlogits(p<S>(out), ldo, p<const S>(logits), tokens_of(op, targets),
                          p<const float>(stats), n.N, n.C, c0, cols, v0, int(valid), dloss);
    }
  });
}

void vocab_ce_max(Tensor rowmax, Tensor logits, int64_t valid) {
  constexpr const char* op = "vocab_ce_max";
  const Call access = on_cpu(op, {rowmax, logits});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, rowmax, {rowmax});
  check_valid(op, 0, valid, n.C);
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::vocab_ce_max(p<float>(rowmax), p<const S>(logits), n.N, n.C, int(valid));
  });
}

void vocab_ce_sums(Tensor sums, Tensor logits, Tensor targets, Tensor gmax, int64_t v0,
                   int64_t valid) {
  constexpr const char* op = "vocab_ce_sums";
  const Call access = on_cpu(op, {sums, logits, targets, gmax});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {gmax});
  check_valid(op, v0, valid, n.C);
  expect_f32(op, "sums", sums);
  expect_numel(op, "sums", sums, 2 * int64_t(n.N));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::vocab_ce_sums(p<float>(sums), p<const S>(logits), tokens_of(op, targets),
                           p<const float>(gmax), n.N, n.C, v0, int(valid));
  });
}

void vocab_ce_finish(Tensor losses, Tensor targets, Tensor gmax, Tensor sums) {
  constexpr const char* op = "vocab_ce_finish";
  const Call access = on_cpu(op, {losses, targets, gmax, sums});
  if (access.dry) return;
  const int64_t N = targets.numel();
  expect_f32(op, "losses", losses);
  expect_numel(op, "losses", losses, N);
  expect_f32(op, "gmax", gmax);
  expect_numel(op, "gmax", gmax, N);
  expect_f32(op, "sums", sums);
  expect_numel(op, "sums", sums, 2 * N);
  kernels::vocab_ce_finish(p<float>(losses), tokens_of(op, targets), p<const float>(gmax),
                           p<const float>(sums), as_int(op, N));
}

void max_rows(Tensor out, Tensor in) {
  constexpr const char* op = "max_rows";
  const Call access = on_cpu(op, {out, in});
  if (access.dry) return;
  expect_f32(op, "out", out);
  expect_f32(op, "in", in);
  const int64_t K = rows_of(op, "in", in, out.numel());
  kernels::max_rows(p<float>(out), p<const float>(in), as_int(op, K), out.numel());
}

// --- optimizer ----------------------------------------------------------------------------------

namespace {

// The element count of an update, checking every present view against the master copy.
size_t update_size(const char* op, const Tensor& master, std::initializer_list<Tensor> views) {
  expect_f32(op, "master", master);
  for (const Tensor& t : views) expect_numel(op, "every view", t, master.numel());
  return size_t(master.numel());
}

}  // namespace

void adam_step(Tensor master, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamArgs& a) {
  constexpr const char* op = "adam_step";
  const Call access = on_cpu(op, {master, param, grad, m, v});
  if (access.dry) return;
  const size_t n = update_size(op, master, {param, grad, m, v});
  expect_f32(op, "m", m);
  expect_f32(op, "v", v);
  // Without param, master is the parameter: the kernel's param is master itself (S = fp32).
  const Tensor& target = param.data != nullptr ? param : master;
  with_sg(op, target.dtype, grad.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::adam_step(p<float>(master), p<S>(target), p<const G>(grad), p<float>(m), p<float>(v),
                       n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step,
                       a.adamw);
  });
}

void sgd_step(Tensor master, Tensor param, Tensor grad, Tensor buf, const SgdArgs& a) {
  constexpr const char* op = "sgd_step";
  const Call access = on_cpu(op, {master, param, grad, buf});
  if (access.dry) return;
  const size_t n = update_size(op, master, {param, grad, buf});
  expect_f32(op, "buf", buf);
  STRATA_CHECK(a.momentum == 0.0f || buf.data != nullptr, op, ": momentum needs a buffer");
  const Tensor& target = param.data != nullptr ? param : master;
  with_sg(op, target.dtype, grad.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::sgd_step(p<float>(master), p<S>(target), p<const G>(grad), p<float>(buf), n, a.lr,
                      a.momentum, a.weight_decay, a.nesterov, a.grad_scale, a.step);
  });
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
