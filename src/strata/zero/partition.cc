#include "strata/zero/partition.h"

#include <algorithm>

#include "strata/core/check.h"

namespace strata {

bool persistent_unit(const UnitSpec& u, const ZeroOptions& o) {
  return u.numel <= o.persistence_threshold;
}

ZeroBuffers zero_buffers(const ModelSpec& spec, int shard_size, const ZeroOptions& o,
                         int expert_size) {
  ZeroBuffers b;
  int64_t owned = 0;  // elements of the packed partition
  for (const UnitSpec& u : spec.units) {
    owned += u.numel / (u.kind == UnitKind::Experts && expert_size > 0 ? expert_size : shard_size);
  }
  const int64_t ps = int64_t(dtype_size(o.param_dtype)), gs = int64_t(dtype_size(o.grad_dtype));
  int64_t max_unit = 0;
  for (const UnitSpec& u : spec.units) max_unit = std::max(max_unit, u.numel);
  if (o.stage >= 2) {
    // Gradient buffers are handed out round robin: with overlap_comm two, so that one reduces
    // while backward fills the other; without it each reduction is waited at once.
    b.grad_partition = owned * gs;
    b.grad_slot_elems = max_unit;
    b.grad_slot_count = std::min(o.overlap ? 2 : 1, int(spec.units.size()));
    b.grad_slots = b.grad_slot_count * max_unit * gs;
  }
  if (o.stage == 3) {
    b.param_partition = owned * ps;
    int64_t gathered = 0, largest = 0;
    for (const UnitSpec& unit : spec.units) {
      if (persistent_unit(unit, o)) {
        b.persistent += unit.numel * ps;
      } else {
        largest = std::max(largest, unit.numel);
        ++gathered;
      }
    }
    if (gathered > 0) {
      // The unit being read plus what the prefetch bucket may hold ahead, or every gathered unit
      // when units stay resident for the step; within max_live.
      int64_t k =
          o.reshard_after_forward ? 1 + (o.prefetch_elems + largest - 1) / largest : gathered;
      k = std::min(k, std::max<int64_t>(1, o.max_live / largest));
      b.param_slot_count = int(std::min(k, gathered));
      b.param_slot_elems = largest;
      b.param_slots = b.param_slot_count * largest * ps;
    }
  }
  return b;
}

ZeroPartition::ZeroPartition(const ModelSpec& spec, int rank, int size, int expert_rank,
                             int expert_size)
    : rank_(rank),
      size_(size),
      expert_rank_(expert_rank),
      expert_size_(expert_size),
      units_(spec.units),
      packed_(spec.units.size(), 0) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of a shard group of ", size);
  STRATA_CHECK(spec.align % size == 0, "ZeRO over ", size,
               " ranks needs a model spec aligned to a multiple of ", size, ", got ", spec.align);
  STRATA_CHECK(expert_size == 0 || (expert_rank >= 0 && expert_rank < expert_size),
               "expert-data-parallel rank ", expert_rank, " of ", expert_size);
  for (int u = 0; u < int(units_.size()); ++u) {
    STRATA_CHECK(!expert(u) || units_[size_t(u)].numel % expert_size == 0, "ZeRO over ",
                 expert_size,
                 " expert-data-parallel ranks needs the experts' units aligned to a "
                 "multiple of it (build_model_spec's expert_align)");
    packed_[size_t(u)] = owned_numel_;
    const int64_t begin = chunk_begin(u), end = begin + chunk(u);
    for (int i : units_[size_t(u)].params) {
      const ParamSpec& p = spec.params[size_t(i)];
      const int64_t b = std::max(begin, p.offset), e = std::min(end, p.offset + p.numel());
      if (b < e) owned_ranges_.push_back({b, e - b, p.decay, owned_numel_ + (b - begin)});
    }
    owned_numel_ += chunk(u);
  }
}

}  // namespace strata
