#include "strata/ckpt/slices.h"

#include <algorithm>

#include "strata/core/check.h"

namespace strata::ckpt {

namespace {

void push(std::vector<Segment>& out, Segment s) {
  if (s.len <= 0) return;
  if (!out.empty()) {
    Segment& b = out.back();
    if (b.global + b.len == s.global && b.local + b.len == s.local && b.replicas == s.replicas) {
      b.len += s.len;
      return;
    }
  }
  out.push_back(s);
}

}  // namespace

std::vector<Segment> global_segments(const ParamSpec& p, int64_t begin, int64_t count) {
  std::vector<Segment> out;
  const int64_t end = begin + count;
  STRATA_CHECK(begin >= 0 && count >= 0 && end <= p.numel(), "elements [", begin, ", ", end,
               ") outside ", p.name, "'s ", p.numel(), " local elements");
  if (p.split_axis < 0) {
    push(out, {begin, 0, count, p.replicas});
    return out;
  }
  const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  if (p.split_axis == 0) {
    // Whole rows: each range's local rows are consecutive global rows.
    int64_t row = 0;  // the range's first local row
    for (const TpRange& r : p.ranges) {
      const int64_t lo = std::max(begin, row * cols), hi = std::min(end, (row + r.count) * cols);
      if (lo < hi)
        push(out, {r.begin * gcols + (lo - row * cols), lo - begin, hi - lo, r.replicas});
      row += r.count;
    }
    return out;
  }
  // Split columns: within each local row, each range's columns are consecutive global columns.
  for (int64_t row = begin / cols; row * cols < end; ++row) {
    int64_t col = 0;
    for (const TpRange& r : p.ranges) {
      const int64_t at = row * cols + col;
      const int64_t lo = std::max(begin, at), hi = std::min(end, at + r.count);
      if (lo < hi) {
        push(out, {(p.row0 + row) * gcols + r.begin + (lo - at), lo - begin, hi - lo, r.replicas});
      }
      col += r.count;
    }
  }
  return out;
}

std::vector<Run> compress(const std::vector<Segment>& segments) {
  std::vector<Run> runs;
  for (const Segment& s : segments) {
    if (!runs.empty()) {
      Run& r = runs.back();
      // A lone segment's stride is set only when the next one extends it forward: a segment
      // before it must not leave it a negative stride, which the manifest refuses.
      const int64_t stride = r.count == 1 ? s.global - r.global : r.stride;
      if (r.len == s.len && stride > 0 && r.global + r.count * stride == s.global) {
        r.stride = stride;
        ++r.count;
        continue;
      }
    }
    runs.push_back({s.global, s.len, 1, 0});
  }
  return runs;
}

void run_bounds(const std::vector<Run>& runs, int64_t& lo, int64_t& hi, int64_t& elements) {
  lo = INT64_MAX, hi = INT64_MIN, elements = 0;
  for (const Run& r : runs) {
    lo = std::min(lo, r.global);
    hi = std::max(hi, r.global + (r.count - 1) * r.stride + r.len);
    elements += r.len * r.count;
  }
  if (runs.empty()) lo = hi = 0;
}

}  // namespace strata::ckpt
