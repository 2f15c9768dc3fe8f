#include "strata/zero/zero_sync.h"

#include <chrono>

#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata {

std::unique_ptr<ZeroPartition> ZeroSync::make_partition(const comm::Communicator& shard,
                                                        const comm::Communicator* experts,
                                                        const ModelSpec& spec, int stage) {
  if (stage == 0) return nullptr;
  return std::make_unique<ZeroPartition>(spec, shard.rank(), shard.size(),
                                         experts != nullptr ? experts->rank() : 0,
                                         experts != nullptr ? experts->size() : 0);
}

ZeroSync::ZeroSync(comm::Communicator& shard, comm::Communicator* replicas, const ModelSpec& spec,
                   const ZeroOptions& o, void* full_params, void* full_grads,
                   comm::Communicator* experts)
    : shard_(shard),
      replicas_(replicas),
      experts_(experts),
      units_(spec.units),
      stage_(o.stage),
      o_(o),
      ps_(dtype_size(o.param_dtype)),
      gs_(dtype_size(o.grad_dtype)),
      numel_(spec.numel),
      part_(make_partition(shard, experts, spec, o.stage)),
      bufs_(o.stage >= 1
                ? zero_buffers(spec, shard.size(), o, experts != nullptr ? experts->size() : 0)
                : ZeroBuffers{}),
      full_params_(static_cast<char*>(full_params)),
      full_grads_(static_cast<char*>(full_grads)),
      grad_part_buf_(MemCategory::Grads, size_t(bufs_.grad_partition)),
      grad_slot_buf_(MemCategory::Grads, size_t(bufs_.grad_slots)),
      param_part_buf_(MemCategory::Params, size_t(bufs_.param_partition)),
      persistent_buf_(MemCategory::Params, size_t(bufs_.persistent)),
      param_slot_buf_(MemCategory::Params, size_t(bufs_.param_slots)),
      reducer_(shard, experts, spec, part_.get(), o, bufs_, o.stage <= 1 ? full_grads : nullptr,
               grad_part_buf_.data(), grad_slot_buf_.data()),
      gathers_(spec.units.size()) {
  STRATA_CHECK(stage_ >= 0 && stage_ <= 3, "ZeRO stages are 0-3, got ", stage_);
  STRATA_CHECK((full_params_ != nullptr) == (stage_ < 3),
               "ZeRO: flat parameters are given exactly below stage 3");
  STRATA_CHECK((full_grads_ != nullptr) == (stage_ <= 1),
               "ZeRO: flat gradients are given exactly at stages 0-1");
  STRATA_CHECK(experts_ == nullptr || replicas_ == nullptr,
               "ZeRO: MiCS replica groups with expert parallelism are not built");
  if (stage_ < 3) return;
  std::vector<char*> persistent(spec.units.size(), nullptr);  // per unit, its whole copy
  char* pers = persistent_buf_.as<char>();
  for (size_t u = 0; u < spec.units.size(); ++u) {
    if (!persistent_unit(spec.units[u], o_)) continue;
    persistent[u] = pers;
    pers += size_t(spec.units[u].numel) * ps_;
  }
  cache_ = std::make_unique<ParamCache>(
      spec, o_, bufs_, ps_, param_slot_buf_.as<char>(), std::move(persistent),
      [this](int unit, void* dst, const ops::Event& released) {
        const char* mine = param_part_buf_.as<char>() + size_t(part_->packed_offset(unit)) * ps_;
        return group_of(units_[size_t(unit)])
            .all_gather_async(mine, dst, size_t(part_->chunk(unit)), o_.param_dtype, released);
      });
}

ZeroSync::~ZeroSync() = default;

void* ZeroSync::optimizer_params() const {
  return stage_ == 3 ? param_part_buf_.data() : full_params_;
}

const void* ZeroSync::optimizer_grads() const {
  return stage_ >= 2 ? grad_part_buf_.data() : full_grads_;
}

void ZeroSync::begin_step() {
  reducer_.reset_wait();
  replica_wait_s_ = 0.0;
  if (cache_) cache_->reset_wait(), cache_->begin_step();
}

void ZeroSync::begin_eval() {
  if (cache_) cache_->begin_eval();
}

void ZeroSync::begin_pass(Pass pass) {
  if (cache_) cache_->begin_pass(pass);
}

const void* ZeroSync::acquire_params(int unit) {
  return cache_ ? cache_->acquire(unit) : nullptr;
}

void ZeroSync::release_params(int unit) {
  if (cache_) cache_->release(unit);
}

void ZeroSync::finish() {
  reducer_.finish();
  if (replicas_ == nullptr || replicas_->size() == 1) return;
  // MiCS: the shard groups hold the same partition; sum it across them once per step.
  const auto t0 = std::chrono::steady_clock::now();
  if (stage_ == 1) {
    const std::vector<UnitSpec>& units = part_->units();
    for (size_t u = 0; u < units.size(); ++u) {
      char* mine = full_grads_ + size_t(part_->chunk_begin(int(u))) * gs_;
      gathers_[u] = replicas_->all_reduce_async(mine, size_t(part_->chunk(int(u))), o_.grad_dtype,
                                                o_.wire, ops::record(ops::compute_stream()));
    }
    for (const comm::Handle& h : gathers_) ops::wait(ops::compute_stream(), h.event());
  } else {
    replicas_->all_reduce(grad_part_buf_.data(), size_t(part_->owned_numel()), o_.grad_dtype,
                          o_.wire);
  }
  replica_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ZeroSync::sq(const void* g, int64_t n) const {
  return ops::sum_squares(Tensor(const_cast<void*>(g), o_.grad_dtype, {n}));
}

// Σ g² over this rank's reduced gradients inside the flat range [offset, offset + n).
double ZeroSync::local_sum_squares(int64_t offset, int64_t n) const {
  if (stage_ == 0) return sq(full_grads_ + size_t(offset) * gs_, n);
  double sum = 0.0;
  for (size_t u = 0; u < part_->units().size(); ++u) {
    const int64_t c0 = part_->chunk_begin(int(u)), c1 = c0 + part_->chunk(int(u));
    const int64_t b = std::max(c0, offset), e = std::min(c1, offset + n);
    if (b >= e) continue;
    const char* base = stage_ >= 2 ? static_cast<const char*>(grad_part_buf_.data()) +
                                         size_t(part_->packed_offset(int(u)) + (b - c0)) * gs_
                                   : full_grads_ + size_t(b) * gs_;
    sum += sq(base, e - b);
  }
  return sum;
}

double ZeroSync::sum_squares(const std::vector<ReplicatedRange>& replicated) {
  // Elements that `replicas` tensor-parallel ranks hold alike count 1/replicas each, so that the
  // sum over the tensor-parallel group counts them once.
  double rep = 0.0;
  for (const ReplicatedRange& r : replicated) {
    rep += (1.0 - 1.0 / r.replicas) * local_sum_squares(r.offset, r.numel);
  }
  if (stage_ == 0 && experts_ == nullptr) {
    return sq(full_grads_, numel_) - rep;  // summed already
  }
  if (stage_ == 0) {
    // Every rank of the group holds the summed gradients of the dense units, and those of its
    // experts' units alike with its expert-data-parallel group: each counted 1/(the ranks holding
    // it) and summed over the group, so that each element counts once.
    double sum = 0.0;
    for (const UnitSpec& u : units_) {
      sum += sq(full_grads_ + size_t(u.offset) * gs_, u.numel) / group_of(u).size();
    }
    float total = float(sum - rep / shard_.size());
    shard_.all_reduce(&total, 1, DType::F32, DType::F32);
    return total;
  }
  double sum = 0.0;
  if (stage_ >= 2) {
    sum = sq(grad_part_buf_.data(), part_->owned_numel());
  } else {
    for (size_t u = 0; u < part_->units().size(); ++u) {
      sum += sq(full_grads_ + size_t(part_->chunk_begin(int(u))) * gs_, part_->chunk(int(u)));
    }
  }
  float total = float(sum - rep);  // as the single-process norm: Σ in double, reduced in fp32
  shard_.all_reduce(&total, 1, DType::F32, DType::F32);
  return total;
}

void ZeroSync::zero_grads() {
  if (stage_ >= 2)
    ops::fill_zero(Tensor(grad_part_buf_.data(), o_.grad_dtype, {part_->owned_numel()}));
}

void ZeroSync::after_step() {
  if (stage_ == 0) return;
  const ops::Event stepped =
      ops::record(ops::compute_stream());  // the optimizer wrote the owned chunks
  const std::vector<UnitSpec>& units = part_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t c = part_->chunk(int(u));
    if (c == 0) continue;  // a unit on another pipeline stage
    comm::Communicator& g = group_of(units[u]);
    if (stage_ < 3) {
      char* out = full_params_ + size_t(units[u].offset) * ps_;
      gathers_[u] = g.all_gather_async(full_params_ + size_t(part_->chunk_begin(int(u))) * ps_, out,
                                       size_t(c), o_.param_dtype, stepped);
    } else if (char* whole = cache_->persistent(int(u))) {
      const char* mine = param_part_buf_.as<char>() + size_t(part_->packed_offset(int(u))) * ps_;
      gathers_[u] = g.all_gather_async(mine, whole, size_t(c), o_.param_dtype, stepped);
    }
  }
  if (cache_) cache_->drop_all();
  for (const comm::Handle& h : gathers_)
    ops::wait(ops::compute_stream(), h.event());  // the next forward reads
}

void ZeroSync::drop_gathered() {
  if (cache_) cache_->drop_all();
}

void ZeroSync::gather_all_params(void* out) {
  char* o = static_cast<char*>(out);
  if (stage_ < 3) {
    ops::copy(Tensor(o, o_.param_dtype, {numel_}), Tensor(full_params_, o_.param_dtype, {numel_}));
    return;
  }
  const std::vector<UnitSpec>& units = part_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    const char* mine = param_part_buf_.as<char>() + size_t(part_->packed_offset(int(u))) * ps_;
    group_of(units[u]).all_gather(mine, o + size_t(units[u].offset) * ps_,
                                  size_t(part_->chunk(int(u))), o_.param_dtype);
  }
}

bool ZeroSync::in_flight() const {
  for (const comm::Handle& h : gathers_) {
    if (!h.done()) return true;
  }
  return reducer_.in_flight() || (cache_ && cache_->in_flight());
}

}  // namespace strata
