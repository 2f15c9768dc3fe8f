#include "strata/zero/zero_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "strata/core/check.h"
#include "strata/kernels/cpu/optimizer.h"

namespace strata {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

template <typename G>
void add_into(G* dst, const G* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<G>(to_f32(dst[i]) + to_f32(src[i]));
}

// dst += src, n elements of dtype t.
void accumulate(void* dst, const void* src, DType t, int64_t n) {
  switch (t) {
    case DType::F32:
      return add_into(static_cast<float*>(dst), static_cast<const float*>(src), n);
    case DType::BF16:
      return add_into(static_cast<bf16*>(dst), static_cast<const bf16*>(src), n);
    case DType::F16:
      return add_into(static_cast<f16*>(dst), static_cast<const f16*>(src), n);
  }
  STRATA_FAIL("no gradient accumulation for ", dtype_name(t));
}

// Pools of parameter buffers at stage 3: the embedding, the head, the blocks.
constexpr int kEmbeddingPool = 0, kHeadPool = 1, kBlockPool = 2;

int pool_of(int unit, int units) {
  return unit == 0 ? kEmbeddingPool : unit == units - 1 ? kHeadPool : kBlockPool;
}

// Stages 2-3: two block gradient buffers alternate so that one reduces while backward fills the
// other (overlap_comm); without overlap each reduction is waited at once and one is enough.
int grad_block_slots(int units, const ZeroOptions& o) {
  return std::min(o.overlap ? 2 : 1, units - 2);
}

bool persistent_unit(const UnitSpec& u, const ZeroOptions& o) {
  return u.numel <= o.persistence_threshold;
}

}  // namespace

ZeroBuffers zero_buffers(const ModelSpec& spec, int shard_size, const ZeroOptions& o) {
  ZeroBuffers b;
  const int64_t ps = int64_t(dtype_size(o.param_dtype)), gs = int64_t(dtype_size(o.grad_dtype));
  const int n = int(spec.units.size());
  int64_t max_block = 0;
  for (int u = 1; u < n - 1; ++u) max_block = std::max(max_block, spec.units[size_t(u)].numel);
  if (o.stage >= 2) {
    b.grad_partition = spec.numel / shard_size * gs;
    b.grad_block_elems = max_block;
    b.grad_slots =
        (spec.units.front().numel + spec.units.back().numel + grad_block_slots(n, o) * max_block) *
        gs;
  }
  if (o.stage == 3) {
    b.param_partition = spec.numel / shard_size * ps;
    int64_t gathered_block = 0, gathered_blocks = 0;
    for (int u = 0; u < n; ++u) {
      const UnitSpec& unit = spec.units[size_t(u)];
      if (persistent_unit(unit, o)) {
        b.persistent += unit.numel * ps;
      } else if (pool_of(u, n) != kBlockPool) {
        b.param_slots += unit.numel * ps;
      } else {
        gathered_block = std::max(gathered_block, unit.numel);
        ++gathered_blocks;
      }
    }
    if (gathered_blocks > 0) {
      int64_t k = 1 + o.prefetch_elems / gathered_block;
      k = std::min(k, std::max<int64_t>(1, o.max_live / gathered_block));
      b.block_param_slots = int(std::min(k, gathered_blocks));
      b.param_block_elems = gathered_block;
      b.param_slots += b.block_param_slots * gathered_block * ps;
    }
  }
  return b;
}

ZeroSync::ZeroSync(comm::Communicator& shard, comm::Communicator* replicas, const ModelSpec& spec,
                   const ZeroOptions& o, void* full_params, void* full_grads)
    : shard_(shard),
      replicas_(replicas),
      rank_(shard.rank()),
      size_(shard.size()),
      stage_(o.stage),
      o_(o),
      ps_(dtype_size(o.param_dtype)),
      gs_(dtype_size(o.grad_dtype)),
      units_(spec.units),
      bufs_(zero_buffers(spec, shard.size(), o)),
      full_params_(static_cast<char*>(full_params)),
      full_grads_(static_cast<char*>(full_grads)) {
  STRATA_CHECK(stage_ >= 1 && stage_ <= 3, "ZeroSync runs stages 1-3, got ", stage_);
  STRATA_CHECK(spec.align % size_ == 0, "ZeRO over ", size_,
               " ranks needs a model spec aligned to a multiple of ", size_, ", got ", spec.align);
  STRATA_CHECK((full_params_ != nullptr) == (stage_ < 3),
               "ZeRO: flat parameters are given exactly below stage 3");
  STRATA_CHECK((full_grads_ != nullptr) == (stage_ == 1),
               "ZeRO: flat gradients are given exactly at stage 1");
  for (const UnitSpec& u : units_) {
    const int64_t c = u.numel / size_;
    const int64_t begin = u.offset + rank_ * c, end = begin + c;
    for (int i : u.params) {
      const ParamSpec& p = spec.params[size_t(i)];
      const int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel());
      if (b < e) owned_ranges_.push_back({b, e - b, p.decay, owned_numel_ + (b - begin)});
    }
    owned_numel_ += c;
  }
  const int n = int(units_.size());
  pending_.resize(units_.size());
  gathers_.resize(units_.size());
  if (stage_ >= 2) {
    grad_part_buf_ = Buffer(MemCategory::Grads, size_t(bufs_.grad_partition));
    grad_slot_buf_ = Buffer(MemCategory::Grads, size_t(bufs_.grad_slots));
    char* at = grad_slot_buf_.as<char>();
    auto add_slot = [&](int64_t elems) {
      grad_slots_.push_back({at, -1, {}});
      at += size_t(elems) * gs_;
    };
    add_slot(units_.front().numel);  // 0: embedding
    add_slot(units_.back().numel);   // 1: head
    for (int k = 0; k < grad_block_slots(n, o_); ++k) add_slot(bufs_.grad_block_elems);
  }
  if (stage_ == 3) {
    param_part_buf_ = Buffer(MemCategory::Params, size_t(bufs_.param_partition));
    persistent_buf_ = Buffer(MemCategory::Params, size_t(bufs_.persistent));
    param_slot_buf_ = Buffer(MemCategory::Params, size_t(bufs_.param_slots));
    persistent_at_.assign(units_.size(), nullptr);
    pstate_.resize(units_.size());
    pools_.resize(3);
    char* pers = persistent_buf_.as<char>();
    char* slots = param_slot_buf_.as<char>();
    for (int u = 0; u < n; ++u) {
      ParamState& st = pstate_[size_t(u)];
      st.pool = pool_of(u, n);
      const UnitSpec& unit = units_[size_t(u)];
      if (persistent_unit(unit, o_)) {
        st.persistent = true;
        persistent_at_[size_t(u)] = pers;
        pers += size_t(unit.numel) * ps_;
      } else if (st.pool != kBlockPool) {
        Pool& pool = pools_[size_t(st.pool)];
        pool.base = slots, pool.slot_elems = unit.numel, pool.free = {0};
        slots += size_t(unit.numel) * ps_;
      }
    }
    Pool& blocks = pools_[kBlockPool];
    blocks.base = slots, blocks.slot_elems = bufs_.param_block_elems;
    for (int k = bufs_.block_param_slots - 1; k >= 0; --k) blocks.free.push_back(k);
    trace_ = param_trace(spec, Pass::Forward);
    forward_len_ = trace_.size();
    for (int u : param_trace(spec, Pass::Backward)) trace_.push_back(u);
  }
}

ZeroSync::~ZeroSync() = default;

void* ZeroSync::optimizer_params() const {
  return stage_ == 3 ? param_part_buf_.data() : full_params_;
}

const void* ZeroSync::optimizer_grads() const {
  return stage_ >= 2 ? grad_part_buf_.data() : full_grads_;
}

char* ZeroSync::grad_part(int unit) const {
  return grad_part_buf_.as<char>() + size_t(units_[size_t(unit)].offset / size_) * gs_;
}

int ZeroSync::grad_slot_of(int unit) const {
  const int n = int(units_.size());
  if (unit == 0) return 0;
  if (unit == n - 1) return 1;
  return 2 + (unit - 1) % grad_block_slots(n, o_);
}

void ZeroSync::begin_micro(bool boundary) {
  armed_ = boundary;
  if (stage_ == 1 && boundary) {
    next_ = 0;
    done_floor_ = units_.back().offset + units_.back().numel;
  }
}

// ---- gradients -----------------------------------------------------------------------------

void ZeroSync::issue_reduce(int unit) {
  const int64_t c = chunk(unit);
  if (stage_ == 1) {
    char* in = full_grads_ + size_t(units_[size_t(unit)].offset) * gs_;
    pending_[size_t(unit)] = shard_.reduce_scatter_async(in, in + size_t(rank_ * c) * gs_,
                                                         size_t(c), o_.grad_dtype, o_.wire);
    return;
  }
  GradSlot& s = grad_slots_[size_t(grad_slot_of(unit))];
  s.unit = unit;
  s.pending = shard_.reduce_scatter_async(s.data, s.data + size_t(rank_ * c) * gs_, size_t(c),
                                          o_.grad_dtype, o_.wire);
  if (!o_.overlap) settle(s);
}

// Waits for the slot's reduction and adds the owned chunk into the gradient partition.
void ZeroSync::settle(GradSlot& s) {
  if (s.unit < 0) return;
  const auto t0 = clock_type::now();
  s.pending.wait();
  reduce_wait_s_ += seconds_since(t0);
  const int64_t c = chunk(s.unit);
  accumulate(grad_part(s.unit), s.data + size_t(rank_ * c) * gs_, o_.grad_dtype, c);
  s.unit = -1;
}

void* ZeroSync::grads_for(int unit) {
  if (stage_ == 1) return nullptr;
  GradSlot& s = grad_slots_[size_t(grad_slot_of(unit))];
  settle(s);
  std::memset(s.data, 0, size_t(units_[size_t(unit)].numel) * gs_);
  return s.data;
}

void ZeroSync::unit_done(int unit) {
  if (stage_ >= 2) return issue_reduce(unit);
  if (!armed_) return;
  done_floor_ = std::min(done_floor_, units_[size_t(unit)].offset);
  if (!o_.overlap) return;
  const size_t n = units_.size();
  while (next_ < n && units_[n - 1 - next_].offset >= done_floor_) {
    issue_reduce(int(n - 1 - next_++));
  }
}

void ZeroSync::finish() {
  STRATA_CHECK(armed_, "ZeroSync::finish outside the accumulation boundary");
  const auto t0 = clock_type::now();
  if (stage_ == 1) {
    const size_t n = units_.size();
    while (next_ < n) issue_reduce(int(n - 1 - next_++));
    for (comm::Handle& h : pending_) h.wait();
    reduce_wait_s_ += seconds_since(t0);
  } else {
    for (GradSlot& s : grad_slots_) settle(s);
  }
  if (replicas_ != nullptr && replicas_->size() > 1) {
    // MiCS: the shard groups hold the same partition; sum it across them once per step.
    const auto r0 = clock_type::now();
    if (stage_ == 1) {
      for (size_t u = 0; u < units_.size(); ++u) {
        const int64_t c = chunk(int(u));
        char* mine = full_grads_ + size_t(units_[u].offset + rank_ * c) * gs_;
        pending_[u] = replicas_->all_reduce_async(mine, size_t(c), o_.grad_dtype, o_.wire);
      }
      for (comm::Handle& h : pending_) h.wait();
    } else {
      replicas_->all_reduce(grad_part_buf_.data(), size_t(owned_numel_), o_.grad_dtype, o_.wire);
    }
    reduce_wait_s_ += seconds_since(r0);
  }
  armed_ = false;
}

double ZeroSync::sum_squares() {
  double sum = 0.0;
  if (stage_ >= 2) {
    sum = kernels::sum_squares(grad_part_buf_.data(), o_.grad_dtype, size_t(owned_numel_));
  } else {
    for (size_t u = 0; u < units_.size(); ++u) {
      const int64_t c = chunk(int(u));
      sum += kernels::sum_squares(full_grads_ + size_t(units_[u].offset + rank_ * c) * gs_,
                                  o_.grad_dtype, size_t(c));
    }
  }
  float total = float(sum);  // as the single-process norm: Σ in double, reduced in fp32
  shard_.all_reduce(&total, 1, DType::F32, DType::F32);
  return total;
}

void ZeroSync::zero_grads() {
  if (stage_ >= 2) std::memset(grad_part_buf_.data(), 0, grad_part_buf_.bytes());
}

// ---- parameters ----------------------------------------------------------------------------

void ZeroSync::begin_step() {
  reduce_wait_s_ = gather_wait_s_ = 0.0;
}

void ZeroSync::after_step() {
  if (stage_ < 3) {
    for (size_t u = 0; u < units_.size(); ++u) {
      const int64_t c = chunk(int(u));
      char* out = full_params_ + size_t(units_[u].offset) * ps_;
      gathers_[u] =
          shard_.all_gather_async(out + size_t(rank_ * c) * ps_, out, size_t(c), o_.param_dtype);
    }
    for (comm::Handle& h : gathers_) h.wait();
    return;
  }
  drop_all();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (persistent_at_[u] == nullptr) continue;
    const char* mine = param_part_buf_.as<char>() + size_t(units_[u].offset / size_) * ps_;
    gathers_[u] =
        shard_.all_gather_async(mine, persistent_at_[u], size_t(chunk(int(u))), o_.param_dtype);
  }
  for (comm::Handle& h : gathers_) h.wait();
}

void ZeroSync::gather_all_params(void* out) {
  char* o = static_cast<char*>(out);
  const size_t bytes = size_t(units_.back().offset + units_.back().numel) * ps_;
  if (stage_ < 3) {
    std::memcpy(o, full_params_, bytes);
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const char* mine = param_part_buf_.as<char>() + size_t(units_[u].offset / size_) * ps_;
    shard_.all_gather(mine, o + size_t(units_[u].offset) * ps_, size_t(chunk(int(u))),
                      o_.param_dtype);
  }
}

char* ZeroSync::slot_data(const ParamState& p) const {
  const Pool& pool = pools_[size_t(p.pool)];
  return pool.base + size_t(p.slot) * size_t(pool.slot_elems) * ps_;
}

int ZeroSync::next_use(int unit, size_t from) const {
  for (size_t j = from; j < trace_.size(); ++j) {
    if (trace_[j] == unit) return int(j);
  }
  return -1;
}

int64_t ZeroSync::distance(size_t from, size_t to) const {
  int64_t d = 0;
  for (size_t j = from; j < to; ++j) d += units_[size_t(trace_[j])].numel;
  return d;
}

void ZeroSync::evict(int unit) {
  ParamState& st = pstate_[size_t(unit)];
  st.gather.wait();
  st.gathering = st.prefetched = false;
  pools_[size_t(st.pool)].free.push_back(st.slot);
  st.slot = -1;
  live_ -= units_[size_t(unit)].numel;
}

// Frees a buffer in the unit's pool, and room under max_live, by evicting resident units nobody
// holds, the one used farthest ahead first. A prefetch (`must` false) gives up rather than evict
// a unit needed no later than its own use at trace position use_at; an acquire may go over
// max_live when nothing is left to evict (the unit it needs is gathered regardless).
bool ZeroSync::make_room(int unit, int64_t use_at, bool must) {
  const int pool = pstate_[size_t(unit)].pool;
  const int64_t need = units_[size_t(unit)].numel;
  for (;;) {
    const bool need_slot = pools_[size_t(pool)].free.empty();
    const bool need_live = live_ + need > o_.max_live;
    if (!need_slot && !need_live) return true;
    int victim = -1;
    int64_t victim_use = -1;
    for (size_t u = 0; u < pstate_.size(); ++u) {
      const ParamState& st = pstate_[u];
      if (st.slot < 0 || st.refs > 0 || st.prefetched) continue;
      if (need_slot && st.pool != pool) continue;
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

void ZeroSync::gather(int unit) {
  ParamState& st = pstate_[size_t(unit)];
  Pool& pool = pools_[size_t(st.pool)];
  st.slot = pool.free.back();
  pool.free.pop_back();
  live_ += units_[size_t(unit)].numel;
  peak_live_ = std::max(peak_live_, live_);
  const char* mine = param_part_buf_.as<char>() + size_t(units_[size_t(unit)].offset / size_) * ps_;
  st.gather = shard_.all_gather_async(mine, slot_data(st), size_t(chunk(unit)), o_.param_dtype);
  st.gathering = true;
}

// Issues gathers for the units next in the trace, in trace order, while the prefetch budget,
// max_live and the buffers allow. Decisions depend only on the trace and earlier calls, so every
// rank issues the same gathers in the same order.
void ZeroSync::prefetch() {
  int64_t ahead = 0;  // elements gathered ahead and not yet acquired
  for (size_t u = 0; u < pstate_.size(); ++u) {
    if (pstate_[u].prefetched) ahead += units_[u].numel;
  }
  for (size_t j = pos_; j < trace_.size(); ++j) {
    const int u = trace_[j];
    ParamState& st = pstate_[size_t(u)];
    if (st.persistent || st.slot >= 0) continue;
    const int64_t n = units_[size_t(u)].numel;
    if (ahead + n > o_.prefetch_elems || !make_room(u, int64_t(j), false)) return;
    gather(u);
    st.prefetched = true;
    ahead += n;
  }
}

void ZeroSync::begin_pass(Pass pass) {
  if (stage_ != 3) return;
  pos_ = pass == Pass::Forward ? 0 : forward_len_;
}

const void* ZeroSync::acquire_params(int unit) {
  if (stage_ != 3) return nullptr;
  STRATA_CHECK(pos_ < trace_.size() && trace_[pos_] == unit,
               "ZeRO stage 3: ", units_[size_t(unit)].name,
               " was acquired out of the static gather order (a model/trace mismatch)");
  ParamState& st = pstate_[size_t(unit)];
  ++pos_;
  if (st.persistent) {
    prefetch();  // a pass may open with persistent units: start the next gathers now
    return persistent_at_[size_t(unit)];
  }
  if (st.slot < 0) {
    make_room(unit, int64_t(pos_ - 1), true);
    gather(unit);
  }
  if (st.gathering) {
    const auto t0 = clock_type::now();
    st.gather.wait();
    gather_wait_s_ += seconds_since(t0);
    st.gathering = false;
  }
  st.prefetched = false;
  ++st.refs;
  prefetch();
  return slot_data(st);
}

void ZeroSync::release_params(int unit) {
  if (stage_ != 3) return;
  ParamState& st = pstate_[size_t(unit)];
  if (st.persistent) return;
  STRATA_CHECK(st.refs > 0, "ZeRO stage 3: ", units_[size_t(unit)].name,
               " released more often than acquired");
  if (--st.refs > 0) return;
  const int next = next_use(unit, pos_);
  if (next < 0 || distance(pos_, size_t(next)) > o_.max_reuse_distance) evict(unit);
}

void ZeroSync::drop_all() {
  for (size_t u = 0; u < pstate_.size(); ++u) {
    if (pstate_[u].slot >= 0) {
      STRATA_CHECK(pstate_[u].refs == 0, "ZeRO stage 3: ", units_[u].name,
                   " is still held at the end of the step");
      evict(int(u));
    }
  }
}

bool ZeroSync::in_flight() const {
  for (const auto* hs : {&pending_, &gathers_}) {
    for (const comm::Handle& h : *hs) {
      if (!h.done()) return true;
    }
  }
  for (const GradSlot& s : grad_slots_) {
    if (!s.pending.done()) return true;
  }
  for (const ParamState& p : pstate_) {
    if (!p.gather.done()) return true;
  }
  return false;
}

}  // namespace strata
