// Ring attention's pieces (ops.h): checks, then kernels/cpu/attention_ring.h. CPU only: context
// parallelism is refused on the CUDA backend (config/model.cc).
#include <algorithm>
#include <limits>

#include "strata/kernels/cpu/attention_ring.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

namespace {

// Checks common to every piece: on the CPU, qkv of the shape, kv (when given) of its keys and
// values; returns the heads.
int check_ring(const char* op, const Call& access, const AttentionShape& s, const Tensor& qkv,
               const Tensor* kv) {
  STRATA_CHECK(!access.cuda, op, ": ring attention (context parallelism) runs on the CPU only");
  STRATA_CHECK(s.B > 0 && s.T > 0 && s.groups > 0 && s.rep > 0 && s.hd > 0, op,
               ": empty attention shape");
  const int64_t rows = int64_t(s.B) * s.T;
  expect_numel(op, "qkv", qkv, rows * s.groups * (s.rep + 2) * s.hd);
  if (kv != nullptr) {
    same_dtype(op, {qkv, *kv});
    expect_numel(op, "kv", *kv, rows * s.groups * 2 * s.hd);
  }
  return s.groups * s.rep;
}

// The score settings of a block. Its query rows and key rows are at the positions pos[q0 + i]
// and kv_pos[k0 + j] (q0 + i and k0 + j without pos: the rows of one sequence held whole). A
// window or documents over a rank's share of a longer sequence (pos) need the visiting keys' own
// positions.
kernels::AttentionScores block_scores(const char* op, const AttentionShape& s) {
  STRATA_CHECK(s.scale >= 0.0f && s.softcap >= 0.0f && s.window >= 0, op, ": attention scale ",
               s.scale, ", softcap ", s.softcap, " and window ", s.window,
               " must be >= 0 (0: 1/sqrt(hd), no cap, no window)");
  STRATA_CHECK((s.window == 0 && s.doc_begin == nullptr) || s.pos == nullptr || s.kv_pos != nullptr,
               op,
               ": a sliding window or documents over ring attention's blocks need the positions "
               "of the visiting keys (AttentionShape::kv_pos)");
  const int32_t* kv_pos = s.kv_pos != nullptr ? s.kv_pos : s.pos;
  check_documents(op, s, s.pos);
  if (kv_pos != s.pos) check_documents(op, s, kv_pos);
  return {s.scale, s.softcap, s.window, s.pos, kv_pos, s.doc_begin, s.seq};
}

}  // namespace

void attention_lse_clear(Tensor lse) {
  constexpr const char* op = "attention_lse_clear";
  const Call access = on_device(op, {lse});
  if (access.dry) return;
  STRATA_CHECK(!access.cuda, op, ": ring attention (context parallelism) runs on the CPU only");
  expect_f32(op, "lse", lse);
  std::fill_n(p<float>(lse), lse.numel(), -std::numeric_limits<float>::infinity());
}

void attention_pack_kv(Tensor kv, Tensor qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_pack_kv";
  const Call access = on_device(op, {kv, qkv});
  if (access.dry) return;
  const int NH = check_ring(op, access, s, qkv, &kv);
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_pack_kv(p<S>(kv), p<const S>(qkv), s.B, s.T, NH, s.groups, s.hd);
  });
}

void attention_unpack_dqkv(Tensor dqkv, Tensor dq, Tensor dkv, const AttentionShape& s) {
  constexpr const char* op = "attention_unpack_dqkv";
  const Call access = on_device(op, {dqkv, dq, dkv});
  if (access.dry) return;
  const int NH = check_ring(op, access, s, dqkv, nullptr);
  const int64_t rows = int64_t(s.B) * s.T;
  expect_f32(op, "dq", dq);
  expect_f32(op, "dkv", dkv);
  expect_numel(op, "dq", dq, rows * NH * s.hd);
  expect_numel(op, "dkv", dkv, rows * s.groups * 2 * s.hd);
  with_s(op, dqkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_unpack_dqkv(p<S>(dqkv), p<const float>(dq), p<const float>(dkv), s.B, s.T,
                                   NH, s.groups, s.hd);
  });
}

void attention_block_forward(Tensor o, Tensor lse, Tensor qkv, int q0, int Tq, Tensor kv, int k0,
                             int Tk, const AttentionShape& s, bool causal) {
  constexpr const char* op = "attention_block_forward";
  const Call access = on_device(op, {o, lse, qkv, kv});
  if (access.dry) return;
  const int NH = check_ring(op, access, s, qkv, &kv);
  expect_f32(op, "o", o);
  expect_f32(op, "lse", lse);
  expect_numel(op, "o", o, int64_t(s.B) * s.T * NH * s.hd);
  expect_numel(op, "lse", lse, int64_t(s.B) * NH * s.T);
  const kernels::AttentionScores sc = block_scores(op, s);
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_block_forward(p<float>(o), p<float>(lse), p<const S>(qkv), s.T, q0, Tq,
                                     p<const S>(kv), s.T, k0, Tk, s.B, NH, s.groups, s.hd, causal,
                                     sc);
  });
}

void attention_delta(Tensor delta, Tensor dout, Tensor out, const AttentionShape& s) {
  constexpr const char* op = "attention_delta";
  const Call access = on_device(op, {delta, dout, out});
  if (access.dry) return;
  STRATA_CHECK(!access.cuda, op, ": ring attention (context parallelism) runs on the CPU only");
  const int NH = s.groups * s.rep;
  same_dtype(op, {dout, out});
  expect_f32(op, "delta", delta);
  expect_numel(op, "delta", delta, int64_t(s.B) * NH * s.T);
  expect_numel(op, "dout", dout, int64_t(s.B) * s.T * NH * s.hd);
  expect_numel(op, "out", out, int64_t(s.B) * s.T * NH * s.hd);
  with_s(op, out.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_delta(p<float>(delta), p<const S>(dout), p<const S>(out), s.B, s.T, NH,
                             s.hd);
  });
}

void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv, Tensor lse,
                              Tensor delta, int q0, int Tq, Tensor kv, int k0, int Tk,
                              const AttentionShape& s, bool causal) {
  constexpr const char* op = "attention_block_backward";
  const Call access = on_device(op, {dq, dkv, dout, qkv, lse, delta, kv});
  if (access.dry) return;
  const int NH = check_ring(op, access, s, qkv, &kv);
  same_dtype(op, {dout, qkv});
  for (const auto& [name, t] :
       {std::pair{"dq", dq}, {"dkv", dkv}, {"lse", lse}, {"delta", delta}}) {
    expect_f32(op, name, t);
  }
  const int64_t rows = int64_t(s.B) * s.T;
  expect_numel(op, "dq", dq, rows * NH * s.hd);
  expect_numel(op, "dkv", dkv, rows * s.groups * 2 * s.hd);
  expect_numel(op, "dout", dout, rows * NH * s.hd);
  expect_numel(op, "lse", lse, int64_t(s.B) * NH * s.T);
  expect_numel(op, "delta", delta, int64_t(s.B) * NH * s.T);
  const kernels::AttentionScores sc = block_scores(op, s);
  with_s(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    kernels::attention_block_backward(p<float>(dq), p<float>(dkv), p<const S>(dout),
                                      p<const S>(qkv), p<const float>(lse), p<const float>(delta),
                                      s.T, q0, Tq, p<const S>(kv), s.T, k0, Tk, s.B, NH, s.groups,
                                      s.hd, causal, sc);
  });
}

}  // namespace strata::ops
