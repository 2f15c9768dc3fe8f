#include "strata/zero/param_cache.h"

#include <chrono>

#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata {

ParamCache::ParamCache(const ModelSpec& spec, const ZeroOptions& o, const ZeroBuffers& bufs,
                       size_t elem_bytes, char* slots, std::vector<char*> persistent, Gather gather)
    : units_(spec.units),
      o_(o),
      ps_(elem_bytes),
      slot_elems_(bufs.param_slot_elems),
      slots_(slots),
      persistent_(std::move(persistent)),
      issue_(std::move(gather)),
      state_(spec.units.size()),
      released_(size_t(bufs.param_slot_count)) {
  STRATA_CHECK(persistent_.size() == units_.size(), "one persistent entry per unit");
  for (int k = bufs.param_slot_count - 1; k >= 0; --k) free_slots_.push_back(k);
  RecomputeOptions rc;
  rc.full = o.recompute_full;
  trace_ = param_trace(spec, UnitHook::Pass::Forward, rc);
  forward_len_ = trace_.size();
  for (int u : param_trace(spec, UnitHook::Pass::Backward, rc)) trace_.push_back(u);
}

char* ParamCache::slot_data(const State& st) const {
  return slots_ + size_t(st.slot) * size_t(slot_elems_) * ps_;
}

int ParamCache::next_use(int unit, size_t from) const {
  for (size_t j = from; j < trace_.size(); ++j) {
    if (trace_[j] == unit) return int(j);
  }
  return -1;
}

int64_t ParamCache::distance(size_t from, size_t to) const {
  int64_t d = 0;
  for (size_t j = from; j < to; ++j) d += units_[size_t(trace_[j])].numel;
  return d;
}

void ParamCache::evict(int unit) {
  State& st = state_[size_t(unit)];
  st.gather.wait();
  st.gathering = st.prefetched = false;
  released_[size_t(st.slot)] = ops::record(ops::compute_stream());
  free_slots_.push_back(st.slot);
  st.slot = -1;
  live_ -= units_[size_t(unit)].numel;
}

// Frees a buffer, and room under max_live, by evicting resident units nobody holds, the one used
// farthest ahead first. A prefetch (`must` false) gives up rather than evict a unit needed no
// later than its own use at trace position use_at; an acquire may go over max_live when nothing
// is left to evict (the unit it needs is gathered regardless).
bool ParamCache::make_room(int unit, int64_t use_at, bool must) {
  const int64_t need = units_[size_t(unit)].numel;
  for (;;) {
    const bool need_slot = free_slots_.empty();
    const bool need_live = live_ + need > o_.max_live;
    if (!need_slot && !need_live) return true;
    int victim = -1;
    int64_t victim_use = -1;
    for (size_t u = 0; u < state_.size(); ++u) {
      const State& st = state_[u];
      if (st.slot < 0 || st.refs > 0 || st.prefetched) continue;
      int64_t nu = next_use(int(u), pos_);
      if (nu < 0) nu = int64_t(trace_.size());
      if (nu > victim_use) victim = int(u), victim_use = nu;
    }
    if (victim < 0 || (!must && victim_use <= use_at)) {
      if (!must) return false;
      STRATA_CHECK(!need_slot, "ZeRO stage 3: no free buffer to gather ", units_[size_t(unit)].name,
                   " into");
      return true;
    }
    evict(victim);
  }
}

void ParamCache::gather(int unit) {
  State& st = state_[size_t(unit)];
  st.slot = free_slots_.back();
  free_slots_.pop_back();
  live_ += units_[size_t(unit)].numel;
  peak_live_ = std::max(peak_live_, live_);
  st.gather = issue_(unit, slot_data(st), released_[size_t(st.slot)]);
  st.gathering = true;
}

// Issues gathers for the units next in the trace, in trace order, while the prefetch budget,
// max_live and the buffers allow.
void ParamCache::prefetch() {
  int64_t ahead = 0;  // elements gathered ahead and not yet acquired
  for (size_t u = 0; u < state_.size(); ++u) {
    if (state_[u].prefetched) ahead += units_[u].numel;
  }
  for (size_t j = pos_; j < trace_.size(); ++j) {
    const int u = trace_[j];
    State& st = state_[size_t(u)];
    if (persistent_[size_t(u)] != nullptr || st.slot >= 0) continue;
    const int64_t n = units_[size_t(u)].numel;
    if (ahead + n > o_.prefetch_elems || !make_room(u, int64_t(j), false)) return;
    gather(u);
    st.prefetched = true;
    ahead += n;
  }
}

void ParamCache::begin_pass(UnitHook::Pass pass) {
  pos_ = pass == UnitHook::Pass::Forward ? 0 : forward_len_;
}

const void* ParamCache::acquire(int unit) {
  STRATA_CHECK(pos_ < trace_.size() && trace_[pos_] == unit,
               "ZeRO stage 3: ", units_[size_t(unit)].name,
               " was acquired out of the static gather order (a model/trace mismatch)");
  ++pos_;
  if (persistent_[size_t(unit)] != nullptr) {
    prefetch();  // a pass may open with persistent units: start the next gathers now
    return persistent_[size_t(unit)];
  }
  State& st = state_[size_t(unit)];
  if (st.slot < 0) {
    make_room(unit, int64_t(pos_ - 1), true);
    gather(unit);
  }
  if (st.gathering) {
    const auto t0 = std::chrono::steady_clock::now();
    ops::wait(ops::compute_stream(), st.gather.event());  // the unit's forward or backward reads it
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.gathering = false;
  }
  st.prefetched = false;
  ++st.refs;
  prefetch();
  return slot_data(st);
}

void ParamCache::release(int unit) {
  if (persistent_[size_t(unit)] != nullptr) return;
  State& st = state_[size_t(unit)];
  STRATA_CHECK(st.refs > 0, "ZeRO stage 3: ", units_[size_t(unit)].name,
               " released more often than acquired");
  if (--st.refs > 0) return;
  const int next = next_use(unit, pos_);
  if (next < 0 || distance(pos_, size_t(next)) > o_.max_reuse_distance) evict(unit);
}

void ParamCache::drop_all() {
  for (size_t u = 0; u < state_.size(); ++u) {
    if (state_[u].slot < 0) continue;
    STRATA_CHECK(state_[u].refs == 0, "ZeRO stage 3: ", units_[u].name,
                 " is still held at the end of the step");
    evict(int(u));
  }
}

bool ParamCache::in_flight() const {
  for (const State& st : state_) {
    if (!st.gather.done()) return true;
  }
  return false;
}

}  // namespace strata
