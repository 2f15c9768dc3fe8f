// ops.h: q/k normalisation on the grouped QKV layout (the dispatch: dispatch.h).
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/qk_norm.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

namespace {

// Checks the shape and a qkv-like view (N, groups·(rep+2)·hd); returns the CPU kernels'
// arguments, with the options of n (none for qk_norm_sumsq).
kernels::QkNormArgs check_qk_norm(const char* op, const AttentionShape& s, const Tensor& qkv,
                                  const QkNorm* n) {
  STRATA_CHECK(s.B > 0 && s.T > 0 && s.groups > 0 && s.rep > 0 && s.hd > 0, op,
               ": empty attention shape B=", s.B, " T=", s.T, " groups=", s.groups, " rep=", s.rep,
               " hd=", s.hd);
  const int64_t N = int64_t(s.B) * s.T;
  expect_numel(op, "qkv", qkv, N * s.groups * (s.rep + 2) * s.hd);
  kernels::QkNormArgs a{as_int(op, N), s.groups, s.rep, s.hd};
  if (n == nullptr) return a;
  STRATA_CHECK(n->eps > 0.0f, op, ": eps must be positive, got ", n->eps);
  if (!n->per_head) {
    STRATA_CHECK(
        n->q_width >= int64_t(s.groups) * s.rep * s.hd && n->k_width >= int64_t(s.groups) * s.hd,
        op, ": whole q/k norm spans q_width=", n->q_width, " and k_width=", n->k_width,
        " values, fewer than this rank's ", int64_t(s.groups) * s.rep * s.hd, " and ",
        int64_t(s.groups) * s.hd, " (set them to the model's query and key widths)");
  }
  a.per_head = n->per_head;
  a.eps = n->eps;
  a.w_offset = n->w_offset;
  a.q_width = n->q_width;
  a.k_width = n->k_width;
  return a;
}

// The gains: (hd) each per head; this rank's query and key widths whole.
void expect_gains(const char* op, const Tensor& wq, const Tensor& wk, const kernels::QkNormArgs& a,
                  const char* q_name = "wq", const char* k_name = "wk") {
  STRATA_CHECK(wq.data != nullptr && wk.data != nullptr, op, ": ", q_name, " and ", k_name,
               " are required");
  expect_numel(op, q_name, wq, a.per_head ? a.hd : int64_t(a.groups) * a.rep * a.hd);
  expect_numel(op, k_name, wk, a.per_head ? a.hd : int64_t(a.groups) * a.hd);
}

// A row's statistics: rstd (N, groups·(rep+1)) per head, (N, 2) whole; the whole mode's sums
// (N, 2). fp32, present.
void expect_stats(const char* op, const char* name, const Tensor& t, int64_t per_row,
                  const kernels::QkNormArgs& a) {
  STRATA_CHECK(t.data != nullptr, op, ": ", name, " is required");
  expect_f32(op, name, t);
  expect_numel(op, name, t, int64_t(a.N) * per_row);
}
int64_t rstd_per_row(const kernels::QkNormArgs& a) {
  return a.per_head ? int64_t(a.groups) * (a.rep + 1) : 2;
}

}  // namespace

void qk_norm_sumsq(Tensor sumsq, Tensor qkv, const AttentionShape& s) {
  constexpr const char* op = "qk_norm_sumsq";
  const Call access = on_device(op, {sumsq, qkv});
  if (access.dry) return;
  const kernels::QkNormArgs a = check_qk_norm(op, s, qkv, nullptr);
  expect_stats(op, "sumsq", sumsq, 2, a);
  STRATA_ON_CUDA(access, qk_norm_sumsq(sumsq, qkv, s));
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::qk_norm_sumsq(p<float>(sumsq), p<const S>(qkv), a);
  });
}

void qk_norm_forward(Tensor out, Tensor rstd, Tensor qkv, Tensor wq, Tensor wk, Tensor sumsq,
                     const AttentionShape& s, const QkNorm& n) {
  constexpr const char* op = "qk_norm_forward";
  const Call access = on_device(op, {out, rstd, qkv, wq, wk, sumsq});
  if (access.dry) return;
  same_dtype(op, {out, qkv, wq, wk});
  const kernels::QkNormArgs a = check_qk_norm(op, s, qkv, &n);
  expect_numel(op, "out", out, qkv.numel());
  STRATA_CHECK(out.data != qkv.data, op, ": out must not be qkv (the backward reads qkv)");
  expect_gains(op, wq, wk, a);
  expect_stats(op, "rstd", rstd, rstd_per_row(a), a);
  if (!n.per_head) expect_stats(op, "sumsq", sumsq, 2, a);
  STRATA_ON_CUDA(access, qk_norm_forward(out, rstd, qkv, wq, wk, sumsq, s, n));
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::qk_norm_forward(p<S>(out), p<float>(rstd), p<const S>(qkv), p<const S>(wq),
                             p<const S>(wk), n.per_head ? nullptr : p<const float>(sumsq), a);
  });
}

void qk_norm_backward_dot(Tensor dot, Tensor dout, Tensor qkv, Tensor wq, Tensor wk, Tensor rstd,
                          const AttentionShape& s, const QkNorm& n) {
  constexpr const char* op = "qk_norm_backward_dot";
  const Call access = on_device(op, {dot, dout, qkv, wq, wk, rstd});
  if (access.dry) return;
  STRATA_CHECK(!n.per_head, op, ": the whole mode's step (per head, qk_norm_backward sums alone)");
  same_dtype(op, {dout, qkv, wq, wk});
  const kernels::QkNormArgs a = check_qk_norm(op, s, qkv, &n);
  expect_numel(op, "dout", dout, qkv.numel());
  expect_gains(op, wq, wk, a);
  expect_stats(op, "rstd", rstd, 2, a);
  expect_stats(op, "dot", dot, 2, a);
  STRATA_ON_CUDA(access, qk_norm_backward_dot(dot, dout, qkv, wq, wk, rstd, s, n));
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::qk_norm_backward_dot(p<float>(dot), p<const S>(dout), p<const S>(qkv), p<const S>(wq),
                                  p<const S>(wk), p<const float>(rstd), a);
  });
}

void qk_norm_backward(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor dout, Tensor qkv, Tensor wq,
                      Tensor wk, Tensor rstd, Tensor dot, const AttentionShape& s,
                      const QkNorm& n) {
  constexpr const char* op = "qk_norm_backward";
  const Call access = on_device(op, {dqkv, dwq, dwk, dout, qkv, wq, wk, rstd, dot});
  if (access.dry) return;
  same_dtype(op, {dqkv, dout, qkv, wq, wk});
  same_dtype(op, {dwq, dwk});
  const kernels::QkNormArgs a = check_qk_norm(op, s, qkv, &n);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, qkv.numel());
  STRATA_CHECK(dqkv.data != dout.data, op, ": dqkv must not be dout");
  expect_gains(op, wq, wk, a);
  expect_gains(op, dwq, dwk, a, "dwq", "dwk");
  expect_stats(op, "rstd", rstd, rstd_per_row(a), a);
  if (!n.per_head) expect_stats(op, "dot", dot, 2, a);
  STRATA_ON_CUDA(access, qk_norm_backward(dqkv, dwq, dwk, dout, qkv, wq, wk, rstd, dot, s, n));
  with_sg(op, qkv.dtype, dwq.dtype, [&](auto z, auto g) {
    using S = decltype(z);
    using G = decltype(g);
    kernels::qk_norm_backward(p<S>(dqkv), p<G>(dwq), p<G>(dwk), p<const S>(dout), p<const S>(qkv),
                              p<const S>(wq), p<const S>(wk), p<const float>(rstd),
                              n.per_head ? nullptr : p<const float>(dot), a);
  });
}

}  // namespace strata::ops
