#include "strata/zero/grad_sync.h"

#include <algorithm>
#include <chrono>

#include "strata/core/check.h"

namespace strata {

GradSync::GradSync(comm::Communicator& dp, const ModelSpec& spec, void* grads, DType grad_dtype,
                   DType wire_dtype, int64_t bucket_elems, bool overlap)
    : dp_(dp),
      grads_(static_cast<char*>(grads)),
      grad_dtype_(grad_dtype),
      wire_(wire_dtype),
      overlap_(overlap) {
  STRATA_CHECK(bucket_elems > 0, "reduce_bucket_size must be positive");
  for (const UnitSpec& u : spec.units) unit_begin_.push_back(u.offset);
  for (int64_t end = spec.numel; end > 0;) {
    const int64_t begin = std::max<int64_t>(0, end - bucket_elems);
    buckets_.push_back({begin, end});
    end = begin;
  }
  pending_.resize(buckets_.size());
  numel_ = done_floor_ = spec.numel;
}

void GradSync::begin_boundary() {
  armed_ = true;
  next_ = 0;
  done_floor_ = numel_;  // nothing final yet
}

void GradSync::issue(size_t b) {
  const Bucket& k = buckets_[b];
  pending_[b] = dp_.all_reduce_async(grads_ + size_t(k.begin) * dtype_size(grad_dtype_),
                                     size_t(k.end - k.begin), grad_dtype_, wire_);
}

void GradSync::unit_done(int unit) {
  if (!armed_) return;
  done_floor_ = std::min(done_floor_, unit_begin_[size_t(unit)]);
  if (!overlap_) return;
  while (next_ < buckets_.size() && buckets_[next_].begin >= done_floor_) issue(next_++);
}

bool GradSync::in_flight() const {
  for (const comm::Handle& h : pending_) {
    if (!h.done()) return true;
  }
  return false;
}

void GradSync::finish() {
  STRATA_CHECK(armed_, "GradSync::finish without begin_boundary");
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < buckets_.size()) issue(next_++);
  for (comm::Handle& h : pending_) h.wait();
  exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  armed_ = false;
}

}  // namespace strata
