// Document masking (ops::AttentionShape::doc_begin, the position ops' doc_begin) on the GPU against
// the CPU backend, each reading the document starts from its own device: attention forward (out
// and the saved log-sum-exp, the CPU on its tiled path so that it keeps the same state) and
// backward, plain and with a window and a soft cap, head dims 64 and 128, documents starting on
// and off the 32- and 64-row tiles, one-row documents; RoPE forward and backward; the position
// table's forward and backward from a sequence-parallel shard's first row (pos0).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"
#include "tests/kernels/kernel_test_util.h"

namespace strata::gpu_test {
namespace {

using test::doc_begin;

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

struct Case {
  ops::AttentionShape s;  // {B, T, groups, rep, hd} and the scores
  std::vector<std::vector<int>> starts;
};

std::vector<Case> cases() {
  std::vector<Case> c = {
      {{2, 150, 2, 2, 64}, {{0, 37, 100, 101}, {0, 64, 128}}},
      {{1, 200, 2, 4, 128}, {{0, 63, 65, 199}}},
      {{2, 77, 4, 1, 64}, {{0, 10, 40}, {0}}},
      {{1, 130, 1, 2, 128}, {{0, 32, 96, 97}}},
  };
  c[2].s.window = 20, c[2].s.softcap = 5.0f;
  c[3].s.window = 40, c[3].s.scale = 0.2f;
  return c;
}

std::string describe(const ops::AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " groups=" + std::to_string(s.groups) + " rep=" + std::to_string(s.rep) +
         " hd=" + std::to_string(s.hd) + " window=" + std::to_string(s.window);
}

class GpuDocuments : public ::testing::TestWithParam<DType> {};

// out, the lse and dqkv against the CPU's tiled path, each backward reading its own forward's
// lse.
TEST_P(GpuDocuments, AttentionAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  kernels::set_attention_path(kernels::AttentionPath::Tiled);
  for (const Case& c : cases()) {
    SCOPED_TRACE(describe(c.s));
    const int64_t BT = int64_t(c.s.B) * c.s.T, row = int64_t(c.s.groups) * (c.s.rep + 2) * c.s.hd;
    const int64_t orow = int64_t(c.s.groups) * c.s.rep * c.s.hd;
    const std::vector<int32_t> docs = doc_begin(c.s.T, c.starts);
    const auto qkv = random(size_t(BT * row), 61, 1.5f), dout = random(size_t(BT * orow), 62);
    auto run = [&](Device d) {
      auto dv = make_tokens(d, {BT}, docs);
      ops::AttentionShape s = c.s;
      s.doc_begin = static_cast<const int32_t*>(dv->t.data), s.seq = c.s.T;
      const ops::AttentionSaved a = ops::attention_saved(d, dt, s);
      auto q = make(d, dt, {BT, row}, qkv), dy = make(d, dt, {BT, orow}, dout);
      auto out = make(d, dt, {BT, orow}, random(size_t(BT * orow), 63, 9.0f));
      auto att = make(d, a.dtype, {a.numel}, random(size_t(a.numel), 64, 9.0f));
      auto scratch = make(d, DType::F32, {1}, {0.0f});
      auto dq = make(d, dt, {BT, row}, random(size_t(BT * row), 65, 9.0f));
      ops::attention_forward(out->t, att->t, q->t, s);
      ops::attention_backward(dq->t, scratch->t, dy->t, q->t, att->t, s);
      return std::vector{values(out->t), values(att->t), values(dq->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(dt))) << "out";
    EXPECT_TRUE(close(got[1], want[1], tolerance(dt))) << "lse";
    EXPECT_TRUE(close(got[2], want[2], tolerance(dt))) << "dqkv";
  }
  kernels::set_attention_path(std::nullopt);
}

// Each row rotates by its position in its document. fp32 within 1e-4, as GpuRope: cos and sin may
// round apart on the two sides.
TEST_P(GpuDocuments, RopeAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-4 : tolerance(dt);
  const ops::AttentionShape shape{2, 100, 2, 2, 64};
  const ops::Rope rope = ops::rope_default(64, 10000.0f);
  const std::vector<int32_t> docs = doc_begin(100, {{0, 1, 50}, {0, 99}});
  const int64_t BT = 200, row = 2 * 4 * 64;
  const auto qkv = random(size_t(BT * row), 66), dqkv = random(size_t(BT * row), 67);
  auto run = [&](Device d) {
    auto dv = make_tokens(d, {BT}, docs);
    ops::AttentionShape s = shape;
    s.doc_begin = static_cast<const int32_t*>(dv->t.data), s.seq = 100;
    auto x = make(d, dt, {BT, row}, qkv), dx = make(d, dt, {BT, row}, dqkv);
    ops::rope_forward(x->t, s, rope);
    ops::rope_backward(dx->t, s, rope);
    return std::pair{values(x->t), values(dx->t)};
  };
  const auto [got_x, got_dx] = run(kGpu);
  const auto [want_x, want_dx] = run(kCpu);
  EXPECT_TRUE(close(got_x, want_x, tol)) << "forward";
  EXPECT_TRUE(close(got_dx, want_dx, tol)) << "backward";
}

// Rows 37.. of sequences of 100 (a shard of a sequence-parallel rank, crossing into the second
// sequence) take the table's row of their position in their document: exact.
TEST_P(GpuDocuments, PositionForwardAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t T = 100, pos0 = 37, N = 150, C = 96;
  const std::vector<int32_t> docs = doc_begin(100, {{0, 20, 60}, {0, 1, 2, 90}});
  const auto wpe = random(size_t(T * C), 68), out0 = random(size_t(N * C), 69);
  auto run = [&](Device d) {
    auto dv = make_tokens(d, {2 * T}, docs);
    auto w = make(d, dt, {T, C}, wpe), out = make(d, dt, {N, C}, out0);
    ops::position_forward(out->t, w->t, T, pos0, nullptr, static_cast<const int32_t*>(dv->t.data),
                          T);
    return values(out->t);
  };
  EXPECT_TRUE(close(run(kGpu), run(kCpu), 0.0));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuDocuments,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

class GpuDocumentGrads : public ::testing::TestWithParam<SG> {};

// dwpe += each table row's rows of dout, summed in fp32 in increasing row and added once, as the
// CPU; only the rows some row reaches change.
TEST_P(GpuDocumentGrads, PositionBackwardAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  const int64_t T = 100, pos0 = 37, N = 150, C = 96;
  const std::vector<int32_t> docs = doc_begin(100, {{0, 20, 60}, {0, 1, 2, 90}});
  const auto dout = random(size_t(N * C), 70), dwpe0 = random(size_t(T * C), 71);
  auto run = [&](Device d) {
    auto dv = make_tokens(d, {2 * T}, docs);
    auto dy = make(d, sg.s, {N, C}, dout), dwpe = make(d, sg.g, {T, C}, dwpe0);
    ops::position_backward(dwpe->t, dy->t, T, pos0, nullptr,
                           static_cast<const int32_t*>(dv->t.data), T);
    return values(dwpe->t);
  };
  EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(sg.g)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuDocumentGrads, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
