// The cross-entropies and the optimizer steps on the GPU against the CPU backend: the serial
// forms, the two-halves training form (statistics, then dlogits a column range at a time, in
// place or into fp32), the vocabulary-parallel steps across shards with padding and ignored
// targets, each without and with Gemma 2's final-logit soft cap (softcap_inplace, and ce_dlogits'
// factor 1 − (z/cap)²), and Adam/AdamW and SGD over every (parameter, gradient) dtype pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

// --- cross-entropy -------------------------------------------------------------------------------

constexpr int64_t kN = 64, kV = 5000;
// dloss = a loss scale of 2^16 over 16 counted tokens. It makes the dlogits O(1) (softmax·dloss,
// softmax ~ 1/V), so that the bounds, relative to max(|want|, 1), resolve them.
constexpr float kDloss = 4096.0f;
// A cap the logits (in [−3, 3]) feel: ce_dlogits' factor 1 − (z/cap)² goes down to 0.44.
constexpr float kCap = 4.0f;

std::vector<float> ce_logits() {
  return random(kN * kV, 1, 3.0f);
}

// Targets over the vocabulary; two ignored rows (−1, −100), the first and the last column, and
// column 1700 (the first of the second shard below).
std::vector<int32_t> ce_targets() {
  const auto u = random(kN, 2);
  std::vector<int32_t> t(kN);
  for (int64_t n = 0; n < kN; ++n) t[n] = int32_t((u[n] + 1.0f) * 0.5f * (kV - 1));
  t[5] = -1;
  t[9] = -100;
  t[2] = int32_t(kV - 1);
  t[3] = 0;
  t[7] = 1700;
  return t;
}

// v rounded to dtype t (through a CPU tensor), as an fp32 vector.
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return values(make(kCpu, t, {int64_t(v.size())}, v)->t);
}

class GpuCrossEntropy : public ::testing::TestWithParam<DType> {};

// Evaluation: losses (fp32, ignored rows 0) against the CPU's, logits left as they were.
TEST_P(GpuCrossEntropy, Forward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto x = ce_logits();
  const auto targets = ce_targets();
  auto run = [&](Device d) {
    auto logits = make(d, dt, {kN, kV}, x), t = make_tokens(d, {kN}, targets);
    auto losses = make(d, DType::F32, {kN}, random(kN, 3, 9.0f));
    ops::cross_entropy_forward(losses->t, logits->t, t->t);
    return std::pair{values(losses->t), values(logits->t)};
  };
  const auto [losses, logits] = run(kGpu);
  EXPECT_TRUE(close(losses, run(kCpu).first, tolerance(DType::F32)));
  EXPECT_TRUE(close(logits, rounded(x, dt), 0.0)) << "the logits changed";
}

// The soft cap in place on an odd number of elements from an odd offset (packs cut at both ends),
// large values saturated, against the CPU's.
TEST_P(GpuCrossEntropy, Softcap) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t n = 100003;
  const auto x = random(n, 10, 40.0f);
  auto run = [&](Device d) {
    auto t = make(d, dt, {n}, x);
    const Tensor tail(static_cast<char*>(t->t.data) + dtype_size(dt), dt, {n - 1}, d);
    ops::softcap_inplace(tail, 30.0f);
    return values(t->t);
  };
  const auto got = run(kGpu);
  EXPECT_TRUE(close(got, run(kCpu), tolerance(dt)));
  EXPECT_EQ(got[0], rounded(x, dt)[0]) << "the element before the view changed";
}

// Training in two halves: losses and stats (row max, Σ exp, target logit), then the dlogits of
// column ranges: in place over the logits in ranges of 1536 columns (the last one partial), and
// columns [1000, 3500) into fp32 rows with a stride past their width, holding values rounded to
// the logits' dtype (the columns between rows stay as they were); without and with a soft cap
// (the logits taken as capped ones: the same on both devices, so that only ce_dlogits differs).
TEST_P(GpuCrossEntropy, StatsThenDlogitsByColumns) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto x = ce_logits();
  const auto targets = ce_targets();
  const int64_t c0 = 1000, cols = 2500, ldo = cols + 3, chunk = 1536;
  for (const float softcap : {0.0f, kCap}) {
    SCOPED_TRACE(::testing::Message() << "softcap " << softcap);
    auto run = [&](Device d) {
      auto logits = make(d, dt, {kN, kV}, x), t = make_tokens(d, {kN}, targets);
      auto losses = make(d, DType::F32, {kN}, random(kN, 3, 9.0f));
      auto stats = make(d, DType::F32, {3, kN}, random(3 * kN, 4, 9.0f));
      auto wide = make(d, DType::F32, {kN, ldo}, std::vector<float>(kN * ldo, 7.0f));
      ops::cross_entropy_stats(losses->t, stats->t, logits->t, t->t);
      ops::ce_dlogits(wide->t, ldo, logits->t, t->t, stats->t, c0, cols, 0, kV, kDloss, softcap);
      for (int64_t c = 0; c < kV; c += chunk) {
        const int64_t n = std::min(chunk, kV - c);
        const Tensor columns(static_cast<char*>(logits->t.data) + c * dtype_size(dt), dt,
                             {(kN - 1) * kV + n}, d);
        ops::ce_dlogits(columns, kV, logits->t, t->t, stats->t, c, n, 0, kV, kDloss, softcap);
      }
      return std::vector{values(losses->t), values(stats->t), values(wide->t), values(logits->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(DType::F32))) << "losses";
    EXPECT_TRUE(close(got[1], want[1], tolerance(DType::F32))) << "stats";
    EXPECT_TRUE(close(got[2], want[2], tolerance(dt))) << "fp32 dlogits";
    EXPECT_TRUE(close(got[2], rounded(got[2], dt), 0.0))
        << "fp32 dlogits not rounded to the logits'";
    EXPECT_TRUE(close(got[3], want[3], tolerance(dt))) << "in-place dlogits";
  }
}

// The vocabulary-parallel steps on `ranks` shards of Vl columns (global columns [k·Vl, (k+1)·Vl),
// the ones past V padding that holds 1e4, which must never count), the reductions over ranks done
// as the ranks would: the maxima gathered into (ranks, N) and reduced by max_rows, the sums added
// in rank order; softcap > 0: the shards capped first (padding included), the dlogits with the
// cap. Returns every intermediate and the shards after their in-place dlogits.
std::vector<std::vector<float>> vocab_parallel(Device d, DType dt, int ranks, int64_t Vl,
                                               const std::vector<float>& x,
                                               const std::vector<int32_t>& targets, float softcap) {
  auto valid = [&](int k) { return std::clamp<int64_t>(kV - k * Vl, 0, Vl); };
  auto t = make_tokens(d, {kN}, targets);
  std::vector<std::unique_ptr<Held>> shards;
  for (int k = 0; k < ranks; ++k) {
    std::vector<float> shard(kN * Vl, 1e4f);
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t j = 0; j < valid(k); ++j) shard[n * Vl + j] = x[n * kV + k * Vl + j];
    shards.push_back(make(d, dt, {kN, Vl}, shard));
    if (softcap > 0.0f) ops::softcap_inplace(shards.back()->t, softcap);
  }
  auto maxima = make(d, DType::F32, {ranks, kN}, random(ranks * kN, 5, 9.0f));
  auto gmax = make(d, DType::F32, {kN}, random(kN, 6, 9.0f));
  auto sums = make(d, DType::F32, {2, kN}, std::vector<float>(2 * kN));
  auto part = make(d, DType::F32, {2, kN}, random(2 * kN, 7, 9.0f));
  auto stats = make(d, DType::F32, {3, kN}, random(3 * kN, 8, 9.0f));
  auto losses = make(d, DType::F32, {kN}, random(kN, 9, 9.0f));
  for (int k = 0; k < ranks; ++k) {
    ops::vocab_ce_max(maxima->t.slice0(k, k + 1), shards[k]->t, valid(k));
  }
  ops::max_rows(gmax->t, maxima->t);
  for (int k = 0; k < ranks; ++k) {
    ops::vocab_ce_sums(part->t, shards[k]->t, t->t, gmax->t, k * Vl, valid(k));
    ops::add_inplace(sums->t, part->t);
  }
  ops::vocab_ce_finish(losses->t, t->t, gmax->t, sums->t);
  ops::copy(stats->t.slice0(0, 1), gmax->t);
  ops::copy(stats->t.slice0(1, 3), sums->t);
  for (int k = 0; k < ranks; ++k) {
    ops::ce_dlogits(shards[k]->t, Vl, shards[k]->t, t->t, stats->t, 0, Vl, k * Vl, valid(k), kDloss,
                    softcap);
  }
  std::vector<std::vector<float>> r = {values(maxima->t), values(gmax->t), values(sums->t),
                                       values(losses->t)};
  for (const auto& s : shards) r.push_back(values(s->t));
  return r;
}

// Each step against the CPU's: 3 shards of 1700 (100 padding columns on the last), and 4 (the
// last all padding: its row maxima are −inf and it adds nothing); padding columns get 0 dlogits.
// With a soft cap only in fp32: in half precision the two devices' capped logits may round apart
// by an ulp, which the exponentials then magnify past the bound (the capped dlogits of half
// precision logits are compared from the same logits in StatsThenDlogitsByColumns).
TEST_P(GpuCrossEntropy, VocabularyParallelSteps) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto x = ce_logits();
  const auto targets = ce_targets();
  const char* names[] = {"row maxima", "gmax", "sums", "losses"};
  for (auto [ranks, softcap] : {std::pair{3, 0.0f}, {4, 0.0f}, {3, kCap}, {4, kCap}}) {
    if (softcap > 0.0f && dt != DType::F32) continue;
    SCOPED_TRACE(::testing::Message() << ranks << " shards of 1700, softcap " << softcap);
    const auto got = vocab_parallel(kGpu, dt, ranks, 1700, x, targets, softcap);
    const auto want = vocab_parallel(kCpu, dt, ranks, 1700, x, targets, softcap);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(close(got[i], want[i], tolerance(DType::F32))) << names[i];
    }
    for (size_t k = 4; k < got.size(); ++k) {
      EXPECT_TRUE(close(got[k], want[k], tolerance(dt))) << "dlogits of shard " << k - 4;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuCrossEntropy,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// --- optimizer ----------------------------------------------------------------------------------

constexpr int64_t kElems = 100003;  // no multiple of a block or a vector width

class GpuOptimizer : public ::testing::TestWithParam<SG> {};

// One Adam step from moments a previous step left (step 3: the bias corrections count), AdamW and
// Adam with L2, weight decay and a grad_scale that unscales: master, param (master rounded to its
// dtype; it starts as garbage), m and v against the CPU's; for fp32 also with param absent
// (master is the parameter).
TEST_P(GpuOptimizer, Adam) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  // Moments of O(1) (up to 2 and 4), so that the bounds, relative to max(|want|, 1), resolve m
  // and v as they do master.
  const auto master0 = random(kElems, 10), grad = random(kElems, 11, 3.0f),
             m0 = random(kElems, 12, 2.0f);
  auto v0 = random(kElems, 13, 2.0f);
  for (float& v : v0) v *= v;
  std::vector<bool> with_param = {true};
  if (s == DType::F32) with_param.push_back(false);
  for (bool adamw : {true, false})
    for (bool param : with_param) {
      SCOPED_TRACE(::testing::Message()
                   << (adamw ? "AdamW" : "Adam") << (param ? "" : ", no param"));
      ops::AdamArgs a;
      a.lr = 0.05f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
      a.grad_scale = 0.5f, a.step = 3, a.adamw = adamw;
      auto run = [&](Device d) {
        auto master = make(d, DType::F32, {kElems}, master0);
        auto p = make(d, s, {kElems}, random(kElems, 14, 9.0f));
        auto gt = make(d, g, {kElems}, grad);
        auto m = make(d, DType::F32, {kElems}, m0), v = make(d, DType::F32, {kElems}, v0);
        ops::adam_step(master->t, param ? p->t : Tensor(), gt->t, m->t, v->t, a);
        return std::vector{values(master->t), values(p->t), values(m->t), values(v->t)};
      };
      const auto got = run(kGpu), want = run(kCpu);
      EXPECT_TRUE(close(got[0], want[0], tolerance(DType::F32))) << "master";
      EXPECT_TRUE(close(got[1], want[1], tolerance(s))) << "param";
      EXPECT_TRUE(close(got[2], want[2], tolerance(DType::F32))) << "m";
      EXPECT_TRUE(close(got[3], want[3], tolerance(DType::F32))) << "v";
    }
}

// Two SGD steps with weight decay and grad_scale: without momentum (no buffer), with momentum
// and with Nesterov. Step 1 sets the buffer to the gradient without reading it (it holds NaN
// here), step 2 uses it.
TEST_P(GpuOptimizer, Sgd) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const auto master0 = random(kElems, 15), grad1 = random(kElems, 16, 3.0f),
             grad2 = random(kElems, 17, 3.0f);
  const std::pair<float, bool> kinds[] = {{0.0f, false}, {0.9f, false}, {0.9f, true}};
  for (const auto& [momentum, nesterov] : kinds) {
    SCOPED_TRACE(::testing::Message() << "momentum " << momentum << " nesterov " << nesterov);
    auto run = [&](Device d) {
      auto master = make(d, DType::F32, {kElems}, master0);
      auto p = make(d, s, {kElems}, random(kElems, 18, 9.0f));
      auto buf = make(d, DType::F32, {kElems},
                      std::vector<float>(kElems, std::numeric_limits<float>::quiet_NaN()));
      ops::SgdArgs a;
      a.lr = 0.05f, a.momentum = momentum, a.weight_decay = 0.01f, a.grad_scale = 0.5f;
      a.nesterov = nesterov;
      for (const auto* grad : {&grad1, &grad2}) {
        auto gt = make(d, g, {kElems}, *grad);
        ops::sgd_step(master->t, p->t, gt->t, momentum != 0.0f ? buf->t : Tensor(), a);
        ++a.step;
      }
      return std::vector{values(master->t), values(p->t), values(buf->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(DType::F32))) << "master";
    EXPECT_TRUE(close(got[1], want[1], tolerance(s))) << "param";
    if (momentum != 0.0f) {
      EXPECT_TRUE(close(got[2], want[2], tolerance(DType::F32))) << "buf";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuOptimizer, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
