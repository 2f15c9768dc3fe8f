// ops.h: the general product and the linear layers (the dispatch: dispatch.h).
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

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
  const Call access = on_device(op, {c, a, b});
  if (access.dry) return;
  STRATA_CHECK(g.M > 0 && g.N > 0 && g.K > 0, "gemm: empty product M=", g.M, " N=", g.N,
               " K=", g.K);
  STRATA_CHECK(g.ldc >= g.N && (g.M - 1) * g.ldc + g.N <= c.numel(), "gemm: c ", c.shape_str(),
               " with row stride ", g.ldc, " does not hold (", g.M, ", ", g.N, ")");
  const kernels::MatOperand oa = operand("a", a, g.M, g.K, g.lda, g.trans_a);
  const kernels::MatOperand ob = operand("b", b, g.K, g.N, g.ldb, g.trans_b);
  STRATA_ON_CUDA(access, gemm(c, a, b, g));
  const int64_t batch[2] = {1, 1};
  kernels::matmul({c.data, c.dtype, g.ldc}, oa, ob, g.M, g.N, g.K, batch, g.alpha, g.accumulate);
}

bool gemm_widens(Device device, DType t, int64_t rows) {
  return device == Device::CPU && kernels::matmul_widens(t, rows);
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
  const Call access = on_device(op, {y, x, w, b});
  if (access.dry) return;
  same_dtype(op, {y, x, w, b});
  const auto [M, K, N] = linear_size(op, w, x);
  expect_numel(op, "y", y, M * N);
  expect_numel(op, "bias", b, N);
  STRATA_ON_CUDA(access, linear_forward(y, x, w, b));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::linear_forward(p<S>(y), p<const S>(x), p<const S>(w), p<const S>(b), M, K, N);
  });
}

void linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
  constexpr const char* op = "linear_backward_input";
  const Call access = on_device(op, {dx, dy, w});
  if (access.dry) return;
  same_dtype(op, {dx, dy, w});
  const auto [M, K, N] = linear_size(op, w, dx);
  expect_numel(op, "dy", dy, M * N);
  STRATA_ON_CUDA(access, linear_backward_input(dx, dy, w, accumulate));
  with_s(op, dy.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::linear_backward_input(p<S>(dx), p<const S>(dy), p<const S>(w), M, K, N, accumulate);
  });
}

void linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x) {
  constexpr const char* op = "linear_backward_weight";
  const Call access = on_device(op, {dw, db, dy, x});
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
  STRATA_ON_CUDA(access, linear_backward_weight(dw, db, dy, x));
  with_sg(op, dy.dtype, (dw.data != nullptr ? dw : db).dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::linear_backward_weight(p<G>(dw), p<G>(db), p<const S>(dy), p<const S>(x), M, K, N);
  });
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w) {
  constexpr const char* op = "linear_backward";
  const Call access = on_device(op, {dx, dw, db, dy, x, w});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  same_dtype(op, {dw, db});
  const auto [M, K, N] = linear_size(op, w, x);
  expect_numel(op, "dw", dw, N * K);
  expect_numel(op, "dy", dy, M * N);
  expect_numel(op, "dx", dx, M * K);
  expect_numel(op, "db", db, N);
  STRATA_ON_CUDA(access, linear_backward(dx, dw, db, dy, x, w));
  with_sg(op, dy.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::linear_backward(p<S>(dx), p<G>(dw), p<G>(db), p<const S>(dy), p<const S>(x),
                             p<const S>(w), M, K, N);
  });
}

}  // namespace strata::ops
