#include "strata/zero/grad_reducer.h"

#include <algorithm>
#include <chrono>

#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

GradReducer::GradReducer(comm::Communicator& group, comm::Communicator* experts,
                         const ModelSpec& spec, const ZeroPartition* part, const ZeroOptions& o,
                         const ZeroBuffers& bufs, void* flat, void* partition, void* slots)
    : group_(group),
      experts_(experts),
      part_(part),
      stage_(o.stage),
      grad_(o.grad_dtype),
      wire_(o.wire),
      overlap_(o.overlap),
      gs_(dtype_size(o.grad_dtype)),
      units_(spec.units),
      flat_(static_cast<char*>(flat)),
      partition_(static_cast<char*>(partition)) {
  STRATA_CHECK((part_ == nullptr) == (stage_ == 0), "a partition exactly at stages 1-3");
  STRATA_CHECK((flat_ != nullptr) == (stage_ <= 1), "flat gradients exactly at stages 0-1");
  auto expert = [&](int u) {
    return experts_ != nullptr && units_[size_t(u)].kind == UnitKind::Experts;
  };
  if (stage_ == 0 && o.bucket_elems == 0) {
    // reduce_bucket_size 0: DeepSpeed reduces every gradient on its own; here each unit.
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
      const int64_t offset = units_[size_t(u)].offset, numel = units_[size_t(u)].numel;
      if (numel > 0) ranges_.push_back({offset, offset + numel, -1, expert(u)});
    }
  } else if (stage_ == 0) {
    STRATA_CHECK(o.bucket_elems > 0, "reduce_bucket_size must not be negative");
    // Buckets cut from the end of each run of units reduced over one group (the whole buffer
    // without expert parallelism).
    for (int last = int(units_.size()) - 1; last >= 0;) {
      int first = last;
      while (first > 0 && expert(first - 1) == expert(last)) --first;
      const int64_t lo = units_[size_t(first)].offset;
      for (int64_t end = units_[size_t(last)].offset + units_[size_t(last)].numel; end > lo;) {
        const int64_t begin = std::max<int64_t>(lo, end - o.bucket_elems);
        ranges_.push_back({begin, end, -1, expert(last)});
        end = begin;
      }
      last = first - 1;
    }
  } else if (stage_ == 1) {
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
      if (units_[size_t(u)].numel == 0) continue;  // on another pipeline stage
      ranges_.push_back({units_[size_t(u)].offset,
                         units_[size_t(u)].offset + units_[size_t(u)].numel, u, expert(u)});
    }
  } else {
    char* at = static_cast<char*>(slots);
    for (int k = 0; k < bufs.grad_slot_count; ++k) {
      slots_.push_back({at, -1, {}});
      at += size_t(bufs.grad_slot_elems) * gs_;
    }
    slot_of_.assign(units_.size(), -1);
  }
  pending_.resize(ranges_.size());
}

void GradReducer::begin_micro(bool boundary) {
  if (boundary && !stepping_) {  // the step's first final backward
    next_ = 0;
    done_floor_ = units_.back().offset + units_.back().numel;  // nothing final yet
    stepping_ = true;
  }
  armed_ = boundary;
}

void GradReducer::issue(size_t r) {
  const Range& k = ranges_[r];
  char* begin = flat_ + size_t(k.begin) * gs_;
  const ops::Event written =
      ops::record(ops::compute_stream());  // the backward that wrote the range
  comm::Communicator& g = k.expert ? *experts_ : group_;
  if (stage_ == 0) {
    pending_[r] = g.all_reduce_async(begin, size_t(k.end - k.begin), grad_, wire_, written);
  } else {
    pending_[r] = g.reduce_scatter_async(begin, flat_ + size_t(part_->chunk_begin(k.unit)) * gs_,
                                         size_t(part_->chunk(k.unit)), grad_, wire_, written);
  }
}

void* GradReducer::grads_for(int unit) {
  if (stage_ <= 1) return nullptr;
  const int k = next_slot_;
  next_slot_ = (k + 1) % int(slots_.size());
  Slot& s = slots_[size_t(k)];
  settle(s);
  slot_of_[size_t(unit)] = k;
  ops::fill_zero(Tensor(s.data, grad_, {units_[size_t(unit)].numel}));
  return s.data;
}

void GradReducer::issue_slot(int unit) {
  Slot& s = slots_[size_t(slot_of_[size_t(unit)])];
  STRATA_CHECK(s.unit == -1, "ZeRO: ", units_[size_t(unit)].name,
               " reported done without asking for gradients");
  const int64_t c = part_->chunk(unit);
  s.unit = unit;
  s.pending = group_of(unit).reduce_scatter_async(
      s.data, s.data + size_t(part_->group_rank(unit) * c) * gs_, size_t(c), grad_, wire_,
      ops::record(ops::compute_stream()));
  if (!overlap_) settle(s);
}

// Waits for the slot's reduction and adds the owned chunk into the gradient partition.
void GradReducer::settle(Slot& s) {
  if (s.unit < 0) return;
  const auto t0 = clock_type::now();
  ops::wait(ops::compute_stream(), s.pending.event());
  wait_s_ += seconds_since(t0);
  const int64_t c = part_->chunk(s.unit);
  ops::add_inplace(Tensor(partition_ + size_t(part_->packed_offset(s.unit)) * gs_, grad_, {c}),
                   Tensor(s.data + size_t(part_->group_rank(s.unit) * c) * gs_, grad_, {c}));
  s.unit = -1;
}

void GradReducer::unit_done(int unit, bool final) {
  if (stage_ >= 2) return issue_slot(unit);  // every contribution, on every micro-batch
  if (!armed_ || !final) return;
  done_floor_ = std::min(done_floor_, units_[size_t(unit)].offset);
  if (!overlap_) return;
  while (next_ < ranges_.size() && ranges_[next_].begin >= done_floor_) issue(next_++);
}

void GradReducer::finish() {
  STRATA_CHECK(stepping_, "gradient reduction finished outside the accumulation boundary");
  const auto t0 = clock_type::now();
  if (stage_ <= 1) {
    while (next_ < ranges_.size()) issue(next_++);
    for (const comm::Handle& h : pending_)
      ops::wait(ops::compute_stream(), h.event());  // the optimizer reads
    wait_s_ += seconds_since(t0);
  } else {
    for (Slot& s : slots_) settle(s);
  }
  armed_ = stepping_ = false;
}

bool GradReducer::in_flight() const {
  for (const comm::Handle& h : pending_) {
    if (!h.done()) return true;
  }
  for (const Slot& s : slots_) {
    if (!s.pending.done()) return true;
  }
  return false;
}

}  // namespace strata
