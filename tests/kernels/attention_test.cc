#include "strata/kernels/cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/attention_tiled.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using test::rel_err;

struct Config {
  int B, T, NH, KVH, hd;
  int64_t qkv_size() const { return int64_t(B) * T * (NH + 2 * KVH) * hd; }
  int64_t out_size() const { return int64_t(B) * T * NH * hd; }
  int64_t att_size() const { return int64_t(B) * NH * T * T; }
  int64_t lse_size() const { return int64_t(B) * NH * T; }
};

std::ostream& operator<<(std::ostream& os, const Config& c) {
  return os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " KVH=" << c.KVH << " hd=" << c.hd;
}

// MHA, GQA with two and four query heads per kv head (one group among them), and sequences
// longer than one query block (64).
const Config kConfigs[] = {{2, 5, 4, 4, 8}, {2, 6, 4, 2, 8},  {2, 5, 4, 1, 8},
                           {1, 9, 8, 2, 4}, {1, 70, 2, 1, 4}, {1, 130, 2, 2, 4}};

struct Ref {
  std::vector<double> out, att, lse;  // lse (B,NH,T): ln Σ_j exp(scaled score)
};

// Straightforward causal attention in double over the grouped layout: query head h = g·rep + r
// is at column (g·(rep+2) + r)·hd, and reads the group's key head at (g·(rep+2) + rep)·hd and
// value head at (g·(rep+2) + rep + 1)·hd.
Ref reference(const std::vector<float>& qkv, const Config& c) {
  const int64_t row = (c.NH + 2 * c.KVH) * c.hd;
  const int rep = c.NH / c.KVH;
  Ref r{std::vector<double>(c.out_size(), 0.0), std::vector<double>(c.att_size(), 0.0),
        std::vector<double>(c.lse_size(), 0.0)};
  std::vector<double> p(c.T);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h)
      for (int t = 0; t < c.T; ++t) {
        const int g = h / rep, hr = h % rep;
        const float* q = &qkv[(int64_t(b) * c.T + t) * row + (g * (rep + 2) + hr) * c.hd];
        double mx = -1e300, sum = 0.0;
        for (int j = 0; j <= t; ++j) {
          const float* k = &qkv[(int64_t(b) * c.T + j) * row + (g * (rep + 2) + rep) * c.hd];
          double s = 0.0;
          for (int d = 0; d < c.hd; ++d) s += double(q[d]) * k[d];
          p[j] = s / std::sqrt(double(c.hd));
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        r.lse[(int64_t(b) * c.NH + h) * c.T + t] = mx + std::log(sum);
        for (int j = 0; j <= t; ++j) {
          p[j] /= sum;
          r.att[((int64_t(b) * c.NH + h) * c.T + t) * c.T + j] = p[j];
          const float* v = &qkv[(int64_t(b) * c.T + j) * row + (g * (rep + 2) + rep + 1) * c.hd];
          for (int d = 0; d < c.hd; ++d)
            r.out[(int64_t(b) * c.T + t) * c.NH * c.hd + h * c.hd + d] += p[j] * v[d];
        }
      }
  return r;
}

TEST(Attention, ForwardAgainstReference) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::randn(c.qkv_size(), "qkv");
    std::vector<float> out(c.out_size()), att(c.att_size(), 7.0f);
    attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    Ref r = reference(qkv, c);
    EXPECT_LT(rel_err(out, r.out), 1e-5);
    EXPECT_LT(rel_err(att, r.att), 1e-5);  // the masked part included: exactly 0 there
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::randn(c.qkv_size(), "qkv"), w = test::randn(c.out_size(), "w");
    std::vector<float> out(c.out_size()), att(c.att_size());
    auto loss = [&] {
      attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      return test::weighted_sum(w, out.data(), out.size());
    };
    loss();
    std::vector<float> dqkv(c.qkv_size(), 99.0f);
    std::vector<float> scratch(attention_backward_scratch_floats(c.B, c.T, c.NH, c.KVH, c.hd));
    attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), c.B, c.T,
                       c.NH, c.KVH, c.hd);
    auto idx = test::sample_indices(qkv.size(), 100, "idx");
    EXPECT_LT(rel_err(test::gather(dqkv, idx), test::numeric_grad(qkv, loss, 1e-3f, idx)), 1e-2);
  }
}

// Half storage rounds q·kᵀ/sqrt(hd) to S before the softmax (as PyTorch's eager attention does),
// the probabilities once more, and the output (u = 2^-8 bf16, 2^-11 fp16). The score rounding is
// absolute, u·|s| with |s| ≲ 3 here, and averages out over the sum p·v; measured errors are about
// 1.5u, so 4u.
template <typename S>
void check_half_forward(double u) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::rounded<S>(test::randn(c.qkv_size(), "qkv"));
    auto tqkv = test::to_dtype<S>(qkv);
    std::vector<S> out(c.out_size()), att(c.att_size());
    attention_forward(out.data(), att.data(), tqkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    Ref r = reference(qkv, c);
    EXPECT_LT(rel_err(out, r.out), 4 * u);
    EXPECT_LT(rel_err(att, r.att), 4 * u);
  }
}

TEST(Attention, HalfForwardAgainstReference) {
  check_half_forward<bf16>(0x1p-8);
  check_half_forward<f16>(0x1p-11);
}

// The half backward against the fp32 kernel on the same (rounded) inputs and saved
// probabilities: dprobs and dscores stay fp32, the three gradient products are rounded once
// (dk/dv are summed over a group's query heads in fp32 first): u each, 4u with margin.
template <typename S>
void check_half_backward(double u) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::rounded<S>(test::randn(c.qkv_size(), "qkv"));
    auto dy = test::rounded<S>(test::randn(c.out_size(), "dy"));
    auto tqkv = test::to_dtype<S>(qkv), tdy = test::to_dtype<S>(dy);
    std::vector<S> out(c.out_size()), att(c.att_size()), dqkv(c.qkv_size());
    std::vector<float> scratch(attention_backward_scratch_floats(c.B, c.T, c.NH, c.KVH, c.hd));
    attention_forward(out.data(), att.data(), tqkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    attention_backward(dqkv.data(), scratch.data(), tdy.data(), tqkv.data(), att.data(), c.B, c.T,
                       c.NH, c.KVH, c.hd);
    auto fatt = test::to_float(att);
    std::vector<float> fdqkv(c.qkv_size());
    attention_backward(fdqkv.data(), scratch.data(), dy.data(), qkv.data(), fatt.data(), c.B, c.T,
                       c.NH, c.KVH, c.hd);
    EXPECT_LT(rel_err(dqkv, fdqkv), 4 * u);
  }
}

TEST(Attention, HalfBackwardAgainstFp32) {
  check_half_backward<bf16>(0x1p-8);
  check_half_backward<f16>(0x1p-11);
}

TEST(Attention, Deterministic) {
  const Config c{2, 100, 4, 2, 16};
  auto qkv = test::randn(c.qkv_size(), "qkv"), dy = test::randn(c.out_size(), "dy");
  std::vector<float> scratch(attention_backward_scratch_floats(c.B, c.T, c.NH, c.KVH, c.hd));
  auto run = [&] {
    std::vector<float> out(c.out_size()), att(c.att_size()), dqkv(c.qkv_size());
    attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), att.data(), c.B, c.T,
                       c.NH, c.KVH, c.hd);
    out.insert(out.end(), att.begin(), att.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  EXPECT_TRUE(test::bit_equal(run(), run()));
}

TEST(Attention, RejectsHeadsNotMultipleOfKvHeads) {
  std::vector<float> buf(1000);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 4), Error);
}

// --- the tiled path (attention_tiled.h) ---------------------------------------------------------

// Besides kConfigs: several 64-row tiles with a partial last one, GQA over them, one token, and
// bench-23M's head size.
const Config kTiledConfigs[] = {{2, 5, 4, 4, 8},   {2, 6, 4, 2, 8},   {2, 5, 4, 1, 8},
                                {1, 9, 8, 2, 4},   {1, 70, 2, 1, 4},  {1, 130, 2, 2, 4},
                                {1, 1, 4, 2, 8},   {2, 1, 2, 2, 64},  {1, 200, 4, 2, 20},
                                {1, 64, 2, 1, 64}, {2, 129, 8, 8, 64}};

TEST(AttentionTiled, ForwardAgainstReference) {
  for (const Config& c : kTiledConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::randn(c.qkv_size(), "qkv");
    std::vector<float> out(c.out_size(), 7.0f), lse(c.lse_size(), 7.0f);
    attention_tiled_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    Ref r = reference(qkv, c);
    EXPECT_LT(rel_err(out, r.out), 1e-5);
    EXPECT_LT(rel_err(lse, r.lse), 1e-5);
    // The lse alone (selective recompute) is the same bits.
    std::vector<float> lse_only(c.lse_size(), 7.0f);
    attention_tiled_forward<float>(nullptr, lse_only.data(), qkv.data(), c.B, c.T, c.NH, c.KVH,
                                   c.hd);
    EXPECT_TRUE(test::bit_equal(lse, lse_only));
  }
}

// Both instruction sets' kernels: AVX-512 where the CPU has it, and AVX2.
template <typename F>
void on_each_isa(F&& f) {
  for (bool avx2 : {false, true}) {
    SCOPED_TRACE(avx2 ? "avx2" : "widest");
    attention_tiled_force_avx2(avx2);
    f();
  }
  attention_tiled_force_avx2(false);
}

TEST(AttentionTiled, MatchesMaterialized) {
  on_each_isa([] {
    for (const Config& c : kTiledConfigs) {
      SCOPED_TRACE(testing::Message() << c);
      auto qkv = test::randn(c.qkv_size(), "qkv"), dy = test::randn(c.out_size(), "dy");
      std::vector<float> out(c.out_size()), lse(c.lse_size()), dqkv(c.qkv_size(), 99.0f);
      attention_tiled_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), c.B, c.T, c.NH,
                               c.KVH, c.hd);
      std::vector<float> mout(c.out_size()), att(c.att_size()), mdqkv(c.qkv_size());
      std::vector<float> scratch(attention_backward_scratch_floats(c.B, c.T, c.NH, c.KVH, c.hd));
      attention_forward(mout.data(), att.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      attention_backward(mdqkv.data(), scratch.data(), dy.data(), qkv.data(), att.data(), c.B, c.T,
                         c.NH, c.KVH, c.hd);
      EXPECT_LT(rel_err(out, mout), 1e-5);
      EXPECT_LT(rel_err(dqkv, mdqkv), 1e-5);
    }
  });
}

TEST(AttentionTiled, BackwardMatchesFiniteDifferences) {
  for (const Config& c : kTiledConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::randn(c.qkv_size(), "qkv"), w = test::randn(c.out_size(), "w");
    std::vector<float> out(c.out_size()), lse(c.lse_size());
    auto loss = [&] {
      attention_tiled_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      return test::weighted_sum(w, out.data(), out.size());
    };
    loss();
    std::vector<float> dqkv(c.qkv_size(), 99.0f);
    attention_tiled_backward(dqkv.data(), w.data(), qkv.data(), lse.data(), c.B, c.T, c.NH, c.KVH,
                             c.hd);
    auto idx = test::sample_indices(qkv.size(), 100, "idx");
    EXPECT_LT(rel_err(test::gather(dqkv, idx), test::numeric_grad(qkv, loss, 1e-3f, idx)), 1e-2);
  }
}

// Half storage: q, k, v widen exactly and everything inside is fp32 (no rounding of the scores
// or probabilities, unlike the materialized path); the output is rounded once: u/2, so 2u.
// Backward against the fp32 kernel on the same rounded inputs and lse: each gradient rounded
// once, 2u.
template <typename S>
void check_tiled_half(double u) {
  for (const Config& c : kTiledConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::rounded<S>(test::randn(c.qkv_size(), "qkv"));
    auto dy = test::rounded<S>(test::randn(c.out_size(), "dy"));
    auto tqkv = test::to_dtype<S>(qkv), tdy = test::to_dtype<S>(dy);
    std::vector<S> out(c.out_size()), dqkv(c.qkv_size());
    std::vector<float> lse(c.lse_size()), flse(c.lse_size()), fout(c.out_size());
    attention_tiled_forward(out.data(), lse.data(), tqkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    Ref r = reference(qkv, c);
    EXPECT_LT(rel_err(out, r.out), 2 * u);
    attention_tiled_forward(fout.data(), flse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    EXPECT_TRUE(test::bit_equal(lse, flse));  // the same fp32 math on the same values
    attention_tiled_backward(dqkv.data(), tdy.data(), tqkv.data(), lse.data(), c.B, c.T, c.NH,
                             c.KVH, c.hd);
    std::vector<float> fdqkv(c.qkv_size());
    attention_tiled_backward(fdqkv.data(), dy.data(), qkv.data(), flse.data(), c.B, c.T, c.NH,
                             c.KVH, c.hd);
    EXPECT_LT(rel_err(dqkv, fdqkv), 2 * u);
  }
}

TEST(AttentionTiled, HalfAgainstReferenceAndFp32) {
  check_tiled_half<bf16>(0x1p-8);
  check_tiled_half<f16>(0x1p-11);
}

// Every output element is one thread's, in a fixed order: 1 and 2 threads give the same bits.
template <typename S>
void check_thread_counts() {
  const Config c{2, 150, 8, 4, 64};  // 16 forward tasks over 3 tiles, 8 backward tasks
  auto qkv = test::to_dtype<S>(test::randn(c.qkv_size(), "qkv"));
  auto dy = test::to_dtype<S>(test::randn(c.out_size(), "dy"));
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<S> out(c.out_size()), dqkv(c.qkv_size());
    std::vector<float> lse(c.lse_size());
    attention_tiled_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
    attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), c.B, c.T, c.NH, c.KVH,
                             c.hd);
    omp_set_num_threads(saved);
    std::vector<float> all = test::to_float(out);
    all.insert(all.end(), lse.begin(), lse.end());
    for (S x : dqkv) all.push_back(to_f32(x));
    return all;
  };
  const std::vector<float> one = run(1);
  EXPECT_TRUE(test::bit_equal(one, run(2)));
  EXPECT_TRUE(test::bit_equal(one, run(3)));
}

TEST(AttentionTiled, BitIdenticalAcrossThreadCounts) {
  on_each_isa([] {
    check_thread_counts<float>();
    check_thread_counts<bf16>();
    check_thread_counts<f16>();
  });
}

TEST(AttentionTiled, RejectsHeadsNotMultipleOfKvHeads) {
  std::vector<float> buf(1000);
  EXPECT_THROW(attention_tiled_forward(buf.data(), buf.data(), buf.data(), 1, 2, 3, 2, 4), Error);
}

// What the CPU keeps follows the path: tiled, a fp32 lse per query row (linear in T) and no
// caller scratch; materialized, the probabilities (B,heads,T,T) and their gradients.
TEST(AttentionTiled, SavedStateIsLinearInT) {
  for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
    set_attention_path(path);
    const bool tiled = path == AttentionPath::Tiled;
    for (int T : {64, 128, 1024}) {
      const ops::AttentionShape s{2, T, 3, 2, 8};  // 6 query heads
      const ops::AttentionSaved a = ops::attention_saved(Device::CPU, DType::BF16, s);
      EXPECT_EQ(a.dtype, tiled ? DType::F32 : DType::BF16);
      EXPECT_EQ(a.numel, tiled ? 2 * 6 * int64_t(T) : 2 * 6 * int64_t(T) * T);
      EXPECT_EQ(ops::attention_backward_scratch_floats(Device::CPU, DType::BF16, s) == 0, tiled);
    }
  }
  set_attention_path(std::nullopt);
  // Each thread's tiles grow by the same amount for every 64 more tokens.
  const size_t w1 = attention_tiled_workspace_floats(64, 64);
  const size_t w2 = attention_tiled_workspace_floats(128, 64);
  const size_t w4 = attention_tiled_workspace_floats(256, 64);
  EXPECT_EQ(w4 - w2, 2 * (w2 - w1));
  EXPECT_EQ(w2 - w1, size_t(5 * 64 * 64 + 2 * 64 * 64));
}

// Unforced, the path is the faster one measured (attention.cc): tiled for half storage at every T
// and for fp32 from T 128 on; the materialized path for fp32 below it.
TEST(AttentionTiled, DefaultIsTheMeasuredFasterPath) {
  if (const char* env = std::getenv("STRATA_ATTENTION"); env != nullptr && *env != '\0') {
    GTEST_SKIP() << "STRATA_ATTENTION=" << env << " decides every call";
  }
  EXPECT_EQ(attention_path(64, DType::F32), AttentionPath::Materialized);
  EXPECT_EQ(attention_path(127, DType::F32), AttentionPath::Materialized);
  EXPECT_EQ(attention_path(128, DType::F32), AttentionPath::Tiled);
  EXPECT_EQ(attention_path(4096, DType::F32), AttentionPath::Tiled);
  for (DType t : {DType::BF16, DType::F16}) {
    EXPECT_EQ(attention_path(1, t), AttentionPath::Tiled);
    EXPECT_EQ(attention_path(64, t), AttentionPath::Tiled);
  }
  set_attention_path(AttentionPath::Materialized);
  EXPECT_EQ(attention_path(4096, DType::BF16), AttentionPath::Materialized);
  set_attention_path(std::nullopt);
  EXPECT_EQ(attention_path(4096, DType::BF16), AttentionPath::Tiled);
}

// The op layer runs the chosen path end to end: att sized by attention_saved on each path gives
// the same output and gradients within fp32 rounding.
TEST(AttentionTiled, OpsFollowThePath) {
  const ops::AttentionShape s{2, 70, 2, 2, 8};
  const int64_t qkv_n = int64_t(s.B) * s.T * s.groups * (s.rep + 2) * s.hd;
  const int64_t out_n = int64_t(s.B) * s.T * s.groups * s.rep * s.hd;
  auto qkv = test::randn(size_t(qkv_n), "qkv"), dy = test::randn(size_t(out_n), "dy");
  std::vector<float> results[2];
  for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
    set_attention_path(path);
    const ops::AttentionSaved a = ops::attention_saved(Device::CPU, DType::F32, s);
    std::vector<float> att(size_t(a.numel)), out(static_cast<size_t>(out_n)),
        dqkv(static_cast<size_t>(qkv_n));
    std::vector<float> scratch(
        std::max<size_t>(1, ops::attention_backward_scratch_floats(Device::CPU, DType::F32, s)));
    const Tensor tq(qkv.data(), DType::F32, {qkv_n}), to(out.data(), DType::F32, {out_n});
    const Tensor ta(att.data(), DType::F32, {a.numel});
    ops::attention_forward(to, ta, tq, s);
    ops::attention_backward(Tensor(dqkv.data(), DType::F32, {qkv_n}),
                            Tensor(scratch.data(), DType::F32, {int64_t(scratch.size())}),
                            Tensor(dy.data(), DType::F32, {out_n}), tq, ta, s);
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    results[int(path)] = out;
  }
  set_attention_path(std::nullopt);
  EXPECT_LT(rel_err(results[0], results[1]), 1e-5);
}

}  // namespace
}  // namespace strata::kernels
