// The memory and communication model of a layout (cost/predict.h): gpt2-124M's model states
// against the ZeRO paper's formula and the figures tests/train/zero_memory_test.cc holds the
// engine's config to, the tensor-parallel bytes' dependence on the layout, and the layout a config
// gives (cost/layout.h).
#include "strata/cost/predict.h"

#include <gtest/gtest.h>

#include "strata/core/check.h"
#include "strata/cost/layout.h"
#include "strata/model/param_spec.h"

namespace strata::cost {
namespace {

ModelConfig gpt2_124m() {
  ModelConfig m;
  m.family = "gpt2";
  m.layers = 12, m.hidden = 768, m.heads = 12, m.kv_heads = 12, m.ffn_hidden = 3072;
  m.vocab = 50304, m.seq_len = 1024;
  return m;
}

Layout bf16_layout(int stage) {
  Layout l;
  l.seq_len = 1024, l.hidden = 768, l.layers = 12;
  l.micro_batch = 1, l.accumulation = 16;
  l.zero.param_dtype = l.zero.wire = DType::BF16;
  l.zero.grad_dtype = DType::BF16;
  l.zero.stage = stage;
  return l;
}

constexpr size_t kPsi = 124475904;  // gpt2-124M at 8 ranks (no padding)

// bf16 parameters and gradients, Adam: p = g = 2, K = 4 (master) + 8 (moments) = 12.
TEST(PlanMemory, ZeroFormulaOfEachStage) {
  const ModelSpec spec = build_model_spec(gpt2_124m(), 8);
  ASSERT_EQ(size_t(spec.numel), kPsi);
  const size_t want[4] = {16 * kPsi, 4 * kPsi + 12 * kPsi / 8, 2 * kPsi + 14 * kPsi / 8,
                          16 * kPsi / 8};
  for (int stage = 0; stage <= 3; ++stage) {
    const MemoryPrediction m = predict_memory(bf16_layout(stage), spec, stage == 0 ? 0 : 8);
    EXPECT_EQ(m.formula, want[stage]) << "stage " << stage;
    EXPECT_EQ(m.model_states, m.formula + m.buffers) << "stage " << stage;
  }
  // Stage 1 adds nothing to the formula; the master and moments are 1/8 each.
  const MemoryPrediction s1 = predict_memory(bf16_layout(1), spec, 8);
  EXPECT_EQ(s1.buffers, 0u);
  EXPECT_EQ(s1.bytes[size_t(MemCategory::MasterParams)], kPsi / 8 * 4);
  EXPECT_EQ(s1.bytes[size_t(MemCategory::OptimizerState)], kPsi / 8 * 8);
}

// The figures ZeroMemory.Gpt2_124MStage3AtDp8StaysWithinAQuarterOfTheFormula gets through the
// engine's config (bf16 with fp32 gradient accumulation: 18Ψ/8): the fp32 gradient slots of the
// largest unit (2 with overlap), the persistent final norm, and 1 + ⌈prefetch / 4723968⌉
// gathered-unit buffers.
TEST(PlanMemory, Stage3BuffersFollowThePrefetchBucket) {
  const ModelSpec spec = build_model_spec(gpt2_124m(), 8);
  Layout l = bf16_layout(3);
  l.zero.grad_dtype = DType::F32;
  l.zero.overlap = true;
  l.zero.prefetch_elems = 5000000;
  const MemoryPrediction m = predict_memory(l, spec, 8);
  EXPECT_EQ(m.formula, 280070784u);
  EXPECT_EQ(m.buffers, 37791744u + 3072u + 3u * 4723968u * 2u);
  l.zero.prefetch_elems = 50000000;
  EXPECT_EQ(predict_memory(l, spec, 8).buffers, 37791744u + 3072u + 12u * 4723968u * 2u);
  // Units kept for the step (stage3_reshard_after_forward false): a buffer per gathered unit.
  l.zero.reshard_after_forward = false;
  size_t gathered = 0;
  for (const UnitSpec& u : spec.units) gathered += u.numel > 100000 ? 1 : 0;
  EXPECT_GT(gathered, 12u);
  EXPECT_EQ(predict_memory(l, spec, 8).buffers, 37791744u + 3072u + gathered * 4723968u * 2u);
}

// fp32 parameters are their own master copy; SGD keeps one moment with momentum, none without.
TEST(PlanMemory, Fp32AndSgdMoments) {
  const ModelSpec spec = build_model_spec(gpt2_124m(), 1);
  const size_t psi = size_t(spec.numel);
  Layout l;
  l.moments = 2;
  EXPECT_EQ(predict_memory(l, spec, 0).formula, 16 * psi);
  EXPECT_EQ(predict_memory(l, spec, 0).bytes[size_t(MemCategory::MasterParams)], 0u);
  l.moments = 1;
  EXPECT_EQ(predict_memory(l, spec, 0).formula, 12 * psi);
  l.moments = 0;
  EXPECT_EQ(predict_memory(l, spec, 0).formula, 8 * psi);
  // Without a shard group the stage is not in effect.
  l.zero.stage = 3;
  EXPECT_EQ(predict_memory(l, spec, 0).formula, 8 * psi);
}

TEST(PlanMemory, DescribesEveryCategory) {
  const ModelSpec spec = build_model_spec(gpt2_124m(), 1);
  const std::string s = describe_memory(predict_memory(Layout{}, spec, 0));
  for (const char* part : {"model states ", " per rank (", ") = ZeRO formula ", " + buffers "}) {
    EXPECT_NE(s.find(part), std::string::npos) << s;
  }
}

// The host's ranks share its memory: enough of them refuse a model one rank fits.
TEST(PlanMemory, LocalRanksShareTheHost) {
  const ModelSpec spec = build_model_spec(gpt2_124m(), 1);
  Layout l;
  EXPECT_NO_THROW(check_fits_in_memory(l, spec, 0));
  l.local_ranks = 1 << 20;  // 2 PB of model states
  EXPECT_THROW(check_fits_in_memory(l, spec, 0), InputError);
}

// The layout of a config carries its ZeRO options as the engine takes them (zero_options), the
// dtypes by the one rule for each, and the recompute policy.
TEST(PlanLayout, ZeroOptionsCarryTheConfig) {
  const nlohmann::json j = {{"train_batch_size", 16},
                            {"train_micro_batch_size_per_gpu", 2},
                            {"bf16", {{"enabled", true}}},
                            {"data_types", {{"grad_accum_dtype", "fp32"}}},
                            {"model", {{"preset", "gpt2-tiny"}, {"layers", 3}}},
                            {"activation_checkpointing", {{"number_checkpoints", 2}}},
                            {"zero_optimization",
                             {{"stage", 2},
                              {"overlap_comm", true},
                              {"reduce_bucket_size", 7},
                              {"stage3_prefetch_bucket_size", 11},
                              {"stage3_param_persistence_threshold", 13},
                              {"stage3_max_live_parameters", 17},
                              {"stage3_max_reuse_distance", 19},
                              {"stage3_reshard_after_forward", false}}}};
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  const Layout l = layout_of(cfg);
  const ZeroOptions& o = l.zero;
  EXPECT_EQ(o.stage, 2);
  EXPECT_EQ(o.param_dtype, DType::BF16);
  EXPECT_EQ(o.grad_dtype, DType::F32);
  EXPECT_EQ(o.wire, DType::BF16);
  EXPECT_TRUE(o.overlap);
  EXPECT_EQ(o.bucket_elems, 7);
  EXPECT_EQ(o.prefetch_elems, 11);
  EXPECT_EQ(o.persistence_threshold, 13);
  EXPECT_EQ(o.max_live, 17);
  EXPECT_EQ(o.max_reuse_distance, 19);
  EXPECT_FALSE(o.reshard_after_forward);
  EXPECT_EQ(o.recompute_full, l.recompute.full);
  EXPECT_EQ(o.recompute_full, recompute_options(cfg).full);
  EXPECT_EQ(l.micro_batch, 2);
  EXPECT_EQ(l.accumulation, 8);
  // Without bf16 or fp16 the gradients are fp32.
  nlohmann::json k = j;
  k.erase("bf16");
  k.erase("data_types");
  Config fp32 = parse_config(k);
  resolve_batch(fp32, 1);
  EXPECT_EQ(zero_options(fp32).grad_dtype, DType::F32);
  EXPECT_EQ(fp32.grad_dtype(), DType::F32);
}

// A tiny model at tp = 2: 2 blocks, C 64, B·T = 2·16 tokens.
ModelConfig tiny() {
  ModelConfig m;
  m.family = "gpt2";
  m.layers = 2, m.hidden = 64, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 256;
  m.vocab = 128, m.seq_len = 16;
  return m;
}

Layout tiny_layout() {
  Layout l;
  l.seq_len = 16, l.hidden = 64, l.layers = 2, l.micro_batch = 2, l.accumulation = 1;
  return l;
}

TEST(PlanTpBytes, NoneOnOneRank) {
  EXPECT_EQ(predict_tp_bytes(tiny_layout(), build_model_spec(tiny(), 1)), 0u);
}

// Each micro-batch repeats the same collectives; the gradient norm's all-reduce (one fp32 over
// 2 ranks: 4 bytes) is once per step.
TEST(PlanTpBytes, MicroBatchesRepeatAndTheNormIsOnce) {
  const ModelSpec spec = build_model_spec(tiny(), 1, 2, 0);
  Layout l = tiny_layout();
  const uint64_t one = predict_tp_bytes(l, spec);
  l.accumulation = 3;
  EXPECT_EQ(predict_tp_bytes(l, spec), 3 * (one - 4) + 4);
}

// Fully recomputing every block repeats each block's forward all-reduce of its MLP output once:
// (B·T, C) fp32 over 2 ranks puts 2·(2-1)/2 · 32·64·4 bytes on the wire per block.
TEST(PlanTpBytes, FullRecomputeRepeatsEachBlocksForwardReduce) {
  const ModelSpec spec = build_model_spec(tiny(), 1, 2, 0);
  Layout l = tiny_layout();
  const uint64_t plain = predict_tp_bytes(l, spec);
  l.recompute.full = {1, 1};
  EXPECT_EQ(predict_tp_bytes(l, spec), plain + 2 * (32 * 64 * 4));
  l.recompute.full = {0, 1};
  EXPECT_EQ(predict_tp_bytes(l, spec), plain + 32 * 64 * 4);
}

}  // namespace
}  // namespace strata::cost
