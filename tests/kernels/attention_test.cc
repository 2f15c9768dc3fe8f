#include "strata/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "strata/core/check.h"

namespace strata::kernels {
namespace {

using test::rel_err;

struct Config {
  int B, T, NH, KVH, hd;
  int64_t qkv_size() const { return int64_t(B) * T * (NH + 2 * KVH) * hd; }
  int64_t out_size() const { return int64_t(B) * T * NH * hd; }
  int64_t att_size() const { return int64_t(B) * NH * T * T; }
};

std::ostream& operator<<(std::ostream& os, const Config& c) {
  return os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " KVH=" << c.KVH << " hd=" << c.hd;
}

// MHA, GQA with two and four query heads per kv head (one group among them), and sequences
// longer than one query block (64).
const Config kConfigs[] = {{2, 5, 4, 4, 8}, {2, 6, 4, 2, 8},  {2, 5, 4, 1, 8},
                           {1, 9, 8, 2, 4}, {1, 70, 2, 1, 4}, {1, 130, 2, 2, 4}};

struct Ref {
  std::vector<double> out, att;
};

// Straightforward causal attention in double over the grouped layout: query head h = g·rep + r
// is at column (g·(rep+2) + r)·hd, and reads the group's key head at (g·(rep+2) + rep)·hd and
// value head at (g·(rep+2) + rep + 1)·hd.
Ref reference(const std::vector<float>& qkv, const Config& c) {
  const int64_t row = (c.NH + 2 * c.KVH) * c.hd;
  const int rep = c.NH / c.KVH;
  Ref r{std::vector<double>(c.out_size(), 0.0), std::vector<double>(c.att_size(), 0.0)};
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

}  // namespace
}  // namespace strata::kernels
