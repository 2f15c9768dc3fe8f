#include "strata/zero/zero1.h"

#include <algorithm>
#include <chrono>

#include "strata/core/check.h"
#include "strata/kernels/cpu/optimizer.h"

namespace strata {

Zero1Sync::Zero1Sync(comm::Communicator& dp, const ModelSpec& spec, void* grads, DType grad_dtype,
                     DType wire_dtype, bool overlap)
    : dp_(dp),
      rank_(dp.rank()),
      size_(dp.size()),
      grads_(static_cast<char*>(grads)),
      grad_dtype_(grad_dtype),
      wire_(wire_dtype),
      overlap_(overlap),
      units_(spec.units) {
  STRATA_CHECK(spec.align % size_ == 0, "ZeRO stage 1 over ", size_,
               " ranks needs a model spec aligned to a multiple of ", size_, ", got ", spec.align);
  for (const UnitSpec& u : units_) {
    const int64_t chunk = u.numel / size_;
    const int64_t begin = u.offset + rank_ * chunk, end = begin + chunk;
    for (int i : u.params) {
      const ParamSpec& p = spec.params[size_t(i)];
      const int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel());
      if (b < e) owned_ranges_.push_back({b, e - b, p.decay, owned_numel_ + (b - begin)});
    }
    owned_numel_ += chunk;
  }
  pending_.resize(units_.size());
  gathers_.resize(units_.size());
  numel_ = done_floor_ = spec.numel;
}

void Zero1Sync::begin_boundary() {
  armed_ = true;
  next_ = 0;
  done_floor_ = numel_;
}

void Zero1Sync::issue(size_t u) {
  const UnitSpec& unit = units_[u];
  const int64_t chunk = unit.numel / size_;
  const size_t es = dtype_size(grad_dtype_);
  char* in = grads_ + size_t(unit.offset) * es;
  pending_[u] = dp_.reduce_scatter_async(in, in + size_t(rank_ * chunk) * es, size_t(chunk),
                                         grad_dtype_, wire_);
}

void Zero1Sync::unit_done(int unit) {
  if (!armed_) return;
  done_floor_ = std::min(done_floor_, units_[size_t(unit)].offset);
  if (!overlap_) return;
  while (next_ < units_.size() && units_[units_.size() - 1 - next_].offset >= done_floor_) {
    issue(units_.size() - 1 - next_++);
  }
}

bool Zero1Sync::in_flight() const {
  for (const auto* handles : {&pending_, &gathers_}) {
    for (const comm::Handle& h : *handles) {
      if (!h.done()) return true;
    }
  }
  return false;
}

void Zero1Sync::finish() {
  STRATA_CHECK(armed_, "Zero1Sync::finish without begin_boundary");
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < units_.size()) issue(units_.size() - 1 - next_++);
  for (comm::Handle& h : pending_) h.wait();
  exposed_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  armed_ = false;
}

double Zero1Sync::owned_sum_squares() const {
  const size_t es = dtype_size(grad_dtype_);
  double sum = 0.0;
  for (const UnitSpec& u : units_) {
    const int64_t chunk = u.numel / size_;
    sum += kernels::sum_squares(grads_ + size_t(u.offset + rank_ * chunk) * es, grad_dtype_,
                                size_t(chunk));
  }
  return sum;
}

void Zero1Sync::gather_params(void* params, DType param_dtype) {
  char* p = static_cast<char*>(params);
  const size_t es = dtype_size(param_dtype);
  for (size_t i = 0; i < units_.size(); ++i) {
    const UnitSpec& u = units_[i];
    const int64_t chunk = u.numel / size_;
    char* out = p + size_t(u.offset) * es;
    gathers_[i] =
        dp_.all_gather_async(out + size_t(rank_ * chunk) * es, out, size_t(chunk), param_dtype);
  }
  for (comm::Handle& h : gathers_) h.wait();
}

}  // namespace strata
