#include "strata/zero/gather_order.h"

namespace strata {

namespace {

void append_pass(GatherOrder& o, UnitHook::Pass pass, const std::vector<int>& units) {
  o.passes.push_back({pass, o.units.size()});
  o.units.insert(o.units.end(), units.begin(), units.end());
}

}  // namespace

GatherOrder one_micro_order(const ModelSpec& spec, const std::vector<char>& recompute_full) {
  RecomputeOptions rc;
  rc.full = recompute_full;
  GatherOrder o;
  append_pass(o, UnitHook::Pass::Forward, param_trace(spec, UnitHook::Pass::Forward, rc));
  append_pass(o, UnitHook::Pass::Backward, param_trace(spec, UnitHook::Pass::Backward, rc));
  return o;
}

GatherOrder forward_order(const ModelSpec& spec, const std::vector<char>& recompute_full) {
  RecomputeOptions rc;
  rc.full = recompute_full;
  GatherOrder o;
  append_pass(o, UnitHook::Pass::Forward, param_trace(spec, UnitHook::Pass::Forward, rc));
  return o;
}

}  // namespace strata
