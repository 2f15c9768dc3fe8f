// Sharded parameter specs (param_spec.h): every tensor-parallel rank's slices, put back at their
// global indices, give the serial model's initial weights bit for bit; the fused weights are laid
// out so that a rank's slice is one block of rows; the canonical order is the Hugging Face one.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "strata/model/param_spec.h"

namespace strata {
namespace {

ModelConfig model(const std::string& family, int kv_heads, int vocab) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 64, m.heads = 8, m.vocab = vocab, m.seq_len = 16;
  m.kv_heads = family == "gpt2" ? 8 : kv_heads;
  m.ffn_hidden = family == "gpt2" ? 256 : 96;
  m.tied_embeddings = family == "gpt2";
  return m;
}

std::vector<float> init(const ParamSpec& p) {
  std::vector<float> v(size_t(p.numel()));
  init_param_slice(v.data(), p, 1234, 0, p.numel());
  return v;
}

// Every rank's slices of every parameter, at their global indices, equal tp = 1's tensors.
void expect_slices_rebuild_serial(const ModelConfig& m, int tp) {
  const ModelSpec serial = build_model_spec(m);
  for (size_t i = 0; i < serial.params.size(); ++i) {
    const ParamSpec& g = serial.params[i];
    const std::vector<float> want = init(g);
    const int64_t rows = g.global_shape[0], cols = g.numel() / rows;
    std::vector<float> got(want.size(), -1.0f);
    std::vector<int> holders(want.size(), 0);
    for (int r = 0; r < tp; ++r) {
      const ModelSpec spec = build_model_spec(m, 1, tp, r);
      const ParamSpec& p = spec.params[i];
      ASSERT_EQ(p.name, g.name);
      ASSERT_EQ(p.global_shape, g.global_shape) << p.name;
      const std::vector<float> local = init(p);
      const int64_t lcols = p.shape.size() > 1 ? p.shape[1] : 1;
      // Local index along the split axis -> global.
      std::vector<int64_t> map;
      for (const TpRange& rg : p.ranges) {
        for (int64_t k = 0; k < rg.count; ++k) map.push_back(rg.begin + k);
      }
      for (int64_t lr = 0; lr < p.shape[0]; ++lr) {
        for (int64_t lc = 0; lc < lcols; ++lc) {
          const float v = local[size_t(lr * lcols + lc)];
          int64_t gr = lr, gc = lc;
          if (p.split_axis == 0) {
            if (lr >= int64_t(map.size())) {  // vocabulary padding
              EXPECT_EQ(v, 0.0f) << p.name;
              continue;
            }
            gr = map[size_t(lr)];
          } else if (p.split_axis == 1) {
            gc = map[size_t(lc)];
          }
          const size_t at = size_t(gr * cols + gc);
          if (holders[at]++ > 0) {
            EXPECT_EQ(std::memcmp(&got[at], &v, 4), 0) << p.name << " replicas differ";
          }
          got[at] = v;
        }
      }
    }
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_GE(holders[k], 1) << g.name << " element " << k << " held by no rank at tp=" << tp;
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
        << g.name << " at tp=" << tp;
  }
}

TEST(TensorParallelSpec, SlicesOfEveryRankRebuildTheSerialInitialWeights) {
  for (int tp : {2, 4, 8}) {
    expect_slices_rebuild_serial(model("gpt2", 8, 100), tp);  // vocabulary padded at tp 8
    expect_slices_rebuild_serial(model("llama", 4, 96), tp);  // kv replicated at tp 8
    expect_slices_rebuild_serial(model("llama", 2, 97), tp);  // kv replicated at tp 4, 8
  }
}

// The slices of the fused weights are single blocks of rows where kv_heads >= tp, and every
// rank's unit structure is the same (ZeRO partitions each rank's flat buffer alike).
TEST(TensorParallelSpec, FusedSlicesAreContiguousAndUnitsAgree) {
  const ModelConfig m = model("llama", 4, 96);
  for (int tp : {2, 4}) {
    const ModelSpec r0 = build_model_spec(m, 4, tp, 0);
    for (int r = 0; r < tp; ++r) {
      const ModelSpec spec = build_model_spec(m, 4, tp, r);
      ASSERT_EQ(spec.units.size(), r0.units.size());
      EXPECT_EQ(spec.numel, r0.numel);
      for (const ParamSpec& p : spec.params) {
        if (p.fused == Fused::None) continue;
        ASSERT_EQ(p.ranges.size(), 1u) << p.name;
        EXPECT_EQ(p.ranges[0].begin, r * p.ranges[0].count) << p.name;
      }
    }
  }
  // kv_heads < tp: a query block of one group plus that group's key and value heads, the latter
  // held by tp / kv_heads ranks.
  const ModelSpec s = build_model_spec(model("llama", 2, 96), 1, 4, 3);
  const ParamSpec& qkv = s.param("layers.0.self_attn.qkv_proj.weight");
  ASSERT_EQ(qkv.ranges.size(), 2u);
  const int64_t hd = 8, group = (4 + 2) * hd;      // 4 query heads per group
  EXPECT_EQ(qkv.ranges[0].begin, group + 2 * hd);  // group 1, query heads 2-3
  EXPECT_EQ(qkv.ranges[1].begin, group + 4 * hd);  // group 1's key and value heads
  EXPECT_EQ(qkv.ranges[1].replicas, 2);
  EXPECT_EQ(s.tp.groups, 1);
  EXPECT_EQ(s.tp.rep, 2);
}

// The fused rows map onto the Hugging Face order: QKV [queries | keys | values], gate|up
// [gate | up].
TEST(TensorParallelSpec, CanonicalRowsAreHuggingFaceOrder) {
  const ModelSpec s = build_model_spec(model("llama", 2, 96));
  const ParamSpec& qkv = s.param("layers.0.self_attn.qkv_proj.weight");
  const int64_t hd = 8;                           // 8 heads of 8; 2 groups of 4 query heads
  EXPECT_EQ(canonical_row(qkv, 0), 0);            // group 0, query head 0
  EXPECT_EQ(canonical_row(qkv, 4 * hd), 8 * hd);  // group 0's key head
  EXPECT_EQ(canonical_row(qkv, 5 * hd + 3), 10 * hd + 3);   // group 0's value head
  EXPECT_EQ(canonical_row(qkv, 6 * hd), 4 * hd);            // group 1, query head 4
  EXPECT_EQ(canonical_row(qkv, 11 * hd + 1), 11 * hd + 1);  // group 1's value head
  const ParamSpec& fc = s.param("layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(canonical_row(fc, 0), 0);
  EXPECT_EQ(canonical_row(fc, 1), 96);
  EXPECT_EQ(canonical_row(fc, 5), 96 + 2);
}

// Vocabulary padding: rows past the vocabulary are zero, never counted in the parameter count.
TEST(TensorParallelSpec, VocabularyIsPaddedToAMultipleOfTp) {
  const ModelConfig m = model("gpt2", 8, 100);
  const ModelSpec serial = build_model_spec(m);
  for (int tp : {4, 8}) {
    for (int r = 0; r < tp; ++r) {
      const ModelSpec s = build_model_spec(m, 1, tp, r);
      EXPECT_EQ(s.tp.vocab_padded % tp, 0);
      EXPECT_EQ(s.tp.vocab_rows * tp, s.tp.vocab_padded);
      EXPECT_EQ(s.global_param_numel, serial.global_param_numel);
    }
  }
  EXPECT_EQ(build_model_spec(m, 1, 8, 7).tp.vocab_valid, 100 - 7 * 13);
}

}  // namespace
}  // namespace strata
