// A mixture of experts' ops (ops.h) against their formulas: the router's softmax, top-k and
// renormalisation; its backward (gates, balancing coefficients and z-loss) against central
// differences in double of the loss it differentiates; the plan's counts and positions, and token
// dropping by capacity under both policies; the combine and its backward as an adjoint pair; the
// grouped linear layers against one product per group, empty groups included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernel_test_util.h"
#include "strata/kernels/ops.h"

namespace strata::ops {
namespace {

using test::view;

constexpr int N = 24, E = 6, K = 2;

Tensor ids(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::I32, dims, Device::CPU);
}

struct Routed {
  std::vector<float> probs, lse, gates;
  std::vector<int32_t> top;
};

Routed route(std::vector<float> logits, bool norm) {
  Routed r{std::vector<float>(N * E), std::vector<float>(N), std::vector<float>(N * K),
           std::vector<int32_t>(N * K)};
  moe_route_forward(view(r.probs, {N, E}), view(r.lse, {N}), ids(r.top, {N, K}),
                    view(r.gates, {N, K}), view(logits, {N, E}), {E, K, norm});
  return r;
}

TEST(Moe, RouteIsSoftmaxTopKAndRenormalisation) {
  const std::vector<float> logits = test::randn(N * E, "moe logits", 2.0f);
  for (bool norm : {false, true}) {
    const Routed r = route(logits, norm);
    for (int n = 0; n < N; ++n) {
      double mx = -1e30, sum = 0;
      for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(n * E + e)]));
      for (int e = 0; e < E; ++e) sum += std::exp(double(logits[size_t(n * E + e)]) - mx);
      EXPECT_NEAR(r.lse[size_t(n)], mx + std::log(sum), 1e-5);
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return logits[size_t(n * E + a)] > logits[size_t(n * E + b)];
      });
      double chosen = 0;
      for (int j = 0; j < K; ++j) {
        chosen += std::exp(double(logits[size_t(n * E + order[size_t(j)])]) - mx) / sum;
      }
      for (int j = 0; j < K; ++j) {
        const int e = order[size_t(j)];
        EXPECT_EQ(r.top[size_t(n * K + j)], e);
        const double p = std::exp(double(logits[size_t(n * E + e)]) - mx) / sum;
        EXPECT_NEAR(r.probs[size_t(n * E + e)], p, 1e-6);
        EXPECT_NEAR(r.gates[size_t(n * K + j)], norm ? p / chosen : p, 1e-6);
      }
    }
  }
}

// loss = Σ w·gates + Σ_b Σ_e coef[b, e]·Σ_{n in b} probs[n, e] + z·Σ lse², whose gradient with
// respect to the logits moe_route_backward gives (the choices held fixed, as the loss sees them).
TEST(Moe, RouteBackwardIsTheGradient) {
  std::vector<float> logits = test::randn(N * E, "moe logits", 1.0f);
  const std::vector<float> w = test::randn(N * K, "moe dgates");
  std::vector<float> coef = test::randn(size_t(N / 8) * E, "moe coef", 0.3f);
  const float z = 0.05f;
  for (bool norm : {false, true}) {
    const Routed r = route(logits, norm);
    const auto loss = [&]() {
      double l = 0;
      for (int n = 0; n < N; ++n) {
        double mx = -1e30, sum = 0;
        for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(n * E + e)]));
        for (int e = 0; e < E; ++e) sum += std::exp(double(logits[size_t(n * E + e)]) - mx);
        const auto p = [&](int e) {
          return std::exp(double(logits[size_t(n * E + e)]) - mx) / sum;
        };
        double chosen = 0;
        for (int j = 0; j < K; ++j) chosen += p(r.top[size_t(n * K + j)]);
        for (int j = 0; j < K; ++j) {
          const double g = p(r.top[size_t(n * K + j)]);
          l += double(w[size_t(n * K + j)]) * (norm ? g / chosen : g);
        }
        for (int e = 0; e < E; ++e) l += double(coef[size_t(n / 8 * E + e)]) * p(e);
        const double lse = mx + std::log(sum);
        l += double(z) * lse * lse;
      }
      return l;
    };
    std::vector<float> d(N * E), dg = w;
    moe_route_backward(
        view(d, {N, E}), view(dg, {N, K}), view(const_cast<Routed&>(r).probs, {N, E}),
        view(const_cast<Routed&>(r).lse, {N}), ids(const_cast<Routed&>(r).top, {N, K}),
        view(const_cast<Routed&>(r).gates, {N, K}), view(coef, {N / 8, E}), 8, z, {E, K, norm});
    const std::vector<double> want = test::numeric_grad(logits, loss, 1e-3f);
    EXPECT_LT(test::rel_err(d, want), 2e-3) << (norm ? "renormalised" : "as they are");
  }
}

// DeepSeek-V3's router (transformers' DeepseekV3TopkRouter): scores sigmoid(logits), choices by
// score + bias among the topk_group groups whose two best choices sum highest, the other groups'
// choices counted 0; gates the chosen scores, renormalised (+1e-20), times the scaling factor.
// The reference below is written from that description, in double.
TEST(Moe, SigmoidRouteIsGroupLimitedTopKOfBiasedScores) {
  constexpr int G = 3, TG = 2;  // 3 groups of 2 experts, the best 2 kept
  const std::vector<float> logits = test::randn(N * E, "moe sigmoid logits", 2.0f);
  std::vector<float> bias = test::randn(E, "moe expert bias", 0.3f);
  for (bool norm : {false, true}) {
    Routed r{std::vector<float>(N * E), std::vector<float>(N), std::vector<float>(N * K),
             std::vector<int32_t>(N * K)};
    MoeRoute how{E, K, norm, true, G, TG, 2.5f};
    moe_route_forward(view(r.probs, {N, E}), view(r.lse, {N}), ids(r.top, {N, K}),
                      view(r.gates, {N, K}), view(const_cast<std::vector<float>&>(logits), {N, E}),
                      how, view(bias, {E}));
    for (int n = 0; n < N; ++n) {
      std::vector<double> s(E), c(E), value(G);
      for (int e = 0; e < E; ++e) {
        s[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[size_t(n * E + e)])));
        c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
        EXPECT_NEAR(r.probs[size_t(n * E + e)], s[size_t(e)], 1e-6);
      }
      for (int g = 0; g < G; ++g) {
        std::vector<double> in(c.begin() + g * (E / G), c.begin() + (g + 1) * (E / G));
        std::sort(in.rbegin(), in.rend());
        value[size_t(g)] = in[0] + in[1];
      }
      std::vector<int> groups(G);
      std::iota(groups.begin(), groups.end(), 0);
      std::stable_sort(groups.begin(), groups.end(),
                       [&](int a, int b) { return value[size_t(a)] > value[size_t(b)]; });
      std::vector<double> masked(E, 0.0);
      for (int j = 0; j < TG; ++j) {
        for (int e = groups[size_t(j)] * (E / G); e < (groups[size_t(j)] + 1) * (E / G); ++e) {
          masked[size_t(e)] = c[size_t(e)];
        }
      }
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return masked[size_t(a)] > masked[size_t(b)]; });
      double chosen = 1e-20;
      for (int j = 0; j < K; ++j) chosen += s[size_t(order[size_t(j)])];
      for (int j = 0; j < K; ++j) {
        const int e = order[size_t(j)];
        EXPECT_EQ(r.top[size_t(n * K + j)], e) << "row " << n;
        EXPECT_NEAR(r.gates[size_t(n * K + j)], 2.5 * (norm ? s[size_t(e)] / chosen : s[size_t(e)]),
                    1e-6);
      }
    }
  }
}

// loss = Σ w·gates of the sigmoid router, the choices held fixed: its gradient with respect to the
// logits (the bias takes none).
TEST(Moe, SigmoidRouteBackwardIsTheGradient) {
  std::vector<float> logits = test::randn(N * E, "moe sigmoid logits", 1.0f);
  const std::vector<float> w = test::randn(N * K, "moe dgates");
  for (bool norm : {false, true}) {
    Routed r{std::vector<float>(N * E), std::vector<float>(N), std::vector<float>(N * K),
             std::vector<int32_t>(N * K)};
    const MoeRoute how{E, K, norm, true, 2, 1, 1.5f};
    moe_route_forward(view(r.probs, {N, E}), view(r.lse, {N}), ids(r.top, {N, K}),
                      view(r.gates, {N, K}), view(logits, {N, E}), how);
    const auto loss = [&]() {
      double l = 0, chosen = 0;
      for (int n = 0; n < N; ++n) {
        const auto s = [&](int j) {
          return 1.0 / (1.0 + std::exp(-double(logits[size_t(n * E + r.top[size_t(n * K + j)])])));
        };
        chosen = 1e-20;
        for (int j = 0; j < K; ++j) chosen += s(j);
        for (int j = 0; j < K; ++j)
          l += double(w[size_t(n * K + j)]) * 1.5 * (norm ? s(j) / chosen : s(j));
      }
      return l;
    };
    std::vector<float> d(N * E), dg = w;
    moe_route_backward(view(d, {N, E}), view(dg, {N, K}), view(r.probs, {N, E}), view(r.lse, {N}),
                       ids(r.top, {N, K}), view(r.gates, {N, K}), Tensor(), 1, 0.0f, how);
    const std::vector<double> want = test::numeric_grad(logits, loss, 1e-3f);
    EXPECT_LT(test::rel_err(d, want), 2e-3) << (norm ? "renormalised" : "as they are");
  }
}

// DeepSeek-V3's sequence-wise balancing: loss = Σ_b Σ_e coef[b, e] · Σ_{n in b} s'_{n,e}, s' each
// row's scores over their sum (+1e-20): moe_balance_stats' normalised sums, and the gradient
// moe_route_backward adds for coef (beside the gates'), against finite differences.
TEST(Moe, SigmoidSequenceBalancingIsTheGradient) {
  const int T = N / 2;  // two sequences
  std::vector<float> logits = test::randn(N * E, "moe sigmoid balance logits", 1.0f);
  const std::vector<float> coef = test::randn(2 * E, "moe sigmoid coef", 0.5f);
  const MoeRoute how{E, K, true, true, 2, 1, 1.0f};
  Routed r{std::vector<float>(N * E), std::vector<float>(N), std::vector<float>(N * K),
           std::vector<int32_t>(N * K)};
  moe_route_forward(view(r.probs, {N, E}), view(r.lse, {N}), ids(r.top, {N, K}),
                    view(r.gates, {N, K}), view(logits, {N, E}), how);
  const auto normalised = [&](int n, int e) {
    double total = 1e-20;
    for (int x = 0; x < E; ++x) total += 1.0 / (1.0 + std::exp(-double(logits[size_t(n * E + x)])));
    return 1.0 / (1.0 + std::exp(-double(logits[size_t(n * E + e)]))) / total;
  };
  std::vector<float> stats(2 * 2 * E);
  moe_balance_stats(view(stats, {2, 2, E}), view(r.probs, {N, E}), ids(r.top, {N, K}), T, true);
  for (int b = 0; b < 2; ++b) {
    for (int e = 0; e < E; ++e) {
      double want = 0;
      for (int n = b * T; n < (b + 1) * T; ++n) want += normalised(n, e);
      EXPECT_NEAR(stats[size_t(b * 2 * E + E + e)], want, 1e-5) << b << "," << e;
    }
  }
  const auto loss = [&]() {
    double l = 0;
    for (int n = 0; n < N; ++n) {
      for (int e = 0; e < E; ++e) l += double(coef[size_t(n / T * E + e)]) * normalised(n, e);
    }
    return l;
  };
  std::vector<float> d(N * E), dg(N * K, 0.0f), c = coef;
  moe_route_backward(view(d, {N, E}), view(dg, {N, K}), view(r.probs, {N, E}), view(r.lse, {N}),
                     ids(r.top, {N, K}), view(r.gates, {N, K}), view(c, {2, E}), T, 0.0f, how);
  const std::vector<double> want = test::numeric_grad(logits, loss, 1e-3f);
  EXPECT_LT(test::rel_err(d, want), 2e-3);
}

TEST(Moe, PlanSortsByExpertAndDropsBeyondCapacity) {
  const std::vector<float> logits = test::randn(N * E, "moe plan logits", 2.0f);
  Routed r = route(logits, true);
  for (int64_t cap : {int64_t(0), int64_t(3)}) {
    for (bool by_probs : {true, false}) {
      std::vector<int32_t> counts(E), pos(N * K), rows(N * K);
      moe_plan(ids(counts, {E}), ids(pos, {N, K}), ids(rows, {N * K}), ids(r.top, {N, K}),
               view(r.probs, {N, E}), E, {cap, 8, by_probs});
      int64_t kept = 0;
      for (int e = 0; e < E; ++e) kept += counts[size_t(e)];
      int64_t dropped = 0;
      for (int i = 0; i < N * K; ++i) {
        if (pos[size_t(i)] < 0) {
          ++dropped;
          continue;
        }
        EXPECT_EQ(rows[size_t(pos[size_t(i)])], i / K);  // the row holds its token
        // Rows are grouped by expert, in expert order.
        int before = 0;
        for (int e = 0; e < r.top[size_t(i)]; ++e) before += counts[size_t(e)];
        EXPECT_GE(pos[size_t(i)], before);
        EXPECT_LT(pos[size_t(i)], before + counts[size_t(r.top[size_t(i)])]);
      }
      EXPECT_EQ(kept + dropped, N * K);
      if (cap == 0) {
        EXPECT_EQ(dropped, 0);
        continue;
      }
      EXPECT_GT(dropped, 0);
      // Per group of 8 rows and expert: at most cap kept; each dropped choice loses to every kept
      // one of its expert by probability (or comes after them).
      for (int g = 0; g < N / 8; ++g) {
        for (int e = 0; e < E; ++e) {
          std::vector<int> kept_i, dropped_i;
          for (int i = g * 8 * K; i < (g + 1) * 8 * K; ++i) {
            if (r.top[size_t(i)] != e) continue;
            (pos[size_t(i)] < 0 ? dropped_i : kept_i).push_back(i);
          }
          EXPECT_LE(int64_t(kept_i.size()), cap);
          if (!dropped_i.empty()) {
            EXPECT_EQ(int64_t(kept_i.size()), cap);
          }
          for (int d : dropped_i) {
            for (int k : kept_i) {
              if (by_probs) {
                EXPECT_GE(r.probs[size_t(k / K * E + e)], r.probs[size_t(d / K * E + e)]);
              } else {
                EXPECT_LT(k, d);
              }
            }
          }
        }
      }
    }
  }
}

// <combine(y), dout> = <y, combine_backward(dout)> for the rows, and dw the gates' gradient.
TEST(Moe, CombineAndItsBackwardAreAdjoint) {
  constexpr int C = 5;
  Routed r = route(test::randn(N * E, "moe combine logits", 2.0f), false);
  std::vector<int32_t> counts(E), pos(N * K), rows(N * K);
  moe_plan(ids(counts, {E}), ids(pos, {N, K}), ids(rows, {N * K}), ids(r.top, {N, K}),
           view(r.probs, {N, E}), E, {2, 8, true});
  std::vector<float> y = test::randn(N * K * C, "moe y"), dout = test::randn(N * C, "moe dout");
  std::vector<float> out(N * C), dy(N * K * C, 0.0f), dw(N * K);
  moe_combine(view(out, {N, C}), view(y, {N * K, C}), ids(pos, {N, K}), view(r.gates, {N, K}));
  moe_combine_backward(view(dy, {N * K, C}), view(dw, {N, K}), view(dout, {N, C}),
                       view(y, {N * K, C}), ids(pos, {N, K}), view(r.gates, {N, K}));
  double lhs = 0, rhs = 0;
  for (int i = 0; i < N * C; ++i) lhs += double(out[size_t(i)]) * dout[size_t(i)];
  for (int i = 0; i < N * K * C; ++i) rhs += double(y[size_t(i)]) * dy[size_t(i)];
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < K; ++j) {
      const int at = pos[size_t(n * K + j)];
      double dot = 0;
      for (int c = 0; c < C && at >= 0; ++c)
        dot += double(dout[size_t(n * C + c)]) * y[size_t(at * C + c)];
      EXPECT_NEAR(dw[size_t(n * K + j)], dot, 1e-5);
    }
  }
}

TEST(Moe, GroupedLinearIsOneProductPerGroup) {
  constexpr int Kin = 7, Nout = 5, G = 4;
  const int64_t counts[G] = {3, 0, 6, 1};
  constexpr int R = 10;
  std::vector<float> x = test::randn(R * Kin, "grouped x"),
                     w = test::randn(G * Nout * Kin, "grouped w");
  std::vector<float> y(R * Nout), dy = test::randn(R * Nout, "grouped dy"), dx(R * Kin);
  std::vector<float> dw(G * Nout * Kin, 0.5f);
  grouped_linear_forward(view(y, {R, Nout}), view(x, {R, Kin}), view(w, {G * Nout, Kin}), counts,
                         G);
  grouped_linear_backward_input(view(dx, {R, Kin}), view(dy, {R, Nout}), view(w, {G * Nout, Kin}),
                                counts, G);
  grouped_linear_backward_weight(view(dw, {G * Nout, Kin}), view(dy, {R, Nout}), view(x, {R, Kin}),
                                 counts, G);
  for (int g = 0, r0 = 0; g < G; r0 += int(counts[g++])) {
    for (int r = r0; r < r0 + counts[g]; ++r) {
      for (int o = 0; o < Nout; ++o) {
        double v = 0;
        for (int i = 0; i < Kin; ++i)
          v += double(x[size_t(r * Kin + i)]) * w[size_t((g * Nout + o) * Kin + i)];
        EXPECT_NEAR(y[size_t(r * Nout + o)], v, 1e-5);
      }
      for (int i = 0; i < Kin; ++i) {
        double v = 0;
        for (int o = 0; o < Nout; ++o)
          v += double(dy[size_t(r * Nout + o)]) * w[size_t((g * Nout + o) * Kin + i)];
        EXPECT_NEAR(dx[size_t(r * Kin + i)], v, 1e-5);
      }
    }
    for (int o = 0; o < Nout; ++o) {
      for (int i = 0; i < Kin; ++i) {
        double v = 0.5;  // accumulated onto
        for (int r = r0; r < r0 + counts[g]; ++r)
          v += double(dy[size_t(r * Nout + o)]) * x[size_t(r * Kin + i)];
        EXPECT_NEAR(dw[size_t((g * Nout + o) * Kin + i)], v, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace strata::ops
