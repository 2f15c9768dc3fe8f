// ops.h: the cross-entropies (and the logits' soft cap) and the optimizer steps (the dispatch:
// dispatch.h).
#include <cmath>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cross_entropy.h"
#include "strata/kernels/cpu/elementwise.h"
#include "strata/kernels/cpu/optimizer.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

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

void softcap_inplace(Tensor t, float cap) {
  constexpr const char* op = "softcap_inplace";
  const Call access = on_device(op, {t});
  if (access.dry) return;
  STRATA_CHECK(cap > 0.0f && std::isfinite(cap), op, ": cap=", cap,
               " must be a positive finite number (final_logit_softcapping; leave it unset for "
               "no cap)");
  STRATA_ON_CUDA(access, softcap_inplace(t, cap));
  with_s(op, t.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::softcap_inplace(p<S>(t), size_t(t.numel()), cap);
  });
}

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  constexpr const char* op = "cross_entropy_forward";
  const Call access = on_device(op, {losses, logits, targets});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {losses});
  tokens_of(op, targets);  // int32, on either device
  STRATA_ON_CUDA(access, cross_entropy_forward(losses, logits, targets));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::cross_entropy_forward(p<float>(losses), p<const S>(logits), tokens_of(op, targets),
                                   n.N, n.C);
  });
}

void cross_entropy_stats(Tensor losses, Tensor stats, Tensor logits, Tensor targets) {
  constexpr const char* op = "cross_entropy_stats";
  const Call access = on_device(op, {losses, stats, logits, targets});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {losses});
  expect_f32(op, "stats", stats);
  expect_numel(op, "stats", stats, 3 * int64_t(n.N));
  tokens_of(op, targets);  // int32, on either device
  STRATA_ON_CUDA(access, cross_entropy_stats(losses, stats, logits, targets));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::cross_entropy_stats(p<float>(losses), p<float>(stats), p<const S>(logits),
                                 tokens_of(op, targets), n.N, n.C);
  });
}

void ce_dlogits(Tensor out, int64_t ldo, Tensor logits, Tensor targets, Tensor stats, int64_t c0,
                int64_t cols, int64_t v0, int64_t valid, float dloss, float softcap) {
  constexpr const char* op = "ce_dlogits";
  const Call access = on_device(op, {out, logits, targets, stats});
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
  STRATA_CHECK(softcap >= 0.0f && std::isfinite(softcap), op, ": softcap=", softcap,
               " must be 0 (no cap) or the positive cap the logits were soft-capped with");
  tokens_of(op, targets);  // int32, on either device
  STRATA_ON_CUDA(access,
                 ce_dlogits(out, ldo, logits, targets, stats, c0, cols, v0, valid, dloss, softcap));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    if (out.dtype == DType::F32) {
      kernels::ce_dlogits(p<float>(out), ldo, p<const S>(logits), tokens_of(op, targets),
                          p<const float>(stats), n.N, n.C, c0, cols, v0, int(valid), dloss,
                          softcap);
    } else {
      kernels::ce_dlogits(p<S>(out), ldo, p<const S>(logits), tokens_of(op, targets),
                          p<const float>(stats), n.N, n.C, c0, cols, v0, int(valid), dloss,
                          softcap);
    }
  });
}

void vocab_ce_max(Tensor rowmax, Tensor logits, int64_t valid) {
  constexpr const char* op = "vocab_ce_max";
  const Call access = on_device(op, {rowmax, logits});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, rowmax, {rowmax});
  check_valid(op, 0, valid, n.C);
  STRATA_ON_CUDA(access, vocab_ce_max(rowmax, logits, valid));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::vocab_ce_max(p<float>(rowmax), p<const S>(logits), n.N, n.C, int(valid));
  });
}

void vocab_ce_sums(Tensor sums, Tensor logits, Tensor targets, Tensor gmax, int64_t v0,
                   int64_t valid) {
  constexpr const char* op = "vocab_ce_sums";
  const Call access = on_device(op, {sums, logits, targets, gmax});
  if (access.dry) return;
  const Rows n = ce_size(op, logits, targets, {gmax});
  check_valid(op, v0, valid, n.C);
  expect_f32(op, "sums", sums);
  expect_numel(op, "sums", sums, 2 * int64_t(n.N));
  tokens_of(op, targets);  // int32, on either device
  STRATA_ON_CUDA(access, vocab_ce_sums(sums, logits, targets, gmax, v0, valid));
  with_s(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::vocab_ce_sums(p<float>(sums), p<const S>(logits), tokens_of(op, targets),
                           p<const float>(gmax), n.N, n.C, v0, int(valid));
  });
}

void vocab_ce_finish(Tensor losses, Tensor targets, Tensor gmax, Tensor sums) {
  constexpr const char* op = "vocab_ce_finish";
  const Call access = on_device(op, {losses, targets, gmax, sums});
  if (access.dry) return;
  const int64_t N = targets.numel();
  expect_f32(op, "losses", losses);
  expect_numel(op, "losses", losses, N);
  expect_f32(op, "gmax", gmax);
  expect_numel(op, "gmax", gmax, N);
  expect_f32(op, "sums", sums);
  expect_numel(op, "sums", sums, 2 * N);
  tokens_of(op, targets);  // int32, on either device
  STRATA_ON_CUDA(access, vocab_ce_finish(losses, targets, gmax, sums));
  kernels::vocab_ce_finish(p<float>(losses), tokens_of(op, targets), p<const float>(gmax),
                           p<const float>(sums), as_int(op, N));
}

void max_rows(Tensor out, Tensor in) {
  constexpr const char* op = "max_rows";
  const Call access = on_device(op, {out, in});
  if (access.dry) return;
  expect_f32(op, "out", out);
  expect_f32(op, "in", in);
  const int64_t K = rows_of(op, "in", in, out.numel());
  STRATA_ON_CUDA(access, max_rows(out, in));
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
  const Call access = on_device(op, {master, param, grad, m, v});
  if (access.dry) return;
  const size_t n = update_size(op, master, {param, grad, m, v});
  expect_f32(op, "m", m);
  expect_f32(op, "v", v);
  STRATA_ON_CUDA(access, adam_step(master, param, grad, m, v, a));
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
  const Call access = on_device(op, {master, param, grad, buf});
  if (access.dry) return;
  const size_t n = update_size(op, master, {param, grad, buf});
  expect_f32(op, "buf", buf);
  STRATA_CHECK(a.momentum == 0.0f || buf.data != nullptr, op, ": momentum needs a buffer");
  STRATA_ON_CUDA(access, sgd_step(master, param, grad, buf, a));
  const Tensor& target = param.data != nullptr ? param : master;
  with_sg(op, target.dtype, grad.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::sgd_step(p<float>(master), p<S>(target), p<const G>(grad), p<float>(buf), n, a.lr,
                      a.momentum, a.weight_decay, a.nesterov, a.grad_scale, a.step);
  });
}

}  // namespace strata::ops
