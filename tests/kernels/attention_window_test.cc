// Scale, soft cap and sliding window (ops::AttentionShape; kernels::AttentionScores) on both CPU
// attention paths, through the op layer, against a double-precision reference with its own
// analytic backward.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/cpu/attention_tiled.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using test::rel_err;

struct Case {
  int B, T, NH, KVH, hd;
  float scale, softcap;
  int window;
  bool with_pos;  // rows at increasing positions with gaps (context parallelism's)
  int64_t qkv_size() const { return int64_t(B) * T * (NH + 2 * KVH) * hd; }
  int64_t out_size() const { return int64_t(B) * T * NH * hd; }
  int64_t lse_size() const { return int64_t(B) * NH * T; }
  ops::AttentionShape shape(const int32_t* pos) const {
    ops::AttentionShape s{B, T, KVH, NH / KVH, hd};
    s.scale = scale, s.softcap = softcap, s.window = window, s.pos = with_pos ? pos : nullptr;
    return s;
  }
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " KVH=" << c.KVH << " hd=" << c.hd
            << " scale=" << c.scale << " softcap=" << c.softcap << " window=" << c.window
            << (c.with_pos ? " pos" : "");
}

// A covering design rather than the cross product: each value of each setting appears (window 0,
// 1, small, one tile, wider than a tile, >= T; softcap 0 and 5 with scores well past it; scale 0
// and 0.3; MHA and GQA with 2 and 4 query heads per kv head; one tile, several, a partial last one;
// positions with gaps), and the settings that interact meet: window with cap, with scale, with
// GQA, with positions, across tile boundaries; cap with scale and with GQA.
const Case kCases[] = {
    {2, 70, 4, 2, 16, 0.0f, 0.0f, 3, false},    // small window over a tile boundary, GQA
    {1, 70, 2, 2, 16, 0.3f, 5.0f, 0, false},    // scale and cap, no window, MHA
    {1, 150, 4, 1, 16, 0.0f, 5.0f, 70, false},  // a window wider than a tile, rep 4
    {2, 9, 4, 2, 8, 0.3f, 0.0f, 20, false},     // window >= T: plain causal
    {1, 130, 4, 2, 8, 0.3f, 5.0f, 7, true},     // all three, positions with gaps
    {1, 66, 2, 1, 24, 0.0f, 0.0f, 1, false},    // each query sees itself only
    {1, 200, 2, 2, 16, 0.0f, 5.0f, 64, true},   // window of one tile, cap, positions
};

// The positions of case rows: gaps of 1 or 2 and a jump of 5 in the middle, increasing.
std::vector<int32_t> positions(int T) {
  std::vector<int32_t> p(T);
  for (int t = 0; t < T; ++t) p[t] = t + t / 3 + (t >= T / 2 ? 5 : 0);
  return p;
}

struct Ref {
  std::vector<double> out, lse, dqkv;
};

// Attention in double, one row at a time: u_j = scale·q·k_j, s_j = cap·tanh(u_j/cap) (or u_j),
// over the keys j <= t with pos(t) − pos(j) < window; the backward of the loss Σ dy·out by hand.
Ref reference(const std::vector<float>& qkv, const std::vector<float>& dy, const Case& c,
              const int32_t* pos) {
  const int rep = c.NH / c.KVH;
  const int64_t row = int64_t(c.NH + 2 * c.KVH) * c.hd, orow = int64_t(c.NH) * c.hd;
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(double(c.hd));
  Ref r{std::vector<double>(c.out_size(), 0.0), std::vector<double>(c.lse_size(), 0.0),
        std::vector<double>(c.qkv_size(), 0.0)};
  std::vector<double> u(c.T), p(c.T);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h)
      for (int t = 0; t < c.T; ++t) {
        const int g = h / rep;
        const int64_t qc = (g * (rep + 2) + h % rep) * c.hd, kc = (g * (rep + 2) + rep) * c.hd;
        auto at = [&](int i) { return int64_t(b) * c.T + i; };
        auto P = [&](int i) { return c.with_pos ? pos[i] : i; };
        const int j0 = [&] {
          int j = 0;
          while (c.window > 0 && P(t) - P(j) >= c.window) ++j;
          return j;
        }();
        double mx = -1e300, sum = 0.0;
        for (int j = j0; j <= t; ++j) {
          double d = 0.0;
          for (int e = 0; e < c.hd; ++e)
            d += double(qkv[at(t) * row + qc + e]) * qkv[at(j) * row + kc + e];
          u[j] = scale * d;
          const double s = c.softcap > 0.0f ? c.softcap * std::tanh(u[j] / c.softcap) : u[j];
          p[j] = s;
          mx = std::max(mx, s);
        }
        for (int j = j0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
        r.lse[(int64_t(b) * c.NH + h) * c.T + t] = mx + std::log(sum);
        const float* dyt = &dy[at(t) * orow + h * c.hd];
        double D = 0.0;
        std::vector<double> dp(c.T, 0.0);
        for (int j = j0; j <= t; ++j) {
          p[j] /= sum;
          const float* v = &qkv[at(j) * row + kc + c.hd];
          for (int e = 0; e < c.hd; ++e) {
            r.out[at(t) * orow + h * c.hd + e] += p[j] * v[e];
            dp[j] += double(dyt[e]) * v[e];
          }
          D += p[j] * dp[j];
        }
        for (int j = j0; j <= t; ++j) {
          double du = p[j] * (dp[j] - D);
          if (c.softcap > 0.0f) du *= 1.0 - std::pow(std::tanh(u[j] / c.softcap), 2);
          for (int e = 0; e < c.hd; ++e) {
            r.dqkv[at(t) * row + qc + e] += scale * du * qkv[at(j) * row + kc + e];
            r.dqkv[at(j) * row + kc + e] += scale * du * qkv[at(t) * row + qc + e];
            r.dqkv[at(j) * row + kc + c.hd + e] += p[j] * dyt[e];
          }
        }
      }
  return r;
}

// One path's forward (out, and att: the lse on the tiled path) and backward through the op layer.
template <typename S>
struct Results {
  std::vector<S> out, dqkv;
  std::vector<float> att;
};

template <typename S>
Results<S> run_ops(AttentionPath path, const Case& c, const std::vector<S>& qkv,
                   const std::vector<S>& dy, const int32_t* pos) {
  set_attention_path(path);
  constexpr DType dt = dtype_of<S>();
  const ops::AttentionShape s = c.shape(pos);
  const ops::AttentionSaved a = ops::attention_saved(Device::CPU, dt, s);
  Results<S> r{std::vector<S>(c.out_size()), std::vector<S>(c.qkv_size()),
               std::vector<float>(size_t(a.numel))};
  std::vector<S> att(size_t(a.numel));
  std::vector<float> scratch(
      std::max<size_t>(1, ops::attention_backward_scratch_floats(Device::CPU, dt, s)));
  const Tensor tq(const_cast<S*>(qkv.data()), dt, {c.qkv_size()});
  const Tensor ta = a.dtype == DType::F32 ? Tensor(r.att.data(), DType::F32, {a.numel})
                                          : Tensor(att.data(), dt, {a.numel});
  ops::attention_forward(Tensor(r.out.data(), dt, {c.out_size()}), ta, tq, s);
  ops::attention_backward(Tensor(r.dqkv.data(), dt, {c.qkv_size()}),
                          Tensor(scratch.data(), DType::F32, {int64_t(scratch.size())}),
                          Tensor(const_cast<S*>(dy.data()), dt, {c.out_size()}), tq, ta, s);
  set_attention_path(std::nullopt);
  return r;
}

// fp32 on both paths within 1e-5 of the reference (the lse too, on the tiled path); the inputs'
// scale 2 puts the raw scores (std about 2·2·sqrt(hd)·scale, 5 and more) where tanh bends.
TEST(AttentionWindow, BothPathsAgainstReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c);
    const std::vector<int32_t> pos = positions(c.T);
    auto qkv = test::randn(c.qkv_size(), "qkv", 2.0f), dy = test::randn(c.out_size(), "dy");
    const Ref ref = reference(qkv, dy, c, pos.data());
    for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
      SCOPED_TRACE(attention_path_name(path));
      const Results<float> r = run_ops(path, c, qkv, dy, pos.data());
      EXPECT_LT(rel_err(r.out, ref.out), 1e-5);
      EXPECT_LT(rel_err(r.dqkv, ref.dqkv), 1e-5);
      if (path == AttentionPath::Tiled) {
        EXPECT_LT(rel_err(r.att, ref.lse), 1e-5);
      }
    }
  }
}

// The reference is not blind to the settings: each case's window, cap or scale changes the result
// well past the tolerance above (so a kernel that ignored one would fail).
TEST(AttentionWindow, SettingsChangeTheReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c);
    const std::vector<int32_t> pos = positions(c.T);
    auto qkv = test::randn(c.qkv_size(), "qkv", 2.0f), dy = test::randn(c.out_size(), "dy");
    const Ref ref = reference(qkv, dy, c, pos.data());
    auto differs = [&](Case other) {
      return rel_err(reference(qkv, dy, other, pos.data()).out, ref.out) > 1e-2;
    };
    Case no_window = c, no_cap = c, no_scale = c;
    no_window.window = 0, no_cap.softcap = 0.0f, no_scale.scale = 0.0f;
    if (c.window > 0 && c.window < c.T) {
      EXPECT_TRUE(differs(no_window));
    }
    if (c.softcap > 0.0f) {
      EXPECT_TRUE(differs(no_cap));
    }
    if (c.scale != 0.0f) {
      EXPECT_TRUE(differs(no_scale));
    }
  }
}

// Half storage, loosely: the materialized path rounds the scores (and their cap) to S before the
// softmax; the tiled path only the inputs and outputs. Inputs of scale 1 keep the scores' rounding
// (u·|s|) small; measured at most 7e-3 for bf16 on both paths, so 2e-2.
TEST(AttentionWindow, Bf16AgainstReference) {
  for (const Case& c : {kCases[0], kCases[2], kCases[4]}) {
    SCOPED_TRACE(testing::Message() << c);
    const std::vector<int32_t> pos = positions(c.T);
    auto qkv = test::rounded<bf16>(test::randn(c.qkv_size(), "qkv"));
    auto dy = test::rounded<bf16>(test::randn(c.out_size(), "dy"));
    const Ref ref = reference(qkv, dy, c, pos.data());
    for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
      SCOPED_TRACE(attention_path_name(path));
      const Results<bf16> r =
          run_ops(path, c, test::to_dtype<bf16>(qkv), test::to_dtype<bf16>(dy), pos.data());
      EXPECT_LT(rel_err(r.out, ref.out), 2e-2);
      EXPECT_LT(rel_err(r.dqkv, ref.dqkv), 2e-2);
    }
  }
}

// The tiled path neither computes nor masks the key tiles outside every window of a query tile:
// keys and values 0..63 set to NaN reach only the query tiles whose windows hold one of them (with
// window 3, queries 0..65, in tiles 0 and 1), and every later row's output and query gradient are
// the reference's. A kernel that computed those tiles and masked them would spread the NaN (0·NaN).
TEST(AttentionWindow, TiledSkipsTilesOutsideTheWindow) {
  const Case c{1, 256, 2, 1, 16, 0.0f, 0.0f, 3, false};
  auto qkv = test::randn(c.qkv_size(), "qkv"), dy = test::randn(c.out_size(), "dy");
  const Ref ref = reference(qkv, dy, c, nullptr);
  const int64_t row = int64_t(c.NH + 2 * c.KVH) * c.hd, orow = int64_t(c.NH) * c.hd;
  for (int t = 0; t < 64; ++t) {
    for (int e = 0; e < 2 * c.hd; ++e) {
      qkv[t * row + c.NH * c.hd + e] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const Results<float> r = run_ops(AttentionPath::Tiled, c, qkv, dy, nullptr);
  std::vector<float> out(r.out.begin() + 128 * orow, r.out.end()), dq;
  std::vector<double> ref_out(ref.out.begin() + 128 * orow, ref.out.end()), ref_dq;
  for (int t = 128; t < c.T; ++t) {
    for (int e = 0; e < c.NH * c.hd; ++e) {
      dq.push_back(r.dqkv[t * row + e]);
      ref_dq.push_back(ref.dqkv[t * row + e]);
    }
  }
  EXPECT_LT(rel_err(out, ref_out), 1e-5);  // NaN compares false: fails the check
  EXPECT_LT(rel_err(dq, ref_dq), 1e-5);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  for (float x : dq) ASSERT_TRUE(std::isfinite(x));
}

// The defaults are today's attention bit for bit: scale 0 is 1/sqrt(hd) (given explicitly, the
// same float), and a window of T or more is plain causal attention on either path.
TEST(AttentionWindow, DefaultsAreUnchanged) {
  const Case plain{2, 100, 4, 2, 16, 0.0f, 0.0f, 0, false};
  Case same = plain;
  same.scale = 1.0f / std::sqrt(16.0f), same.window = 100;
  auto qkv = test::randn(plain.qkv_size(), "qkv"), dy = test::randn(plain.out_size(), "dy");
  for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
    SCOPED_TRACE(attention_path_name(path));
    const Results<float> a = run_ops(path, plain, qkv, dy, nullptr);
    const Results<float> b = run_ops(path, same, qkv, dy, nullptr);
    EXPECT_TRUE(test::bit_equal(a.out, b.out));
    EXPECT_TRUE(test::bit_equal(a.dqkv, b.dqkv));
  }
}

TEST(AttentionWindow, RejectsBadSettings) {
  std::vector<float> buf(10000);
  const Tensor t(buf.data(), DType::F32, {int64_t(buf.size())});
  ops::AttentionShape s{1, 4, 1, 1, 8};
  const int64_t qkv_n = 4 * 3 * 8;
  const Tensor qkv = t.slice0(0, qkv_n), out = t.slice0(0, 32);
  set_attention_path(AttentionPath::Tiled);  // att: the 4 rows' lse
  s.window = 2;
  ops::attention_forward(out, t.slice0(0, 4), qkv, s);
  s.window = -1;
  EXPECT_THROW(ops::attention_forward(out, t.slice0(0, 4), qkv, s), Error);
  s.window = 2;
  const int32_t unordered[4] = {0, 2, 1, 3};
  s.pos = unordered;
  EXPECT_THROW(ops::attention_forward(out, t.slice0(0, 4), qkv, s), Error);
  set_attention_path(std::nullopt);
}

}  // namespace
}  // namespace strata::kernels
