// Activation checkpointing (../shared/reference/megatron.md §6): full recompute of chosen blocks,
// selective recompute of the attention core and the host pool change what a chunk keeps, never
// what it computes — losses and gradients equal the run that keeps everything, bit for bit — and
// the activation bytes equal the per-block formula of the README.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/core/rng.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "tests/model/tiny_model.h"

namespace strata {
namespace {

using test::Batch;
using test::tiny;

Batch batch(const ModelConfig& m, int B, uint64_t seed) {
  return test::batch(m, B, seed, "recompute_test", 5, 2);
}

// Parameters in `t` (fp32 initial values rounded once).
std::vector<char> initial_params(const ModelSpec& spec, DType t) {
  std::vector<float> p(size_t(spec.numel), 0.0f);
  for (const ParamSpec& s : spec.params) init_param_slice(p.data() + s.offset, s, 7, 0, s.numel());
  std::vector<char> out(size_t(spec.numel) * dtype_size(t));
  convert(out.data(), t, p.data(), DType::F32, size_t(spec.numel));
  return out;
}

RecomputeOptions full_blocks(const ModelConfig& m, std::vector<int> blocks,
                             bool selective = false) {
  RecomputeOptions r;
  r.full.assign(size_t(m.layers), 0);
  for (int l : blocks) r.full[size_t(l)] = 1;
  r.selective = selective;
  return r;
}

struct Policy {
  std::string name;
  RecomputeOptions rc;
};

std::vector<Policy> policies(const ModelConfig& m) {
  std::vector<Policy> p;
  p.push_back({"full, every block", full_blocks(m, {0, 1, 2, 3})});
  p.push_back({"full, blocks 1 and 3", full_blocks(m, {1, 3})});
  p.push_back({"full, blocks 0 and 1", full_blocks(m, {0, 1})});
  p.push_back({"selective", full_blocks(m, {}, true)});
  p.push_back({"full 0 and 2, selective elsewhere", full_blocks(m, {0, 2}, true)});
  RecomputeOptions host = full_blocks(m, {0, 1, 2, 3});
  host.host = true, host.synchronize = true;
  p.push_back({"full, host pool, synchronised", host});
  return p;
}

struct Result {
  std::vector<double> losses;
  std::vector<char> grads;
  double recompute_s = 0;
  std::vector<double> per_block;
};

// Micro-batches 0 and 1 (F0 B0 F1 B1) through one chunk of the whole model, or with deferred
// weight gradients both in flight (F0 F1 B1 B0 W1 W0, as a zero-bubble schedule runs them).
Result run(const ModelSpec& spec, DType t, const RecomputeOptions& rc, bool deferred) {
  const ModelConfig& m = spec.config;
  const int B = 2, N = B * m.seq_len;
  std::vector<char> params = initial_params(spec, t);
  Result r;
  r.grads.assign(size_t(spec.numel) * 4, 0);
  ChunkOptions o;
  o.recompute = rc;
  if (deferred) o.slots = 2, o.defer_weight = true;
  auto model =
      make_transformer(spec, t, DType::F32, params.data(), r.grads.data(), B, m.seq_len, o);
  const Batch b0 = batch(m, B, 1), b1 = batch(m, B, 2);
  const float dloss = 1.0f / float(2 * N);
  if (deferred) {
    r.losses.push_back(
        model->forward(0, b0.inputs.data(), Tensor(), b0.targets.data(), dloss, true));
    r.losses.push_back(
        model->forward(1, b1.inputs.data(), Tensor(), b1.targets.data(), dloss, true));
    model->backward_input(1, Tensor());
    model->backward_input(0, Tensor());
    model->backward_weight(1);
    model->backward_weight(0);
  } else {
    for (const Batch* b : {&b0, &b1}) {
      r.losses.push_back(model->forward(b->inputs.data(), b->targets.data(), dloss, true));
      model->backward();
    }
  }
  r.recompute_s = model->take_recompute_seconds(&r.per_block);
  return r;
}

class Recompute : public ::testing::TestWithParam<std::tuple<std::string, DType, bool>> {};

// Every policy gives the losses and every gradient of the run that keeps all activations, bit
// for bit: the recompute repeats the same kernels on the same inputs.
TEST_P(Recompute, GradientsEqualKeepingEverything) {
  const auto [family, t, deferred] = GetParam();
  const ModelConfig m = tiny(family);
  const ModelSpec spec = build_model_spec(m);
  const Result base = run(spec, t, {}, deferred);
  EXPECT_EQ(base.recompute_s, 0.0);
  for (const Policy& p : policies(m)) {
    const Result r = run(spec, t, p.rc, deferred);
    EXPECT_EQ(r.losses, base.losses) << p.name;
    for (const ParamSpec& q : spec.params) {
      EXPECT_EQ(0, std::memcmp(r.grads.data() + 4 * q.offset, base.grads.data() + 4 * q.offset,
                               4 * size_t(q.numel())))
          << p.name << ": " << q.name;
    }
    // Every recomputed block is timed (profile); the others are not.
    ASSERT_EQ(r.per_block.size(), size_t(m.layers)) << p.name;
    EXPECT_GT(r.recompute_s, 0.0) << p.name;
    for (int l = 0; l < m.layers; ++l) {
      EXPECT_EQ(r.per_block[size_t(l)] > 0.0, p.rc.selective || p.rc.is_full(l))
          << p.name << ", block " << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Recompute,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  dtype_name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_deferred" : "_fused");
                         });

// A chunk of blocks 2-3 and the head behind a chunk of the embedding and blocks 0-1, with block
// 2 (the second chunk's first: its checkpoint is the received hidden state) fully recomputed.
TEST(RecomputeChunks, ASecondChunkCheckpointsItsInput) {
  const ModelConfig m = tiny("gpt2");
  const ModelSpec spec = build_model_spec(m);
  const Result base = run(spec, DType::F32, {}, false);
  const int cut = spec.units_of(UnitKind::Attention)[2];
  std::vector<char> params = initial_params(spec, DType::F32);
  std::vector<float> grads(size_t(spec.numel), 0.0f);
  ChunkOptions o0{0, cut}, o1{cut, -1};
  o0.recompute = o1.recompute = full_blocks(m, {0, 2});
  auto c0 =
      make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), 2, m.seq_len, o0);
  auto c1 =
      make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), 2, m.seq_len, o1);
  const int N = 2 * m.seq_len;
  const float dloss = 1.0f / float(2 * N);
  std::vector<double> losses;
  for (uint64_t seed : {1, 2}) {
    const Batch b = batch(m, 2, seed);
    c0->forward(0, b.inputs.data(), Tensor(), nullptr, dloss, true);
    losses.push_back(c1->forward(0, nullptr, c0->output(0), b.targets.data(), dloss, true));
    c0->backward_input(0, c1->backward_input(0, Tensor()));
  }
  EXPECT_EQ(losses, base.losses);
  EXPECT_EQ(0, std::memcmp(grads.data(), base.grads.data(), base.grads.size()));
}

// A hook sees the parameter acquires param_trace() lists (ZeRO stage 3 gathers in that order):
// a fully recomputed block acquires its units for the recompute, then for its backward.
TEST(RecomputeTrace, AcquiresFollowTheTrace) {
  struct Recorder : UnitHook {
    std::vector<int> seen;
    const void* acquire_params(int unit) override {
      seen.push_back(unit);
      return nullptr;
    }
  };
  const ModelConfig m = tiny("llama");
  const ModelSpec spec = build_model_spec(m);
  const RecomputeOptions rc = full_blocks(m, {1, 2}, true);
  std::vector<char> params = initial_params(spec, DType::F32);
  std::vector<float> grads(size_t(spec.numel), 0.0f);
  ChunkOptions o;
  o.recompute = rc;
  auto model =
      make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), 1, m.seq_len, o);
  const Batch b = batch(m, 1, 3);
  Recorder fwd, bwd;
  model->forward(b.inputs.data(), b.targets.data(), 1.0f, true, &fwd);
  model->backward(&bwd);
  EXPECT_EQ(fwd.seen, param_trace(spec, UnitHook::Pass::Forward, rc));
  EXPECT_EQ(bwd.seen, param_trace(spec, UnitHook::Pass::Backward, rc));
  EXPECT_EQ(bwd.seen.size(), param_trace(spec, UnitHook::Pass::Backward).size() + 4);
}

// --- activation memory -----------------------------------------------------------------------

// The README's formula, per chunk of blocks [0, L) with the embedding and the head, in bytes.
// e: bytes of the parameter dtype; rows N = B·T; the widths are this rank's (tp = 1 here).
struct Bytes {
  int64_t activations = 0, checkpoints = 0;
};

Bytes formula(const ModelSpec& spec, DType t, int B, const ChunkOptions& o) {
  const ModelConfig& m = spec.config;
  const int64_t e = int64_t(dtype_size(t)), N = int64_t(B) * m.seq_len, C = m.hidden;
  const int64_t hd = C / m.heads, H = int64_t(m.heads) * hd;
  const int64_t QKV = int64_t(m.heads + 2 * m.kv_heads) * hd;
  const int64_t F = m.ffn_hidden, FCH = m.family == "gpt2" ? F : 2 * F;
  const int64_t V = spec.tp.vocab_rows;
  // A block's attention state in bytes: on the tiled path a fp32 log-sum-exp per query row, on
  // the materialized path the probabilities (B,heads,T,T) in t.
  const bool tiled = kernels::attention_path(m.seq_len, t) == kernels::AttentionPath::Tiled;
  const int64_t att = tiled ? 4 * int64_t(B) * m.heads * m.seq_len
                            : e * int64_t(B) * m.heads * m.seq_len * m.seq_len;
  const int64_t slots = o.slots, inputs = o.input_slots > 0 ? o.input_slots : o.slots;
  const RecomputeOptions& rc = o.recompute;
  const int L = m.layers;
  Bytes b;
  int64_t per_slot = 3 * N * 4;  // tokens, targets, document starts (B × seq_len: N here)
  per_slot += e * N * C + 2 * N * 4 + e * N * V + 4 * N * 4;  // norm, logits, losses, CE stats
  int64_t per_input = 0, ckpt_per_slot = 0;
  for (int l = 0; l < L; ++l) {
    // The block's input: a checkpoint, or an activation (the embedding's output or the previous
    // block's).
    (rc.is_full(l) ? ckpt_per_slot : per_slot) += e * N * C;
    if (rc.is_full(l)) continue;
    per_slot += e * N * (3 * C + H + F) + 4 * N * 4;  // ln1, res2, ln2, atty, fch_act; norms' stats
    per_input += e * N * (QKV + FCH) + (rc.selective ? 0 : att);
  }
  per_slot += e * N * C;  // the last block's output
  b.activations = slots * per_slot + inputs * per_input;
  if (rc.any_full()) b.activations += e * N * (3 * C + H + QKV + FCH + F) + 4 * N * 4;
  if (rc.any_full() || rc.selective) b.activations += att;
  if (o.defer_weight) {
    b.activations += slots * (e * L * N * (2 * C + QKV + C + FCH + C) + 2 * e * N * C);
  }
  b.checkpoints = slots * ckpt_per_slot;
  return b;
}

class RecomputeMemory : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(RecomputeMemory, ActivationBytesEqualTheFormula) {
  const auto [family, t] = GetParam();
  const ModelConfig m = tiny(family);
  const ModelSpec spec = build_model_spec(m);
  std::vector<Policy> ps = policies(m);
  ps.insert(ps.begin(), Policy{"none", {}});
  const MemoryTracker& mt = MemoryTracker::instance();
  for (kernels::AttentionPath path :
       {kernels::AttentionPath::Tiled, kernels::AttentionPath::Materialized}) {
    kernels::set_attention_path(path);
    for (int variant = 0; variant < 3; ++variant) {
      for (const Policy& p : ps) {
        ChunkOptions o;
        o.recompute = p.rc;
        if (variant >= 1) o.slots = 3, o.defer_weight = variant == 2;
        if (variant == 2) o.input_slots = 2;
        const size_t a0 = mt.current(MemCategory::Activations);
        const size_t c0 = mt.current(MemCategory::CheckpointedActivations);
        const size_t h0 = mt.current(MemCategory::HostCheckpoints);
        auto model = make_transformer(spec, t, DType::F32, nullptr, nullptr, 2, m.seq_len, o);
        const Bytes want = formula(spec, t, 2, o);
        const std::string at = p.name + ", variant " + std::to_string(variant) + ", " +
                               kernels::attention_path_name(path);
        EXPECT_EQ(int64_t(mt.current(MemCategory::Activations) - a0), want.activations) << at;
        const MemCategory pool =
            p.rc.host ? MemCategory::HostCheckpoints : MemCategory::CheckpointedActivations;
        const MemCategory other =
            p.rc.host ? MemCategory::CheckpointedActivations : MemCategory::HostCheckpoints;
        EXPECT_EQ(int64_t(mt.current(pool) - (p.rc.host ? h0 : c0)), want.checkpoints) << at;
        EXPECT_EQ(mt.current(other), p.rc.host ? c0 : h0) << at;
      }
    }
  }
  kernels::set_attention_path(std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Families, RecomputeMemory,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

TEST(RecomputeMemory, FullRecomputeKeepsAFractionOfTheBlocks) {
  // Per block and micro-batch: 16·N·C elements and the attention state kept (GPT-2 widths), N·C
  // with full recompute; selective drops the attention state (B·h·T² elements materialized, B·h·T
  // floats tiled).
  ModelConfig m = tiny("gpt2");
  m.layers = 12;
  const ModelSpec spec = build_model_spec(m);
  ChunkOptions none, full, sel;
  full.recompute = full_blocks(m, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  sel.recompute.selective = true;
  const Bytes n = formula(spec, DType::F32, 2, none), f = formula(spec, DType::F32, 2, full);
  const Bytes s = formula(spec, DType::F32, 2, sel);
  const bool tiled = kernels::attention_path(16, DType::F32) == kernels::AttentionPath::Tiled;
  const int64_t NC = 4 * 32 * 32, att = 4 * 2 * 4 * 16 * (tiled ? 1 : 16);
  EXPECT_EQ(n.activations - s.activations, 12 * att - att);
  EXPECT_EQ(f.checkpoints, 12 * NC);
  EXPECT_LT(f.activations + f.checkpoints, n.activations / 2);
}

}  // namespace
}  // namespace strata
