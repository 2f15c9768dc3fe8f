// Partitioning a model's units into pipeline chunks: whole blocks, the embedding on the first
// chunk and the head on the last, balanced splits optimal against brute force, explicit lists and
// their errors.
#include "strata/pipeline/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/model/param_spec.h"

namespace strata::pipeline {
namespace {

ModelConfig gpt2_124m(int layers = 12) {
  ModelConfig m;
  m.family = "gpt2";
  m.layers = layers, m.hidden = 768, m.heads = 12, m.kv_heads = 12, m.ffn_hidden = 3072;
  m.vocab = 50257, m.seq_len = 1024, m.tied_embeddings = true;
  return m;
}

ModelConfig llama(int layers = 16) {
  ModelConfig m;
  m.family = "llama";
  m.layers = layers, m.hidden = 1024, m.heads = 16, m.kv_heads = 4, m.ffn_hidden = 2816;
  m.vocab = 32000, m.seq_len = 2048, m.tied_embeddings = false;
  return m;
}

// Whole blocks, contiguous, covering every unit; embedding first, head last.
void expect_well_formed(const ModelSpec& spec, const StagePlan& plan, int chunks) {
  const int L = spec.config.layers;
  ASSERT_EQ(int(plan.chunks.size()), chunks);
  ASSERT_EQ(int(plan.layers_begin.size()), chunks);
  ASSERT_EQ(int(plan.blocks.size()), chunks);
  EXPECT_EQ(plan.chunks.front().first, 0);
  EXPECT_EQ(plan.chunks.back().second, int(spec.units.size()));
  int64_t params = 0;
  for (int g = 0; g < chunks; ++g) {
    const auto [begin, end] = plan.chunks[size_t(g)];
    if (g > 0) {
      EXPECT_EQ(begin, plan.chunks[size_t(g - 1)].second);
    }
    const int first = plan.layers_begin[size_t(g)];
    EXPECT_EQ(first + plan.blocks[size_t(g)],
              g + 1 < chunks ? plan.layers_begin[size_t(g + 1)] : L);
    int attn = 0, mlp = 0;
    for (int u = begin; u < end; ++u) {
      const UnitSpec& unit = spec.units[size_t(u)];
      switch (unit.kind) {
        case UnitKind::Vocab:
        case UnitKind::Position:
          EXPECT_EQ(g, 0) << unit.name;
          break;
        case UnitKind::FinalNorm:
        case UnitKind::Output:
          EXPECT_EQ(g, chunks - 1) << unit.name;
          break;
        case UnitKind::Attention:
          EXPECT_EQ(unit.layer, first + attn++) << unit.name;
          break;
        case UnitKind::Mlp:
          EXPECT_EQ(unit.layer, first + mlp++) << unit.name;
          break;
        case UnitKind::Experts:  // right after its block's MLP unit
          EXPECT_EQ(unit.layer, first + mlp - 1) << unit.name;
          break;
      }
      params += unit.numel;
    }
    EXPECT_EQ(attn, plan.blocks[size_t(g)]);
    EXPECT_EQ(mlp, plan.blocks[size_t(g)]);
  }
  EXPECT_EQ(params, spec.numel);
}

// The least largest chunk cost over every split into non-empty chunks.
double brute_force_max(const std::vector<double>& block, double first, double last, int n) {
  const int L = int(block.size());
  double best = 1e300;
  std::vector<int> sizes;
  std::function<void(int, int)> go = [&](int g, int left) {
    if (g == n - 1) {
      if (left < 1) return;
      sizes.push_back(left);
      double worst = 0;
      for (int c = 0, at = 0; c < n; at += sizes[size_t(c)], ++c) {
        double cost = (c == 0 ? first : 0) + (c == n - 1 ? last : 0);
        for (int l = at; l < at + sizes[size_t(c)]; ++l) cost += block[size_t(l)];
        worst = std::max(worst, cost);
      }
      best = std::min(best, worst);
      sizes.pop_back();
      return;
    }
    for (int b = 1; b <= left - (n - 1 - g); ++b) {
      sizes.push_back(b);
      go(g + 1, left - b);
      sizes.pop_back();
    }
  };
  go(0, L);
  return best;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(Partition, UniformGpt2) {
  const ModelSpec spec = build_model_spec(gpt2_124m());
  const StagePlan plan = partition(spec, 4, PartitionMethod::Uniform);
  expect_well_formed(spec, plan, 4);
  EXPECT_EQ(plan.blocks, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(plan.layers_begin, (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(spec.units[size_t(plan.chunks[1].first)].name, "block.3.attn");
  EXPECT_EQ(spec.units[size_t(plan.chunks[0].second - 1)].name, "block.2.mlp");
  // The remainder goes to the middle chunks first.
  const ModelSpec spec14 = build_model_spec(gpt2_124m(14));
  EXPECT_EQ(partition(spec14, 4, PartitionMethod::Uniform).blocks, (std::vector<int>{3, 4, 4, 3}));
  EXPECT_EQ(partition(spec14, 5, PartitionMethod::Uniform).blocks,
            (std::vector<int>{3, 3, 3, 3, 2}));
  EXPECT_EQ(partition(build_model_spec(gpt2_124m(5)), 2, PartitionMethod::Uniform).blocks,
            (std::vector<int>{3, 2}));
}

TEST(Partition, OneChunkHoldsTheWholeModel) {
  const ModelSpec spec = build_model_spec(llama());
  const StagePlan plan = partition(spec, 1, PartitionMethod::Time);
  expect_well_formed(spec, plan, 1);
  EXPECT_EQ(plan.chunks[0], (std::pair<int, int>{0, int(spec.units.size())}));
}

TEST(Partition, BalancedSplitsAreOptimal) {
  for (const ModelConfig& cfg : {gpt2_124m(), llama()}) {
    for (int tp : {1, 2}) {
      const ModelSpec spec = build_model_spec(cfg, 1, tp, 0);
      for (int n : {2, 3, 4, 6}) {
        // Parameters.
        std::vector<double> block(size_t(cfg.layers), 0.0);
        double emb = 0, head = 0;
        for (const UnitSpec& u : spec.units) {
          if (u.layer >= 0) block[size_t(u.layer)] += double(u.numel);
          if (u.kind == UnitKind::Vocab || u.kind == UnitKind::Position) emb += double(u.numel);
          if (u.kind == UnitKind::FinalNorm || u.kind == UnitKind::Output) head += double(u.numel);
          // A tied vocabulary is held by the last stage too (for its logits).
          if (u.kind == UnitKind::Vocab && cfg.tied_embeddings) head += double(u.numel);
        }
        const StagePlan byp = partition(spec, n, PartitionMethod::Parameters);
        expect_well_formed(spec, byp, n);
        const double pmax = *std::max_element(byp.params.begin(), byp.params.end());
        EXPECT_NEAR(pmax, brute_force_max(block, emb, head, n), 0.5) << cfg.family << " " << n;
        // Time.
        const UnitFlops fl = unit_flops(spec);
        const StagePlan byt = partition(spec, n, PartitionMethod::Time);
        expect_well_formed(spec, byt, n);
        const double tmax = *std::max_element(byt.flops.begin(), byt.flops.end());
        EXPECT_NEAR(tmax / brute_force_max(fl.block, fl.embedding, fl.head, n), 1.0, 1e-12);
      }
    }
  }
}

TEST(Partition, Gpt2EmbeddingAndHeadShiftBlocksAway) {
  const ModelSpec spec = build_model_spec(gpt2_124m());
  // 38.6M vocabulary + 0.8M position parameters outweigh five 7.1M blocks: the first chunk keeps
  // one block.
  const StagePlan byp = partition(spec, 4, PartitionMethod::Parameters);
  EXPECT_EQ(byp.blocks[0], 1);
  // The tied head's logits (2·V·C·T) cost about four blocks' FLOPs; the embedding is a lookup.
  const StagePlan byt = partition(spec, 4, PartitionMethod::Time);
  EXPECT_EQ(byt.blocks[3], 1);
  EXPECT_GT(byt.blocks[0], 1);
  const UnitFlops fl = unit_flops(spec);
  EXPECT_DOUBLE_EQ(fl.head, 2.0 * 1536 * 1024 + 2.0 * 50257 * 768 * 1024);
  EXPECT_DOUBLE_EQ(fl.block[0], 2.0 * (7087872) * 1024 + 4.0 * 1024 * 1024 * 768);
  EXPECT_EQ(fl.embedding, 0);
}

TEST(Partition, Explicit) {
  const ModelSpec spec = build_model_spec(llama());
  const StagePlan plan = partition(spec, 4, PartitionMethod::Explicit, {3, 5, 5, 3});
  expect_well_formed(spec, plan, 4);
  EXPECT_EQ(plan.layers_begin, (std::vector<int>{0, 3, 8, 13}));
  // The first and the last chunk may hold the embedding, resp. the head, alone.
  const StagePlan ends = partition(spec, 4, PartitionMethod::Explicit, {0, 8, 8, 0});
  expect_well_formed(spec, ends, 4);
  for (int u = ends.chunks[0].first; u < ends.chunks[0].second; ++u) {
    EXPECT_EQ(spec.units[size_t(u)].kind, UnitKind::Vocab);
  }
  for (int u = ends.chunks[3].first; u < ends.chunks[3].second; ++u) {
    const UnitKind k = spec.units[size_t(u)].kind;
    EXPECT_TRUE(k == UnitKind::FinalNorm || k == UnitKind::Output);
  }
  EXPECT_EQ(ends.layers_begin, (std::vector<int>{0, 0, 8, 16}));
}

TEST(Partition, Errors) {
  const ModelSpec spec = build_model_spec(gpt2_124m());
  using M = PartitionMethod;
  EXPECT_HAS(error_of([&] {
               partition(spec, 4, M::Explicit, {3, 3, 3});
             }),
             "parallelism.partition lists 3 block counts but there are 4 model chunks");
  EXPECT_HAS(error_of([&] {
               partition(spec, 4, M::Explicit, {3, 3, 3, 2});
             }),
             "parallelism.partition block counts sum to 11 but model.layers = 12");
  EXPECT_HAS(error_of([&] {
               partition(spec, 4, M::Explicit, {6, 0, 3, 3});
             }),
             "parallelism.partition[1] = 0: every chunk but the first and the last");
  EXPECT_HAS(error_of([&] {
               partition(spec, 4, M::Explicit, {-1, 7, 3, 3});
             }),
             "parallelism.partition[0] = -1: a block count cannot be negative");
  EXPECT_HAS(error_of([&] { partition(spec, 4, M::Explicit); }),
             "parallelism.partition = explicit needs the number of blocks");
  EXPECT_HAS(error_of([&] {
               partition(spec, 4, M::Uniform, {3, 3, 3, 3});
             }),
             "block counts are read only by the explicit method");
  for (M m : {M::Uniform, M::Parameters, M::Time}) {
    EXPECT_HAS(error_of([&] { partition(spec, 16, m); }),
               "parallelism.pipeline × parallelism.virtual_stages = 16 model chunks but "
               "model.layers = 12");
  }
  EXPECT_EQ(parse_partition("time"), M::Time);
  EXPECT_HAS(error_of([] { parse_partition("even"); }),
             "parallelism.partition: unknown method 'even'; valid: uniform, parameters, time, "
             "explicit");
}

}  // namespace
}  // namespace strata::pipeline
