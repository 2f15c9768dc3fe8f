#include "strata/plan/layout.h"

namespace strata::plan {

ZeroOptions zero_options(const Layout& l) {
  ZeroOptions o;
  o.stage = l.zero_stage;
  o.param_dtype = l.param_dtype;
  o.grad_dtype = l.grad_dtype;
  o.wire = l.wire_dtype;
  o.overlap = l.overlap_comm;
  o.bucket_elems = l.reduce_bucket_size;
  o.prefetch_elems = l.stage3_prefetch_bucket_size;
  o.persistence_threshold = l.stage3_param_persistence_threshold;
  o.max_live = l.stage3_max_live_parameters;
  o.max_reuse_distance = l.stage3_max_reuse_distance;
  o.reshard_after_forward = l.stage3_reshard_after_forward;
  o.recompute_full = l.recompute.full;
  return o;
}

}  // namespace strata::plan
