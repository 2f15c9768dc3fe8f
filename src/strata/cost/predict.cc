#include "strata/cost/predict.h"

#include <unistd.h>

#include <algorithm>

#include "strata/core/check.h"
#include "strata/zero/partition.h"

namespace strata::cost {

// The model states of every rank on this host must fit in its memory: pages are committed only
// when first touched, so a model that does not fit would otherwise be killed by the kernel
// mid-initialisation instead of failing with a message.
void check_fits_in_memory(const Layout& l, const ModelSpec& spec, int shard) {
  const size_t ranks = size_t(std::max(1, l.local_ranks));
  const size_t host = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  const MemoryPrediction m = predict_memory(l, spec, shard);
  if (m.model_states * ranks <= host) return;
  STRATA_INPUT_FAIL("the model states need ", format_bytes(m.model_states), " per rank x ", ranks,
                    " rank(s) on this host, more than its ", format_bytes(host),
                    " of memory; use a smaller model, bf16, or more ranks with "
                    "zero_optimization.stage 1-3 to shard the model states");
}

MemoryPrediction predict_memory(const Layout& l, const ModelSpec& spec, int shard) {
  const ZeroOptions& o = l.zero;
  const int stage = shard >= 1 ? o.stage : 0;
  const size_t psi = size_t(spec.numel), N = size_t(std::max(shard, 1));
  const size_t p = dtype_size(o.param_dtype), g = dtype_size(o.grad_dtype);
  const size_t moments = size_t(l.moments);
  // fp32 parameters are stepped in place: they are the master copy (at every stage).
  const size_t master = o.param_dtype == DType::F32 ? 0 : 4;
  const size_t k = master + 4 * moments;  // optimizer bytes per element: DeepSpeed's K
  MemoryPrediction m;
  auto at = [&](MemCategory c) -> size_t& { return m.bytes[size_t(c)]; };
  // Under expert parallelism the Experts units are sharded over the expert-data-parallel group
  // (shard / ep ranks; tp × shard / ep with whole experts), their chunks larger or smaller: the
  // partition is the sum of the owned chunks.
  const int expert = stage >= 1 && (spec.ep.size > 1 || spec.ep.whole)
                         ? (spec.ep.whole ? spec.tp.size : 1) * int(N) / spec.ep.size
                         : 0;
  const ZeroBuffers b = stage >= 1 ? zero_buffers(spec, shard, o, expert) : ZeroBuffers{};
  size_t part = 0;
  for (const UnitSpec& u : spec.units) {
    part += size_t(u.numel) / (expert > 0 && u.kind == UnitKind::Experts ? size_t(expert) : N);
  }
  at(MemCategory::Params) =
      stage == 3 ? size_t(b.param_partition + b.persistent + b.param_slots) : psi * p;
  at(MemCategory::MasterParams) = (stage >= 1 ? part : psi) * master;
  at(MemCategory::Grads) = stage >= 2 ? size_t(b.grad_partition + b.grad_slots) : psi * g;
  at(MemCategory::OptimizerState) = (stage >= 1 ? part : psi) * 4 * moments;
  for (MemCategory c : {MemCategory::Params, MemCategory::MasterParams, MemCategory::Grads,
                        MemCategory::OptimizerState}) {
    m.model_states += m.bytes[size_t(c)];
  }
  switch (stage) {
    case 0:
      m.formula = (p + g + k) * psi;
      break;
    case 1:
      m.formula = (p + g) * psi + k * part;
      break;
    case 2:
      m.formula = p * psi + (g + k) * part;
      break;
    default:
      m.formula = (p + g + k) * part;
      break;
  }
  m.buffers = size_t(b.persistent + b.param_slots + b.grad_slots);
  return m;
}

uint64_t predict_tp_bytes(const Layout& l, const ModelSpec& spec) {
  const uint64_t t = uint64_t(spec.tp.size);
  if (t == 1) return 0;
  const bool sp = l.sequence_parallel;
  const uint64_t b = dtype_size(l.zero.param_dtype);
  const uint64_t g = dtype_size(l.zero.grad_dtype);
  const uint64_t N = uint64_t(l.micro_batch) * uint64_t(l.seq_len);
  const uint64_t C = uint64_t(l.hidden), L = uint64_t(l.layers);
  // As Communicator::wire_bytes counts: n elements of w bytes over a group of k.
  auto ar = [](uint64_t k, uint64_t n, uint64_t w) { return 2 * (k - 1) * n * w / k; };
  auto ag = [&](uint64_t n_full, uint64_t w) { return (t - 1) * (n_full / t) * w; };
  const uint64_t X = N * C;  // a (B·T, C) activation
  uint64_t micro = 0;
  // Forward: embedding, blocks, head (the final norm's output gathered), cross-entropy.
  micro += sp ? ag(X, b) : ar(t, X, b);
  micro += L * (sp ? 4 * ag(X, b) : 2 * ar(t, X, b));
  if (sp) micro += ag(X, b);
  micro += (t - 1) * N * 4 + ar(t, 2 * N, 4);  // row maxima gathered; Σexp and target summed
  // Backward: the head's fp32 input gradient (and the re-gathered final norm output).
  micro += sp ? ag(X, 4) + ag(X, b) : ar(t, X, 4);
  micro += L * (sp ? 6 * ag(X, b) : 2 * ar(t, X, b));
  if (sp) micro += ag(X, b);  // the embedding's output gradient, gathered
  // Full recompute: each such block's forward again through the MLP's activation (SP: ln1 and
  // ln2 gathered, the projection reduce-scattered; otherwise the projection's all-reduce), its
  // partitioned checkpoint gathered first.
  const RecomputeOptions& rc = l.recompute;
  uint64_t R = 0;
  for (uint64_t i = 0; i < L; ++i) R += rc.is_full(int(i)) ? 1 : 0;
  micro += R * (sp ? 3 * ag(X, b) : ar(t, X, b));
  if (rc.partition) micro += R * (t - 1) * ((X + t - 1) / t) * b;
  // Partial gradients of replicated parameters (all of them under SP) and of replicated
  // key/value heads, summed in the grad dtype.
  for (const ParamSpec& p : spec.params) {
    if (sp && p.split_axis < 0) micro += ar(t, uint64_t(p.numel()), g);
    if (p.split_axis == 0 && p.ranges.size() == 2 && p.ranges[1].replicas > 1) {
      const uint64_t cols = p.shape.size() > 1 ? uint64_t(p.shape[1]) : 1;
      micro += ar(uint64_t(p.ranges[1].replicas), uint64_t(p.ranges[1].count) * cols, g);
    }
  }
  return uint64_t(l.accumulation) * micro + ar(t, 1, 4);  // + the norm's
}

std::string describe_memory(const MemoryPrediction& m) {
  std::string s = "model states " + format_bytes(m.model_states) + " per rank (";
  for (MemCategory c : {MemCategory::Params, MemCategory::MasterParams, MemCategory::Grads,
                        MemCategory::OptimizerState}) {
    s += std::string(mem_category_name(c)) + " " + format_bytes(m.bytes[size_t(c)]) +
         (c == MemCategory::OptimizerState ? "" : ", ");
  }
  s += ") = ZeRO formula " + format_bytes(m.formula) + " + buffers " + format_bytes(m.buffers);
  return s;
}

}  // namespace strata::cost
