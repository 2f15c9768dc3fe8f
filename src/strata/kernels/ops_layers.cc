// ops.h: normalisation, attention, rotary embedding, activations, embeddings (the dispatch:
// dispatch.h).
#include <algorithm>
#include <cmath>

#include "strata/kernels/cpu/activation.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/cpu/attention_tiled.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/embedding.h"
#include "strata/kernels/cpu/norm.h"
#include "strata/kernels/cpu/rope.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

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
  const Call access = on_device(op, {out, mean, rstd, x, w, b});
  if (access.dry) return;
  same_dtype(op, {out, x, w, b});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "out", out, x.numel());
  expect_numel(op, "bias", b, w.numel());
  STRATA_ON_CUDA(access, layernorm_forward(out, mean, rstd, x, w, b, eps));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::layernorm_forward(p<S>(out), p<float>(mean), p<float>(rstd), p<const S>(x),
                               p<const S>(w), p<const S>(b), n.N, n.C, eps);
  });
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset) {
  constexpr const char* op = "rmsnorm_forward";
  const Call access = on_device(op, {out, rstd, x, w});
  if (access.dry) return;
  same_dtype(op, {out, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "out", out, x.numel());
  STRATA_ON_CUDA(access, rmsnorm_forward(out, rstd, x, w, eps, w_offset));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::rmsnorm_forward(p<S>(out), p<float>(rstd), p<const S>(x), p<const S>(w), n.N, n.C, eps,
                             w_offset);
  });
}

size_t norm_backward_scratch_floats(int64_t N, int64_t C) {
  return kernels::norm_backward_scratch_floats(as_int("norm_backward_scratch_floats", N),
                                               as_int("norm_backward_scratch_floats", C));
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                        Tensor w, Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward";
  const Call access = on_device(op, {dx, dw, db, scratch, dy, x, w, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  same_dtype(op, {dw, db});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "dw", dw, n.C);
  expect_numel(op, "db", db, n.C);
  expect_scratch(op, scratch, n);
  STRATA_ON_CUDA(access, layernorm_backward(dx, dw, db, scratch, dy, x, w, mean, rstd));
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::layernorm_backward(p<S>(dx), p<G>(dw), p<G>(db), p<float>(scratch), p<const S>(dy),
                                p<const S>(x), p<const S>(w), p<const float>(mean),
                                p<const float>(rstd), n.N, n.C);
  });
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor w,
                      Tensor rstd, float w_offset) {
  constexpr const char* op = "rmsnorm_backward";
  const Call access = on_device(op, {dx, dw, scratch, dy, x, w, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "dw", dw, n.C);
  expect_scratch(op, scratch, n);
  STRATA_ON_CUDA(access, rmsnorm_backward(dx, dw, scratch, dy, x, w, rstd, w_offset));
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::rmsnorm_backward(p<S>(dx), p<G>(dw), p<float>(scratch), p<const S>(dy), p<const S>(x),
                              p<const S>(w), p<const float>(rstd), n.N, n.C, w_offset);
  });
}

void layernorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward_input";
  const Call access = on_device(op, {dx, dy, x, w, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {mean, rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  STRATA_ON_CUDA(access, layernorm_backward_input(dx, dy, x, w, mean, rstd));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::layernorm_backward_input(p<S>(dx), p<const S>(dy), p<const S>(x), p<const S>(w),
                                      p<const float>(mean), p<const float>(rstd), n.N, n.C);
  });
}

void layernorm_backward_weight(Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                               Tensor mean, Tensor rstd) {
  constexpr const char* op = "layernorm_backward_weight";
  const Call access = on_device(op, {dw, db, scratch, dy, x, mean, rstd});
  if (access.dry) return;
  same_dtype(op, {dy, x});
  same_dtype(op, {dw, db});
  const Rows n = norm_size(op, x, dw.numel(), {mean, rstd});
  expect_numel(op, "dy", dy, x.numel());
  expect_numel(op, "db", db, n.C);
  expect_scratch(op, scratch, n);
  STRATA_ON_CUDA(access, layernorm_backward_weight(dw, db, scratch, dy, x, mean, rstd));
  with_sg(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::layernorm_backward_weight(p<G>(dw), p<G>(db), p<float>(scratch), p<const S>(dy),
                                       p<const S>(x), p<const float>(mean), p<const float>(rstd),
                                       n.N, n.C);
  });
}

void rmsnorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor rstd, float w_offset) {
  constexpr const char* op = "rmsnorm_backward_input";
  const Call access = on_device(op, {dx, dy, x, w, rstd});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x, w});
  const Rows n = norm_size(op, x, w.numel(), {rstd});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  STRATA_ON_CUDA(access, rmsnorm_backward_input(dx, dy, x, w, rstd, w_offset));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::rmsnorm_backward_input(p<S>(dx), p<const S>(dy), p<const S>(x), p<const S>(w),
                                    p<const float>(rstd), n.N, n.C, w_offset);
  });
}

void rmsnorm_backward_weight(Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward_weight";
  const Call access = on_device(op, {dw, scratch, dy, x, rstd});
  if (access.dry) return;
  same_dtype(op, {dy, x});
  const Rows n = norm_size(op, x, dw.numel(), {rstd});
  expect_numel(op, "dy", dy, x.numel());
  expect_scratch(op, scratch, n);
  STRATA_ON_CUDA(access, rmsnorm_backward_weight(dw, scratch, dy, x, rstd));
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

// The score settings (AttentionShape's scale, softcap, window, pos, documents) as the CPU
// kernels take them, checked; the documents where the host reads them (a CPU call).
kernels::AttentionScores check_scores(const char* op, const AttentionShape& s, bool host) {
  STRATA_CHECK(s.scale >= 0.0f && s.softcap >= 0.0f && s.window >= 0, op, ": attention scale ",
               s.scale, ", softcap ", s.softcap, " and window ", s.window,
               " must be >= 0 (0: 1/sqrt(hd), no cap, no window)");
  if (s.window > 0 && s.pos != nullptr) {
    for (int t = 1; t < s.T; ++t) {
      STRATA_CHECK(s.pos[t] > s.pos[t - 1], op, ": a window needs positions that increase along ",
                   "the rows, but row ", t, " is at ", s.pos[t], " after ", s.pos[t - 1]);
    }
  }
  if (host) check_documents(op, s, s.pos);
  return {s.scale, s.softcap, s.window, s.pos, nullptr, s.doc_begin, s.seq};
}

// att holds what attention_saved says for qkv's device and dtype.
void expect_saved(const char* op, const Tensor& att, const Tensor& qkv, const AttentionShape& s) {
  const AttentionSaved saved = attention_saved(qkv.device, qkv.dtype, s);
  STRATA_CHECK(att.dtype == saved.dtype, op, ": att holds ", dtype_name(att.dtype), ", expected ",
               dtype_name(saved.dtype), " (attention_saved)");
  expect_numel(op, "att", att, saved.numel);
}

}  // namespace

AttentionSaved attention_saved(Device device, DType act, const AttentionShape& s) {
  const int64_t rows = int64_t(s.B) * s.groups * s.rep * s.T;
  if (device == Device::CUDA ||
      kernels::attention_path(s.T, act) == kernels::AttentionPath::Tiled) {
    return {DType::F32, rows};  // the log-sum-exp of each query row
  }
  return {act, rows * s.T};  // the probabilities
}

void attention_forward(Tensor out, Tensor att, Tensor qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  const Call access = on_device(op, {out, att, qkv});
  if (access.dry) return;
  same_dtype(op, {out, qkv});
  check_attention(op, s, qkv);
  const int NH = s.groups * s.rep;
  if (out.data != nullptr) expect_numel(op, "out", out, int64_t(s.B) * s.T * NH * s.hd);
  expect_saved(op, att, qkv, s);
  const kernels::AttentionScores sc = check_scores(op, s, !access.cuda);
  STRATA_ON_CUDA(access, attention_forward(out, att, qkv, s));
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if (kernels::attention_path(s.T, qkv.dtype) == kernels::AttentionPath::Tiled) {
      kernels::attention_tiled_forward(p<S>(out), p<float>(att), p<const S>(qkv), s.B, s.T, NH,
                                       s.groups, s.hd, sc);
    } else {
      kernels::attention_forward(p<S>(out), p<S>(att), p<const S>(qkv), s.B, s.T, NH, s.groups,
                                 s.hd, sc);
    }
  });
}

size_t attention_backward_scratch_floats(Device device, DType act, const AttentionShape& s) {
  if (device == Device::CUDA ||
      kernels::attention_path(s.T, act) == kernels::AttentionPath::Tiled) {
    return 0;  // recomputed tile by tile (the CPU's tiles are the kernel's own workspace)
  }
  return kernels::attention_backward_scratch_floats(
      s.B, s.T, s.groups * s.rep, s.groups, s.hd,
      {s.scale, s.softcap, s.window, s.pos, nullptr, s.doc_begin, s.seq});
}

void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  const Call access = on_device(op, {dqkv, scratch, dout, qkv, att});
  if (access.dry) return;
  same_dtype(op, {dqkv, dout, qkv});
  check_attention(op, s, qkv);
  const int NH = s.groups * s.rep;
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, int64_t(s.B) * s.T * NH * s.hd);
  expect_saved(op, att, qkv, s);
  expect_f32(op, "scratch", scratch);
  const size_t need = attention_backward_scratch_floats(qkv.device, qkv.dtype, s);
  STRATA_CHECK(need == 0 || (scratch.data != nullptr && size_t(scratch.numel()) >= need), op,
               ": scratch ", scratch.shape_str(),
               " is smaller than attention_backward_scratch_floats");
  const kernels::AttentionScores sc = check_scores(op, s, !access.cuda);
  STRATA_ON_CUDA(access, attention_backward(dqkv, scratch, dout, qkv, att, s));
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if (kernels::attention_path(s.T, qkv.dtype) == kernels::AttentionPath::Tiled) {
      kernels::attention_tiled_backward(p<S>(dqkv), p<const S>(dout), p<const S>(qkv),
                                        p<const float>(att), s.B, s.T, NH, s.groups, s.hd, sc);
      return;
    }
    kernels::attention_backward(p<S>(dqkv), p<float>(scratch), p<const S>(dout), p<const S>(qkv),
                                p<const S>(att), s.B, s.T, NH, s.groups, s.hd, sc);
  });
}

Rope rope_default(int hd, float theta) {
  STRATA_CHECK(hd > 0 && hd % 2 == 0 && hd / 2 <= Rope::kMaxHalf,
               "rope_default: rope needs an even head dim <= ", 2 * Rope::kMaxHalf, ", got ", hd);
  Rope r;
  r.rotary_dim = hd;
  // In fp32, as Hugging Face computes them.
  for (int i = 0; i < hd / 2; ++i) r.inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(hd));
  return r;
}

namespace {

// The rep query heads and the key head of every group rotate; the value heads do not.
void rope(const char* op, Tensor qkv, const AttentionShape& s, const Rope& r, bool forward) {
  const Call access = on_device(op, {qkv});
  if (access.dry) return;
  const int64_t row = check_attention(op, s, qkv);
  const int64_t group = int64_t(s.rep + 2) * s.hd;
  STRATA_CHECK(r.rotary_dim > 0 && r.rotary_dim % 2 == 0 && r.rotary_dim <= s.hd &&
                   r.rotary_dim / 2 <= Rope::kMaxHalf,
               op, ": rotary_dim=", r.rotary_dim, " must be even, in (0, hd=", s.hd,
               "] and <= ", 2 * Rope::kMaxHalf,
               " (build the table with rope_default or model/rope.h)");
#if STRATA_HAVE_CUDA
  if (access.cuda) {
    STRATA_CHECK(s.pos == nullptr, op,
                 ": positions other than 0..T-1 (context parallelism) "
                 "run on the CPU only");
    STRATA_CHECK(s.doc_begin == nullptr || s.seq >= s.T, op, ": documents over sequences of ",
                 s.seq, " positions, but T is ", s.T);
    return forward ? cuda::rope_forward(qkv, s, r) : cuda::rope_backward(qkv, s, r);
  }
#endif
  check_documents(op, s, s.pos);
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if (forward) {
      kernels::rope_forward(p<S>(qkv), s.B, s.T, s.groups, s.rep + 1, s.hd, group, row, r.inv_freq,
                            r.rotary_dim, r.attention_factor, s.pos, s.doc_begin, s.seq);
    } else {
      kernels::rope_backward(p<S>(qkv), s.B, s.T, s.groups, s.rep + 1, s.hd, group, row, r.inv_freq,
                             r.rotary_dim, r.attention_factor, s.pos, s.doc_begin, s.seq);
    }
  });
}

}  // namespace

void rope_forward(Tensor qkv, const AttentionShape& s, const Rope& table) {
  rope("rope_forward", qkv, s, table, true);
}

void rope_backward(Tensor dqkv, const AttentionShape& s, const Rope& table) {
  rope("rope_backward", dqkv, s, table, false);
}

// --- activations --------------------------------------------------------------------------------

void gelu_forward(Tensor out, Tensor x) {
  constexpr const char* op = "gelu_forward";
  const Call access = on_device(op, {out, x});
  if (access.dry) return;
  same_dtype(op, {out, x});
  expect_numel(op, "out", out, x.numel());
  STRATA_ON_CUDA(access, gelu_forward(out, x));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::gelu_forward(p<S>(out), p<const S>(x), size_t(x.numel()));
  });
}

void gelu_backward(Tensor dx, Tensor x, Tensor dy) {
  constexpr const char* op = "gelu_backward";
  const Call access = on_device(op, {dx, x, dy});
  if (access.dry) return;
  same_dtype(op, {dx, x, dy});
  expect_numel(op, "dx", dx, x.numel());
  expect_numel(op, "dy", dy, x.numel());
  STRATA_ON_CUDA(access, gelu_backward(dx, x, dy));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::gelu_backward(p<S>(dx), p<const S>(x), p<const S>(dy), size_t(x.numel()));
  });
}

namespace {

// (N, F) of a gated unit's output (N, F) with input (N, 2F) (SwiGLU, GeGLU).
Rows swiglu_size(const char* op, const Tensor& y, const Tensor& x) {
  const int64_t F = last_dim(op, "out", y);
  expect_numel(op, "x", x, 2 * y.numel());
  return {as_int(op, y.numel() / F), as_int(op, F)};
}

}  // namespace

void swiglu_forward(Tensor out, Tensor x) {
  constexpr const char* op = "swiglu_forward";
  const Call access = on_device(op, {out, x});
  if (access.dry) return;
  same_dtype(op, {out, x});
  const Rows n = swiglu_size(op, out, x);
  STRATA_ON_CUDA(access, swiglu_forward(out, x));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::swiglu_forward(p<S>(out), p<const S>(x), n.N, n.C);
  });
}

void swiglu_backward(Tensor dx, Tensor dy, Tensor x) {
  constexpr const char* op = "swiglu_backward";
  const Call access = on_device(op, {dx, dy, x});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x});
  const Rows n = swiglu_size(op, dy, x);
  expect_numel(op, "dx", dx, x.numel());
  STRATA_ON_CUDA(access, swiglu_backward(dx, dy, x));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::swiglu_backward(p<S>(dx), p<const S>(dy), p<const S>(x), n.N, n.C);
  });
}

void geglu_forward(Tensor out, Tensor x) {
  constexpr const char* op = "geglu_forward";
  const Call access = on_device(op, {out, x});
  if (access.dry) return;
  same_dtype(op, {out, x});
  const Rows n = swiglu_size(op, out, x);
  STRATA_ON_CUDA(access, geglu_forward(out, x));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::geglu_forward(p<S>(out), p<const S>(x), n.N, n.C);
  });
}

void geglu_backward(Tensor dx, Tensor dy, Tensor x) {
  constexpr const char* op = "geglu_backward";
  const Call access = on_device(op, {dx, dy, x});
  if (access.dry) return;
  same_dtype(op, {dx, dy, x});
  const Rows n = swiglu_size(op, dy, x);
  expect_numel(op, "dx", dx, x.numel());
  STRATA_ON_CUDA(access, geglu_backward(dx, dy, x));
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::geglu_backward(p<S>(dx), p<const S>(dy), p<const S>(x), n.N, n.C);
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
  const Call access = on_device(op, {out, tokens, rows});
  if (access.dry) return;
  same_dtype(op, {out, rows});
  const int C = embedding_width(op, rows, row_begin, row_end);
  const int N = as_int(op, tokens.numel());
  expect_numel(op, "out", out, int64_t(N) * C);
  tokens_of(op, tokens);  // int32, on either device
  STRATA_ON_CUDA(access, embedding_forward(out, tokens, rows, row_begin, row_end));
  with_s(op, rows.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::embedding_forward(p<S>(out), tokens_of(op, tokens), p<const S>(rows), row_begin,
                               row_end, 1, N, C);
  });
}

void embedding_backward(Tensor drows, Tensor dout, Tensor tokens, int64_t row_begin,
                        int64_t row_end) {
  constexpr const char* op = "embedding_backward";
  const Call access = on_device(op, {drows, dout, tokens});
  if (access.dry) return;
  const int C = embedding_width(op, drows, row_begin, row_end);
  const int N = as_int(op, tokens.numel());
  expect_numel(op, "dout", dout, int64_t(N) * C);
  tokens_of(op, tokens);  // int32, on either device
  STRATA_ON_CUDA(access, embedding_backward(drows, dout, tokens, row_begin, row_end));
  with_sg(op, dout.dtype, drows.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::embedding_backward(p<G>(drows), row_begin, row_end, p<const S>(dout),
                                tokens_of(op, tokens), 1, N, C);
  });
}

namespace {

// The checks both position embedding ops share: the table (or its gradient, `name`) holds the
// positions rows reach; the documents cover the sequences of the rows [pos0, pos0 + N) (a CPU
// call's are read here).
void check_positions(const char* op, const Call& access, const char* name, const Tensor& wpe,
                     int64_t C, int64_t N, int64_t T, int64_t pos0, const int32_t* pos,
                     const int32_t* doc_begin, int64_t seq) {
  STRATA_CHECK(T > 0 && pos0 >= 0 && wpe.numel() >= T * C, op, ": ", name, " ", wpe.shape_str(),
               " does not hold T=", T, " positions of ", C, " (pos0=", pos0, ")");
  STRATA_CHECK(pos == nullptr || !access.cuda, op,
               ": positions other than 0..T-1 (context "
               "parallelism) run on the CPU only");
  if (doc_begin == nullptr) return;
  STRATA_CHECK(seq >= T || pos != nullptr, op, ": documents over sequences of ", seq,
               " positions, but T is ", T);
  if (access.cuda || N == 0) return;
  const int64_t B = (pos0 + N - 1) / T + 1;  // the sequences the rows reach
  check_doc_begin(op, doc_begin, B, seq);
  const int64_t last = pos != nullptr ? *std::max_element(pos, pos + T) : T - 1;
  STRATA_CHECK(last < seq, op, ": documents over sequences of ", seq,
               " positions, but a row is at position ", last);
}

}  // namespace

void position_forward(Tensor out, Tensor wpe, int64_t T, int64_t pos0, const int32_t* pos,
                      const int32_t* doc_begin, int64_t seq) {
  constexpr const char* op = "position_forward";
  const Call access = on_device(op, {out, wpe});
  if (access.dry) return;
  same_dtype(op, {out, wpe});
  const int64_t C = last_dim(op, "out", out);
  check_positions(op, access, "wpe", wpe, C, out.numel() / C, T, pos0, pos, doc_begin, seq);
  STRATA_ON_CUDA(access, position_forward(out, wpe, T, pos0, doc_begin, seq));
  with_s(op, out.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::position_forward(p<S>(out), p<const S>(wpe), out.numel() / C, as_int(op, T),
                              as_int(op, C), pos0, pos, doc_begin, seq);
  });
}

void position_backward(Tensor dwpe, Tensor dout, int64_t T, int64_t pos0, const int32_t* pos,
                       const int32_t* doc_begin, int64_t seq) {
  constexpr const char* op = "position_backward";
  const Call access = on_device(op, {dwpe, dout});
  if (access.dry) return;
  const int64_t C = last_dim(op, "dout", dout);
  check_positions(op, access, "dwpe", dwpe, C, dout.numel() / C, T, pos0, pos, doc_begin, seq);
  STRATA_ON_CUDA(access, position_backward(dwpe, dout, T, pos0, doc_begin, seq));
  with_sg(op, dout.dtype, dwpe.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    kernels::position_backward(p<G>(dwpe), p<const S>(dout), dout.numel() / C, as_int(op, T),
                               as_int(op, C), pos0, pos, doc_begin, seq);
  });
}

}  // namespace strata::ops
