// ZeRO's partition arithmetic and stage-3 parameter cache without MPI: gathers are copies from a
// whole parameter buffer, completed at once.
#include "strata/zero/param_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/zero/partition.h"

namespace strata {
namespace {

ModelConfig wide_gpt2() {
  ModelConfig m;
  m.family = "gpt2";
  m.layers = 2, m.hidden = 32, m.heads = 4, m.ffn_hidden = 128, m.vocab = 1000, m.seq_len = 16;
  return m;
}

// Every element of the model belongs to exactly one rank's owned chunk, each parameter element to
// exactly one owned range, and the ranges sit in the packed partition where packed_offset says.
TEST(ZeroPartition, ChunksTileEveryUnit) {
  const int G = 4;
  const ModelSpec spec = build_model_spec(wide_gpt2(), G);
  std::vector<int> owner(size_t(spec.numel), -1);
  int64_t params = 0;
  for (int r = 0; r < G; ++r) {
    const ZeroPartition part(spec, r, G);
    EXPECT_EQ(part.owned_numel(), spec.numel / G);
    for (int u = 0; u < int(spec.units.size()); ++u) {
      for (int64_t i = part.chunk_begin(u); i < part.chunk_begin(u) + part.chunk(u); ++i) {
        EXPECT_EQ(owner[size_t(i)], -1);
        owner[size_t(i)] = r;
      }
    }
    for (const ParamRange& pr : part.owned_ranges()) {
      params += pr.numel;
      int u = 0;
      while (spec.units[size_t(u)].offset + spec.units[size_t(u)].numel <= pr.offset) ++u;
      EXPECT_EQ(pr.state_offset, part.packed_offset(u) + (pr.offset - part.chunk_begin(u)));
    }
  }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
  EXPECT_EQ(params, spec.param_numel);
}

struct Harness {
  ModelSpec spec = build_model_spec(wide_gpt2(), 1);
  ZeroOptions o;
  std::vector<float> whole, slots, persistent;
  std::vector<int> gathered;  // units, in the order their gathers were issued
  std::unique_ptr<ParamCache> cache;

  explicit Harness(ZeroOptions opts) : o(opts) {
    o.stage = 3;
    whole.resize(size_t(spec.numel));
    for (size_t i = 0; i < whole.size(); ++i) whole[i] = float(i);
    const ZeroBuffers b = zero_buffers(spec, 1, o);
    slots.assign(size_t(b.param_slot_count * b.param_slot_elems), -1.0f);
    persistent.resize(size_t(b.persistent / 4));
    std::vector<char*> pers(spec.units.size(), nullptr);
    size_t at = 0;
    for (size_t u = 0; u < spec.units.size(); ++u) {
      if (!persistent_unit(spec.units[u], o)) continue;
      pers[u] = reinterpret_cast<char*>(persistent.data() + at);
      std::memcpy(persistent.data() + at, whole.data() + spec.units[u].offset,
                  size_t(spec.units[u].numel) * 4);
      at += size_t(spec.units[u].numel);
    }
    cache = std::make_unique<ParamCache>(
        spec, o, b, 4, reinterpret_cast<char*>(slots.data()), pers,
        [this](int unit, void* dst, const ops::Event& released) {
          EXPECT_TRUE(released.done());  // on the CPU the slot's last reader has returned
          gathered.push_back(unit);
          std::memcpy(dst, whole.data() + spec.units[size_t(unit)].offset,
                      size_t(spec.units[size_t(unit)].numel) * 4);
          return comm::Handle{};
        });
  }

  // One forward and one backward pass as the model makes them; every acquire must see the
  // unit's own values.
  void step() {
    for (UnitHook::Pass pass : {UnitHook::Pass::Forward, UnitHook::Pass::Backward}) {
      cache->begin_pass(pass);
      for (int u : param_trace(spec, pass)) {
        const float* p = static_cast<const float*>(cache->acquire(u));
        const UnitSpec& unit = spec.units[size_t(u)];
        ASSERT_EQ(p[0], whole[size_t(unit.offset)]) << unit.name;
        ASSERT_EQ(p[unit.numel - 1], whole[size_t(unit.offset + unit.numel - 1)]) << unit.name;
        cache->release(u);
      }
    }
    cache->drop_all();
  }
};

TEST(ParamCache, EveryAcquireSeesItsUnit) {
  for (int64_t prefetch : {int64_t(1), int64_t(10000), int64_t(1) << 40}) {
    for (int64_t reuse : {int64_t(0), int64_t(1) << 40}) {
      ZeroOptions o;
      o.prefetch_elems = prefetch, o.max_reuse_distance = reuse, o.persistence_threshold = 600;
      Harness h(o);
      h.step();
      h.step();
      EXPECT_FALSE(h.cache->in_flight());
    }
  }
}

// Gathers run ahead of the acquires by up to the prefetch bucket, and every gathered unit is
// gathered in a step (the order may skip a unit still resident when the prefetch passes it).
TEST(ParamCache, GathersFollowTheTraceAndRunAheadByThePrefetchBucket) {
  ZeroOptions o;
  o.prefetch_elems = 20000, o.max_reuse_distance = 0, o.persistence_threshold = 600;
  Harness h(o);
  std::vector<int> want;
  for (UnitHook::Pass pass : {UnitHook::Pass::Forward, UnitHook::Pass::Backward}) {
    for (int u : param_trace(h.spec, pass)) {
      if (!persistent_unit(h.spec.units[size_t(u)], o)) want.push_back(u);
    }
  }
  h.cache->begin_pass(UnitHook::Pass::Forward);
  const int first = param_trace(h.spec, UnitHook::Pass::Forward).front();
  h.cache->acquire(first);
  // The first unit (8192 elements) plus what fits in 20000 elements ahead: two more units.
  EXPECT_EQ(h.gathered.size(), 3u);
  h.cache->release(first);
  h.gathered.clear();
  h.cache->drop_all();
  h.cache->begin_step();
  h.step();
  for (int u : want)
    EXPECT_NE(std::find(h.gathered.begin(), h.gathered.end(), u), h.gathered.end());
}

TEST(ParamCache, MaxLiveBoundsResidentUnits) {
  ZeroOptions o;
  o.prefetch_elems = int64_t(1) << 40, o.persistence_threshold = 0;
  int64_t largest = 0;
  const ModelSpec spec = build_model_spec(wide_gpt2(), 1);
  for (const UnitSpec& u : spec.units) largest = std::max(largest, u.numel);
  o.max_live = largest;
  Harness h(o);
  h.step();
  EXPECT_LE(h.cache->peak_live_elements(), largest);
  ZeroOptions unlimited = o;
  unlimited.max_live = int64_t(1) << 40;
  Harness u(unlimited);
  u.step();
  EXPECT_GT(u.cache->peak_live_elements(), largest);
}

// A pipeline stage's step as GPipe runs it: the forwards of `micro` micro-batches, then their
// backwards (each pass the whole model's, as one chunk).
GatherOrder gpipe_order(const ModelSpec& spec, int micro) {
  GatherOrder o;
  for (UnitHook::Pass pass : {UnitHook::Pass::Forward, UnitHook::Pass::Backward}) {
    for (int m = 0; m < micro; ++m) {
      o.passes.push_back({pass, o.units.size()});
      for (int u : param_trace(spec, pass)) o.units.push_back(u);
    }
  }
  return o;
}

// Runs the passes of `order`, each acquire checking its unit's values.
void run_order(Harness& h, const GatherOrder& order) {
  h.cache->begin_step();
  for (size_t p = 0; p < order.passes.size(); ++p) {
    h.cache->begin_pass(order.passes[p].pass);
    const size_t end = p + 1 < order.passes.size() ? order.passes[p + 1].at : order.units.size();
    for (size_t j = order.passes[p].at; j < end; ++j) {
      const int u = order.units[j];
      const float* x = static_cast<const float*>(h.cache->acquire(u));
      const UnitSpec& unit = h.spec.units[size_t(u)];
      ASSERT_EQ(x[0], h.whole[size_t(unit.offset)]) << unit.name;
      ASSERT_EQ(x[unit.numel - 1], h.whole[size_t(unit.offset + unit.numel - 1)]) << unit.name;
      h.cache->release(u);
    }
  }
  h.cache->drop_all();
}

// Over a step of several micro-batches' passes (a pipeline stage's order): with
// reshard_after_forward each unit is gathered again for every pass that reads it (reuse distance
// 0); without it each unit is gathered once per step, every buffer it needs being allocated.
TEST(ParamCache, ReshardAfterForwardDecidesGathersPerStep) {
  const int micro = 4;
  for (bool reshard : {true, false}) {
    ZeroOptions o;
    o.prefetch_elems = 20000, o.max_reuse_distance = 0, o.persistence_threshold = 600;
    o.reshard_after_forward = reshard;
    const ModelSpec spec = build_model_spec(wide_gpt2(), 1);
    o.step_order = gpipe_order(spec, micro);
    Harness h(o);
    for (int step = 0; step < 2; ++step) {
      h.gathered.clear();
      run_order(h, o.step_order);
      int gathered_units = 0;
      for (const UnitSpec& u : spec.units) gathered_units += persistent_unit(u, h.o) ? 0 : 1;
      if (reshard) {
        // Every acquire of a non-persistent unit gathers it, but where the acquire before it
        // (the last pass's, with tied embeddings) read the same unit.
        size_t want = 0;
        const std::vector<int>& units = o.step_order.units;
        for (size_t j = 0; j < units.size(); ++j) {
          const bool again = j > 0 && units[j - 1] == units[j];
          want += !persistent_unit(spec.units[size_t(units[j])], h.o) && !again ? 1 : 0;
        }
        EXPECT_EQ(h.gathered.size(), want) << "step " << step;
        EXPECT_GT(want, size_t(2 * micro)) << "the test needs re-gathers";
      } else {
        EXPECT_EQ(h.gathered.size(), size_t(gathered_units)) << "step " << step;
        std::vector<int> sorted = h.gathered;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
      }
    }
    EXPECT_FALSE(h.cache->in_flight());
  }
}

// The step's order is followed pass by pass: a pass of the wrong kind, or one begun before the
// previous pass's acquires are done, is refused.
TEST(ParamCache, RefusesPassesOutOfOrder) {
  ZeroOptions o;
  const ModelSpec spec = build_model_spec(wide_gpt2(), 1);
  o.step_order = gpipe_order(spec, 2);
  {
    Harness h(o);
    h.cache->begin_pass(UnitHook::Pass::Forward);
    EXPECT_THROW(h.cache->begin_pass(UnitHook::Pass::Forward), std::exception)
        << "the first forward acquired nothing";
  }
  {
    Harness h(o);
    h.cache->begin_pass(UnitHook::Pass::Forward);
    for (int u : param_trace(spec, UnitHook::Pass::Forward))
      h.cache->acquire(u), h.cache->release(u);
    EXPECT_THROW(h.cache->begin_pass(UnitHook::Pass::Backward), std::exception)
        << "GPipe's second forward comes before any backward";
  }
  {
    Harness h(o);
    h.cache->begin_pass(UnitHook::Pass::Forward);
    const std::vector<int> fwd = param_trace(spec, UnitHook::Pass::Forward);
    for (int u : fwd) h.cache->acquire(u), h.cache->release(u);
    EXPECT_THROW(h.cache->acquire(fwd.front()), std::exception)
        << "the next pass's acquire before its begin_pass";
  }
}

TEST(ParamCache, RefusesAcquiresOutOfOrder) {
  Harness h(ZeroOptions{});
  h.cache->begin_pass(UnitHook::Pass::Forward);
  const std::vector<int> trace = param_trace(h.spec, UnitHook::Pass::Forward);
  EXPECT_THROW(h.cache->acquire(trace[1]), std::exception);
}

}  // namespace
}  // namespace strata
