// Where a rank's elements of a parameter sit in the whole (global) tensor: the arithmetic that
// makes checkpoints layout-independent (DESIGN.md §7). A checkpoint stores every element under
// its index in the global tensor (ParamSpec::global_shape, strata's row order, the vocabulary
// unpadded), so any tensor-parallel slice or ZeRO partition of any layout can be written and any
// other read back.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/model/param_spec.h"

namespace strata::ckpt {

// Elements [local, local + len) of a local range map to global flat indices [global, global +
// len); `replicas` tensor-parallel ranks hold them alike (1: this rank only).
struct Segment {
  int64_t global = 0, local = 0, len = 0;
  int replicas = 1;
};

// The segments of elements [begin, begin + count) of this rank's slice of p (flattened row-major
// in the local shape), local offsets counted from begin, in local order; adjacent segments are
// merged. Padding (vocabulary rows past the valid ones) maps nowhere: no segment covers it.
std::vector<Segment> global_segments(const ParamSpec& p, int64_t begin, int64_t count);

// Segments stored compactly: `count` segments of `len` elements, the k-th at global index
// global + k·stride, one after the other in the chunk.
struct Run {
  int64_t global = 0, len = 0, count = 1, stride = 0;
};
std::vector<Run> compress(const std::vector<Segment>& segments);
// The global index range [lo, hi) the runs touch, and their elements in total.
void run_bounds(const std::vector<Run>& runs, int64_t& lo, int64_t& hi, int64_t& elements);

}  // namespace strata::ckpt
