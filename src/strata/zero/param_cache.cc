#include "strata/zero/param_cache.h"

#include <algorithm>
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
  step_ = index(o.step_order.empty() ? one_micro_order(spec, o.recompute_full) : o.step_order);
  eval_ = index(o.eval_order.empty() ? forward_order(spec, o.recompute_full) : o.eval_order);
  o_.step_order = {}, o_.eval_order = {};  // kept indexed
  use(step_);
}

ParamCache::Order ParamCache::index(GatherOrder o) const {
  Order r;
  r.uses.resize(units_.size());
  r.before.reserve(o.units.size() + 1);
  r.before.push_back(0);
  for (size_t j = 0; j < o.units.size(); ++j) {
    const int u = o.units[j];
    STRATA_CHECK(u >= 0 && size_t(u) < units_.size(), "ZeRO stage 3: the gather order names unit ",
                 u, " of a model of ", units_.size());
    r.uses[size_t(u)].push_back(int(j));
    r.before.push_back(r.before.back() + units_[size_t(u)].numel);
  }
  for (size_t p = 0; p < o.passes.size(); ++p) {
    STRATA_CHECK(
        o.passes[p].at <= o.units.size() && (p == 0 || o.passes[p - 1].at <= o.passes[p].at),
        "ZeRO stage 3: the gather order's passes are not in order");
  }
  STRATA_CHECK(!o.passes.empty() && o.passes.front().at == 0,
               "ZeRO stage 3: a gather order starts with a pass");
  r.order = std::move(o);
  return r;
}

// Follows `o` from its start; units still resident stay so (each order begins after drop_all,
// or an evaluation after a step).
void ParamCache::use(const Order& o) {
  now_ = &o;
  trace_ = &o.order.units;
  pos_ = 0, next_pass_ = 0;
}

char* ParamCache::slot_data(const State& st) const {
  return slots_ + size_t(st.slot) * size_t(slot_elems_) * ps_;
}

int ParamCache::next_use(int unit, size_t from) const {
  const std::vector<int>& u = now_->uses[size_t(unit)];
  const auto it = std::lower_bound(u.begin(), u.end(), int(from));
  return it == u.end() ? -1 : *it;
}

int64_t ParamCache::distance(size_t from, size_t to) const {
  return now_->before[to] - now_->before[from];
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
      if (nu < 0) nu = int64_t(trace_->size());
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
  for (size_t j = pos_; j < trace_->size(); ++j) {
    const int u = (*trace_)[j];
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
  const std::vector<GatherOrder::PassStart>& passes = now_->order.passes;
  if (next_pass_ == passes.size() && pos_ == trace_->size()) pos_ = 0, next_pass_ = 0;  // again
  const bool ok = next_pass_ < passes.size() && passes[next_pass_].at == pos_ &&
                  passes[next_pass_].pass == pass;
  STRATA_CHECK(ok, "ZeRO stage 3: a ", pass == UnitHook::Pass::Forward ? "forward" : "backward",
               " pass began at acquire ", pos_, " of ", trace_->size(), " (pass ", next_pass_,
               " of ", passes.size(),
               "), out of the static gather order (a model/schedule/trace mismatch)");
  ++next_pass_;
}

const void* ParamCache::acquire(int unit) {
  const std::vector<GatherOrder::PassStart>& passes = now_->order.passes;
  const size_t pass_end = next_pass_ < passes.size() ? passes[next_pass_].at : trace_->size();
  STRATA_CHECK(pos_ < pass_end && (*trace_)[pos_] == unit,
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
  if (next < 0) return evict(unit);
  if (o_.reshard_after_forward && distance(pos_, size_t(next)) > o_.max_reuse_distance) {
    evict(unit);
  }
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
