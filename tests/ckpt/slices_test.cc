// The arithmetic under layout-independent checkpoints (ckpt/slices.h), against an
// element-by-element reference: every kind of parameter of gpt2 and llama at tp 1, 2 and 4 (the
// vocabulary padded, key/value heads replicated at tp 4), whole local slices and any sub-range of
// them (ZeRO cuts mid-row), the runs that store the segments, and their bounds.
#include "strata/ckpt/slices.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/model/param_spec.h"

namespace strata::ckpt {
namespace {

// vocab 90: tp 4 pads it to 92 (the last rank holds 21 valid rows of 23); tp 2 does not.
ModelConfig tiny(const std::string& family) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 32, m.heads = 4, m.vocab = 90, m.seq_len = 16;
  m.kv_heads = family == "gpt2" ? 4 : 2;
  m.ffn_hidden = family == "gpt2" ? 128 : 64;
  m.tied_embeddings = family == "gpt2";
  return m;
}

int64_t global_numel(const ParamSpec& p) {
  int64_t n = 1;
  for (int64_t d : p.global_shape) n *= d;
  return n;
}

// Where local element i of p's slice goes in the global tensor, one element at a time:
// (global index, replicas), or (-1, 0) for padding.
std::pair<int64_t, int> reference(const ParamSpec& p, int64_t i) {
  if (p.split_axis < 0) return {i, p.replicas};
  const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  const int64_t row = i / cols, col = i % cols;
  int64_t at = p.split_axis == 0 ? row : col;  // the local index along the split axis
  for (const TpRange& r : p.ranges) {
    if (at < r.count) {
      const int64_t g = r.begin + at;
      return {p.split_axis == 0 ? g * gcols + col : row * gcols + g, r.replicas};
    }
    at -= r.count;
  }
  return {-1, 0};
}

// Checks segs = global_segments(p, begin, count) against the reference: in local order, not
// overlapping, maximal (no two adjacent could merge), every element mapped as the reference maps
// it, and exactly the padding left out.
void check_against_reference(const ParamSpec& p, int64_t begin, int64_t count,
                             const std::vector<Segment>& segs) {
  SCOPED_TRACE(p.name + " [" + std::to_string(begin) + ", +" + std::to_string(count) + ")");
  std::vector<char> covered(size_t(count), 0);
  for (size_t k = 0; k < segs.size(); ++k) {
    const Segment& s = segs[k];
    ASSERT_GE(s.len, 1);
    ASSERT_GE(s.local, 0);
    ASSERT_LE(s.local + s.len, count);
    if (k > 0) {
      const Segment& b = segs[k - 1];
      ASSERT_GE(s.local, b.local + b.len) << "segments out of local order or overlapping";
      EXPECT_FALSE(b.local + b.len == s.local && b.global + b.len == s.global &&
                   b.replicas == s.replicas)
          << "adjacent segments not merged at local " << s.local;
    }
    for (int64_t e = 0; e < s.len; ++e) {
      const auto [g, replicas] = reference(p, begin + s.local + e);
      ASSERT_EQ(s.global + e, g) << "local element " << begin + s.local + e;
      ASSERT_EQ(s.replicas, replicas) << "local element " << begin + s.local + e;
      covered[size_t(s.local + e)] = 1;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(covered[size_t(i)] != 0, reference(p, begin + i).first >= 0)
        << "local element " << begin + i
        << (covered[size_t(i)] ? " (padding) is mapped" : " is mapped nowhere");
  }
}

// The segments of the whole slice cut to [begin, begin + count), offsets from begin.
std::vector<Segment> clip(const std::vector<Segment>& whole, int64_t begin, int64_t count) {
  std::vector<Segment> out;
  for (const Segment& s : whole) {
    const int64_t lo = std::max(s.local, begin), hi = std::min(s.local + s.len, begin + count);
    if (lo < hi) out.push_back({s.global + (lo - s.local), lo - begin, hi - lo, s.replicas});
  }
  return out;
}

// The (global, len) pieces runs describe, in chunk order.
std::vector<std::pair<int64_t, int64_t>> expand(const std::vector<Run>& runs) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Run& r : runs) {
    for (int64_t q = 0; q < r.count; ++q) out.emplace_back(r.global + q * r.stride, r.len);
  }
  return out;
}

// compress(segs) describes the same pieces in the same order, each run well formed; run_bounds
// gives their extent and total.
void check_runs(const std::vector<Segment>& segs) {
  const std::vector<ckpt::Run> runs = compress(segs);
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t lo = INT64_MAX, hi = INT64_MIN, elements = 0;
  for (const Segment& s : segs) {
    pieces.emplace_back(s.global, s.len);
    lo = std::min(lo, s.global), hi = std::max(hi, s.global + s.len), elements += s.len;
  }
  if (segs.empty()) lo = hi = 0;
  // Consecutive pieces merge when they touch; compare element by element.
  auto elements_of = [](const std::vector<std::pair<int64_t, int64_t>>& v) {
    std::vector<int64_t> e;
    for (const auto& [g, len] : v) {
      for (int64_t i = 0; i < len; ++i) e.push_back(g + i);
    }
    return e;
  };
  EXPECT_EQ(elements_of(expand(runs)), elements_of(pieces));
  EXPECT_LE(runs.size(), segs.size());
  for (const Run& r : runs) {
    EXPECT_GE(r.len, 1);
    EXPECT_GE(r.count, 1);
    EXPECT_GE(r.stride, 0);
    if (r.count > 1) {
      EXPECT_GE(r.stride, r.len) << "a run's segments overlap";
    }
  }
  int64_t rlo, rhi, relements;
  run_bounds(runs, rlo, rhi, relements);
  EXPECT_EQ(rlo, lo);
  EXPECT_EQ(rhi, hi);
  EXPECT_EQ(relements, elements);
}

struct Case {
  std::string family;
  int tp;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* f : {"gpt2", "llama"}) {
    for (int tp : {1, 2, 4}) out.push_back({f, tp});
  }
  return out;
}

std::string name(const Case& c) {
  return c.family + " tp " + std::to_string(c.tp);
}

// Every parameter of every rank: the whole local slice maps as the reference does, and over the
// ranks each global element is covered exactly `replicas` times, by ranks that all say so.
TEST(Slices, WholeSlicesCoverEveryGlobalElementReplicasTimes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const ModelConfig m = tiny(c.family);
    std::map<std::string, std::vector<int>> cover, replicas;
    std::map<std::string, std::vector<int64_t>> shapes;
    std::set<ParamRole> roles;
    for (int rank = 0; rank < c.tp; ++rank) {
      const ModelSpec spec = build_model_spec(m, 1, c.tp, rank);
      for (const ParamSpec& p : spec.params) {
        roles.insert(p.role);
        const std::vector<Segment> segs = global_segments(p, 0, p.numel());
        check_against_reference(p, 0, p.numel(), segs);
        const int64_t n = global_numel(p);
        if (rank == 0) {
          shapes[p.name] = p.global_shape;
          cover[p.name].assign(size_t(n), 0);
          replicas[p.name].assign(size_t(n), 0);
        }
        ASSERT_EQ(shapes.at(p.name), p.global_shape) << p.name << " rank " << rank;
        std::vector<int>& cv = cover.at(p.name);
        std::vector<int>& rp = replicas.at(p.name);
        for (const Segment& s : segs) {
          ASSERT_GE(s.global, 0) << p.name;
          ASSERT_LE(s.global + s.len, n) << p.name;
          for (int64_t g = s.global; g < s.global + s.len; ++g) {
            if (cv[size_t(g)] == 0) rp[size_t(g)] = s.replicas;
            ASSERT_EQ(rp[size_t(g)], s.replicas) << p.name << " element " << g << " rank " << rank;
            ++cv[size_t(g)];
          }
        }
      }
    }
    EXPECT_EQ(roles.size(), size_t(c.family == "gpt2" ? 16 : 9)) << "every kind of parameter";
    for (const auto& [param, cv] : cover) {
      for (size_t g = 0; g < cv.size(); ++g) {
        ASSERT_GE(cv[g], 1) << param << " element " << g << " is stored by no rank";
        ASSERT_EQ(cv[g], replicas.at(param)[g]) << param << " element " << g;
      }
    }
  }
}

// The layouts the test means to reach: padding at tp 4, replicated key/value heads (llama, tp 4),
// replicated tensors.
TEST(Slices, TheCasesIncludePaddingAndReplicatedHeads) {
  const ModelSpec gpt2 = build_model_spec(tiny("gpt2"), 1, 4, 3);
  const ParamSpec& wte = gpt2.param("wte");
  EXPECT_EQ(wte.shape[0], 23);
  int64_t mapped = 0;
  for (const Segment& s : global_segments(wte, 0, wte.numel())) mapped += s.len;
  EXPECT_EQ(mapped, 21 * 32) << "two padding rows map nowhere";
  const ModelSpec llama = build_model_spec(tiny("llama"), 1, 4, 1);
  const ParamSpec& qkv = llama.param("layers.0.self_attn.qkv_proj.weight");
  ASSERT_EQ(qkv.ranges.size(), 2u);
  EXPECT_EQ(qkv.ranges[1].replicas, 2);
  const std::vector<Segment> segs = global_segments(qkv, 0, qkv.numel());
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].replicas, 1);
  EXPECT_EQ(segs[1].replicas, 2);
  EXPECT_EQ(llama.param("norm.weight").replicas, 4);
}

// Any sub-range [b, b + n) of a slice gives exactly the whole's segments cut to it: every single
// element, ZeRO's partitions of each unit (align 2, 4 and 8, cutting rows), and random ranges.
TEST(Slices, SubRangesGiveTheWholesSegmentsCut) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const ModelConfig m = tiny(c.family);
    for (int rank = 0; rank < c.tp; ++rank) {
      for (int64_t align : {1, 2, 4, 8}) {
        const ModelSpec spec = build_model_spec(m, align, c.tp, rank);
        // ZeRO's ranges: each unit cut into `align` equal parts, met with each parameter.
        std::vector<std::pair<int64_t, int64_t>> zero;  // flat [lo, hi)
        for (const UnitSpec& u : spec.units) {
          const int64_t part = u.numel / align;
          for (int64_t k = 0; k < align; ++k) {
            zero.emplace_back(u.offset + k * part, u.offset + (k + 1) * part);
          }
        }
        for (const ParamSpec& p : spec.params) {
          const int64_t n = p.numel();
          const std::vector<Segment> whole = global_segments(p, 0, n);
          std::vector<std::pair<int64_t, int64_t>> ranges;  // (begin, count)
          for (const auto& [lo, hi] : zero) {
            const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + n);
            if (a < b) ranges.emplace_back(a - p.offset, b - a);
          }
          if (align == 1) {
            for (int64_t i = 0; i < n; ++i) ranges.emplace_back(i, 1);
            ranges.emplace_back(0, 0);
            ranges.emplace_back(n, 0);
            const uint64_t key = rng_key(uint64_t(rank), p.name);
            for (uint64_t t = 0; t < 40; ++t) {
              const int64_t b = int64_t(rng_uniform(key, 2 * t) * float(n)) % n;
              const int64_t len = int64_t(rng_uniform(key, 2 * t + 1) * float(n - b + 1));
              ranges.emplace_back(b, std::min(len, n - b));
            }
          }
          for (const auto& [b, count] : ranges) {
            const std::vector<Segment> segs = global_segments(p, b, count);
            const std::vector<Segment> want = clip(whole, b, count);
            ASSERT_EQ(segs.size(), want.size()) << p.name << " [" << b << ", +" << count << ")";
            for (size_t k = 0; k < segs.size(); ++k) {
              ASSERT_EQ(segs[k].global, want[k].global) << p.name << " [" << b << ", +" << count;
              ASSERT_EQ(segs[k].local, want[k].local) << p.name << " [" << b << ", +" << count;
              ASSERT_EQ(segs[k].len, want[k].len) << p.name << " [" << b << ", +" << count;
              ASSERT_EQ(segs[k].replicas, want[k].replicas)
                  << p.name << " [" << b << ", +" << count;
            }
            if (align > 1 && count > 0) check_against_reference(p, b, count, segs);
          }
        }
      }
    }
  }
}

TEST(Slices, RangesOutsideTheSliceAreRefused) {
  const ModelSpec spec = build_model_spec(tiny("gpt2"), 1, 2, 0);
  const ParamSpec& p = spec.param("h.0.mlp.c_fc.weight");
  EXPECT_THROW(global_segments(p, -1, 2), Error);
  EXPECT_THROW(global_segments(p, 0, p.numel() + 1), Error);
  EXPECT_THROW(global_segments(p, p.numel(), 1), Error);
  EXPECT_THROW(global_segments(p, 4, -1), Error);
}

// Every slice's and sub-range's segments compress into runs that expand back to them; a column
// split (each row's columns, stride the global row) is one run.
TEST(Slices, CompressExpandsBackToTheSegments) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    for (int rank = 0; rank < c.tp; ++rank) {
      const ModelSpec spec = build_model_spec(tiny(c.family), 1, c.tp, rank);
      for (const ParamSpec& p : spec.params) {
        SCOPED_TRACE(p.name);
        check_runs(global_segments(p, 0, p.numel()));
        const int64_t n = p.numel();
        for (int64_t b : {int64_t(0), n / 3, n / 2 + 5}) {
          for (int64_t k : {int64_t(1), int64_t(7), n / 3 + 1}) {
            if (b + k <= n) check_runs(global_segments(p, b, k));
          }
        }
      }
      const ParamSpec& proj = spec.param(c.family == "gpt2" ? "h.1.attn.c_proj.weight"
                                                            : "layers.1.self_attn.o_proj.weight");
      const std::vector<ckpt::Run> runs = compress(global_segments(proj, 0, proj.numel()));
      ASSERT_EQ(runs.size(), 1u);
      if (c.tp > 1) {
        EXPECT_EQ(runs[0].count, 32);
        EXPECT_EQ(runs[0].len, 32 / c.tp);
        EXPECT_EQ(runs[0].stride, 32);
        EXPECT_EQ(runs[0].global, rank * 32 / c.tp);
      } else {
        EXPECT_EQ(runs[0].len, 32 * 32) << "a whole tensor is one segment";
      }
    }
  }
}

// Segments in any order (compress does not rely on global_segments' ascending order): runs never
// get a negative stride, which the manifest would refuse.
TEST(Slices, CompressKeepsStridesNonNegative) {
  const std::vector<Segment> descending = {{40, 0, 4}, {20, 4, 4}, {0, 8, 4}};
  check_runs(descending);
  const std::vector<Segment> mixed = {{10, 0, 2}, {0, 2, 2}, {4, 4, 2}, {8, 6, 2}, {30, 8, 3}};
  check_runs(mixed);
  const std::vector<ckpt::Run> runs = compress(mixed);
  ASSERT_EQ(runs.size(), 3u);  // {10}, {0, 4, 8} stride 4, {30}
  EXPECT_EQ(runs[1].global, 0);
  EXPECT_EQ(runs[1].count, 3);
  EXPECT_EQ(runs[1].stride, 4);
}

TEST(Slices, RunBounds) {
  int64_t lo, hi, n;
  run_bounds({}, lo, hi, n);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 0);
  EXPECT_EQ(n, 0);
  run_bounds({{100, 3, 4, 10}}, lo, hi, n);  // 100..103, 110..113, 120..123, 130..133
  EXPECT_EQ(lo, 100);
  EXPECT_EQ(hi, 133);
  EXPECT_EQ(n, 12);
  run_bounds({{50, 5, 1, 999}, {7, 2, 3, 20}}, lo, hi, n);  // a lone segment's stride is unused
  EXPECT_EQ(lo, 7);
  EXPECT_EQ(hi, 55);
  EXPECT_EQ(n, 11);
}

}  // namespace
}  // namespace strata::ckpt
