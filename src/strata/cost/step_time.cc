#include "strata/cost/step_time.h"

#include <algorithm>
#include <cmath>

#include "strata/pipeline/schedule_check.h"

namespace strata::cost {

namespace {

// Seconds of a collective moving `bytes` per rank in `steps` messages over a link.
double collective_s(const Link& l, double bytes, int steps) {
  return bytes <= 0 ? 0.0 : l.alpha_s * steps + bytes / l.bytes_per_s;
}

// One stage's micro-batch, seconds: its forward and backward (recompute and half the tensor- and
// context-parallel collectives in each), and of them the recompute, the collectives and the
// weight gradients' GEMMs (which zero-bubble schedules defer).
struct StageTimes {
  double forward = 0, backward = 0, recompute = 0, tp = 0, cp = 0, ep = 0, weight_grad = 0;
};

StageTimes stage_times(const Config& cfg, const DeviceProfile& d, const StepShape& c,
                       const StageWork& sc, int running) {
  StageTimes t;
  const DType pt = cfg.param_dtype();
  const Link& tp_link = d.intra_node;  // check_tp_within_hosts holds
  const Link& cp_link = int64_t(c.tp) * c.cp <= c.per_node ? d.intra_node : d.inter_node;
  // An expert-parallel group: ep consecutive ranks of dp × cp, tp apart (whole experts: ep
  // consecutive ranks).
  const int64_t ep_span = c.whole_experts ? c.ep : int64_t(c.tp) * c.ep;
  const Link& ep_link = ep_span <= c.per_node ? d.intra_node : d.inter_node;
  const double eff_call = sc.gemm_call_flops;
  auto gemm = [&](double f) {
    // Calls of the typical size: their count times one call's time.
    const double calls = std::max(1.0, f / std::max(1.0, eff_call));
    return calls * d.gemm_seconds(f / calls, sc.gemm_rows, pt, running);
  };
  const double ew = d.elementwise_seconds(sc.elementwise_bytes, cfg.model.family, running);
  // Ring attention computes in blocks of a zig-zag chunk's rows (T / 2cp) against another's.
  const double Tw = double(cfg.model.seq_len) / (c.context_impl == "ring" ? 2.0 * c.cp : 1.0);
  auto attention = [&](double f) {
    return d.attention_flops.empty() ? gemm(f) : d.attention_seconds(f, Tw, pt, running);
  };
  const double tp_s =
      c.tp > 1 ? collective_s(tp_link, double(sc.tp_bytes), sc.tp_collectives * 2 * (c.tp - 1))
               : 0.0;
  const double calls = d.overhead_seconds(sc.forward_calls, running);
  // The ring's key/value passes hide behind the blocks' compute where it is longer.
  const double cp_s = c.cp > 1
                          ? collective_s(cp_link, sc.cp_bytes, sc.cp_collectives) +
                                std::max(0.0, collective_s(cp_link, sc.cp_overlapped_bytes, 0) -
                                                  gemm(3 * sc.forward_flops))
                          : 0.0;
  const double ep_s = c.ep > 1 ? collective_s(ep_link, sc.ep_bytes, sc.ep_collectives) : 0.0;
  const double linear = sc.forward_flops - sc.attention_flops;
  t.forward =
      gemm(linear) + attention(sc.attention_flops) + ew + calls + tp_s / 2 + cp_s / 2 + ep_s / 2;
  t.recompute = sc.recompute_flops > 0 ? gemm(sc.recompute_flops - sc.attention_recompute_flops) +
                                             attention(sc.attention_recompute_flops) + ew + calls
                                       : 0.0;
  t.backward = gemm(2 * linear) + attention(2 * sc.attention_flops) + 2 * ew + 2 * calls +
               tp_s / 2 + cp_s / 2 + ep_s / 2 + t.recompute;
  t.tp = tp_s;
  t.cp = cp_s;
  t.ep = ep_s;
  // Of the backward, the weight gradients' GEMMs (zero-bubble schedules defer them): the
  // elementwise kernels, attention and the input gradients' GEMMs stay with the input pass.
  const double stash = d.memory_seconds(sc.deferred_bytes, running);
  t.weight_grad = gemm(linear) + stash;
  t.backward += stash;
  return t;
}

// The calls the critical rank (sc's) makes per step, which a step fit prices: tensor-parallel
// collectives per micro-batch; the data-parallel reductions (stage 0: buckets once; 1: a
// reduce-scatter per unit and the gather after the step; 2: a reduce-scatter per unit and
// micro-batch; 3: also a gather per gathered unit and pass); MiCS's replica sums; pipeline sends
// and receives. Stage 3's parameter gathers are counted apart: the compute waits on them.
void count_calls(const Config& cfg, const StepShape& c, const StageWork& sc, StepTime& p) {
  const int m = int(cfg.gradient_accumulation_steps);
  const int dpn = c.dp * c.cp;  // the gradients' group
  const bool zero = c.zero, overlap = cfg.zero.overlap_comm;
  double coll = c.tp > 1 ? double(m) * sc.tp_collectives : 0.0;
  coll += double(m) * (sc.cp_collectives + sc.ep_collectives);
  if (dpn > 1 || zero) {  // ZeRO on a group of one still runs its reductions
    const double units = sc.units;
    if (!zero || cfg.zero.stage == 0) {
      const int64_t bucket = cfg.zero.reduce_bucket_size;
      coll += bucket > 0 ? std::ceil(double(sc.numel) / double(bucket)) : units;
    } else if (cfg.zero.stage == 1) {
      coll += 2.0 * units;
    } else if (cfg.zero.stage == 2) {
      coll += double(m) * units + units;
    } else {
      p.gathers = stage3_gather_passes(cfg, sc, m) * sc.gathered_units;
      coll += double(m) * units + (units - sc.gathered_units);
    }
    if (zero && c.shard < dpn) coll += units;
  }
  p.collectives = coll;
  // Tensor-parallel collectives that run while overlap_comm's data-parallel reductions are in
  // flight on the communication thread: on cores the ranks share, each waits for a peer the
  // reductions' thread competes with.
  if (c.tp > 1 && overlap && (dpn > 1 || zero)) {
    p.tp_beside_reductions = double(m) * sc.tp_collectives;
  }
  // Kernel calls: a backward makes about two of each forward call, a full recompute one more.
  p.kernel_calls = double(m) * sc.forward_calls * (3.0 + (sc.recompute_flops > 0 ? 1.0 : 0.0));
  if (c.pp > 1) {
    const int v = c.virtual_stages;
    p.messages = double(m) * v * (c.pp > 2 || v > 1 ? 4.0 : 2.0);
  }
}

// The step as the device profile's step fit for these ranks per node prices it (the model's where
// it has none, or on a GPU), and the tokens per second and MFU it gives.
void apply_step_fit(const Config& cfg, const DeviceProfile& d, const StepShape& c, StepTime& p) {
  p.step_s = p.model_step_s;
  if (const StepFit* f = d.gpu ? nullptr : d.step_fit(c.per_node)) {
    p.step_s = f->model_scale * p.model_step_s + f->per_collective_s * p.collectives +
               f->per_message_s * p.messages + f->per_call_s * p.kernel_calls +
               f->per_gather_s * p.gathers + f->per_tp_beside_s * p.tp_beside_reductions +
               f->per_contended_s * p.contended_collectives + f->per_step_s;
  }
  const double tokens = double(c.micro_batch * c.accumulation * c.dp) * cfg.model.seq_len;
  p.tokens_per_s = tokens / p.step_s;
  const double per_token =
      6.0 * c.param_numel + 12.0 * cfg.model.layers * cfg.model.hidden * cfg.model.seq_len;
  const double best = std::max({d.fp32_flops, d.bf16_flops, d.fp16_flops});
  const double machine = d.gpu ? best * c.world
                               : best * double(std::max(1, d.cores)) /
                                     std::max(1, d.threads_per_rank) *
                                     std::ceil(double(c.world) / c.per_node);
  p.mfu = per_token * p.tokens_per_s / machine;
}

}  // namespace

double stage3_gather_passes(const Config& cfg, const StageWork& sc, int64_t micro) {
  if (!cfg.zero.stage3_reshard_after_forward) return 1.0;
  const bool split =
      cfg.parallelism.pipeline > 1 &&
      pipeline::parse_schedule(cfg.parallelism.schedule) == pipeline::ScheduleKind::ZeroBubble;
  const double recompute = sc.recompute_flops > 0 ? (split ? 2.0 : 1.0) : 0.0;
  return double(micro) * (2.0 + recompute);
}

StepTime predict_step_time(const Config& cfg, const DeviceProfile& d, const StepShape& c,
                           const std::vector<StageWork>& stages) {
  StepTime p;
  const int world = c.world, shard = c.shard;
  const bool zero = c.zero;
  // CPU ranks share a node's cores: each op is timed at the speed a rank has while at most
  // `running` ranks run at once (one thread each once the ranks outnumber the cores); the ranks
  // beyond them take turns, which the node's busy time bounds below (cores_bound_s).
  const int sharing = d.gpu ? 1 : c.per_node;
  const int running = d.gpu ? 1 : std::min(sharing, std::max(1, d.cores));
  const DType pt = cfg.param_dtype();
  // Time: each stage's forward and backward per micro-batch, with its tensor-parallel
  // collectives; the schedule checker gives the span with the bubble and the sends.
  const Link& intra = d.intra_node;
  const Link& inter = d.inter_node;
  const bool pp_intra = int64_t(c.tp) * c.cp * c.dp * c.pp <= c.per_node;
  const bool dp_intra = int64_t(c.tp) * c.cp * c.dp <= c.per_node;
  const int m = int(cfg.gradient_accumulation_steps);
  std::vector<double> fwd(size_t(c.pp)), bwd(size_t(c.pp)), rec(size_t(c.pp)), tpc(size_t(c.pp));
  std::vector<double> cpc(size_t(c.pp)), epc(size_t(c.pp)), wgrad(size_t(c.pp));
  for (int s = 0; s < c.pp; ++s) {
    const StageTimes t = stage_times(cfg, d, c, stages[size_t(s)], running);
    fwd[size_t(s)] = t.forward, bwd[size_t(s)] = t.backward, rec[size_t(s)] = t.recompute;
    tpc[size_t(s)] = t.tp, cpc[size_t(s)] = t.cp, epc[size_t(s)] = t.ep;
    wgrad[size_t(s)] = t.weight_grad;
  }
  size_t slowest = 0;
  for (size_t s = 1; s < fwd.size(); ++s) {
    if (fwd[s] + bwd[s] > fwd[slowest] + bwd[slowest]) slowest = s;
  }
  p.compute_s = m * (fwd[slowest] + bwd[slowest] - tpc[slowest] - cpc[slowest] - epc[slowest]);
  p.recompute_s = m * rec[slowest];
  p.tp_comm_s = m * tpc[slowest];
  p.cp_comm_s = m * cpc[slowest];
  p.ep_comm_s = m * epc[slowest];
  double span = m * (fwd[slowest] + bwd[slowest]);
  // The schedule as simulated (one stage: its micro-batches in a row), kept for the cores' share.
  pipeline::ScheduleSpec sim_spec{pipeline::ScheduleKind::OneFOneB, 1, m, 1};
  pipeline::Costs sim_costs{fwd[0], bwd[0], 0.0, 0.0};
  std::vector<double> sim_scale;
  if (c.pp > 1) {
    const double msg = c.message_bytes;
    const Link& pl = pp_intra ? intra : inter;
    const int v = c.virtual_stages;
    double mean_f = 0, mean_b = 0, mean_w = 0;
    for (int s = 0; s < c.pp; ++s) {
      mean_f += fwd[size_t(s)], mean_b += bwd[size_t(s)], mean_w += wgrad[size_t(s)];
    }
    mean_f /= c.pp, mean_b /= c.pp, mean_w /= c.pp;
    std::vector<double> scale;
    for (int s = 0; s < c.pp; ++s) {
      scale.push_back((fwd[size_t(s)] + bwd[size_t(s)]) / std::max(1e-30, mean_f + mean_b));
    }
    pipeline::Costs costs;
    costs.forward = mean_f / v;
    const bool split = c.schedule == pipeline::ScheduleKind::ZeroBubble;
    costs.backward_input = split ? (mean_b - mean_w) / v : mean_b / v;
    costs.backward_weight = split ? mean_w / v : 0.0;
    costs.send = pl.seconds(msg);
    const pipeline::ScheduleSpec spec{c.schedule, c.pp, m, v};
    const pipeline::CheckResult chk =
        pipeline::check(spec, pipeline::generate(spec), costs, 0, scale);
    span = chk.makespan;
    p.bubble_fraction = chk.bubble_fraction;
    sim_spec = spec, sim_costs = costs, sim_scale = scale;
    p.pp_comm_s = 2.0 * m * v * costs.send;
  }
  p.bubble_s = std::max(0.0, span - p.compute_s - p.tp_comm_s - p.cp_comm_s - p.ep_comm_s);

  // Data parallel and ZeRO, over the slowest stage's parameters.
  const StageWork& sc = stages[slowest];
  const double wire = double(dtype_size(cfg.comm_dtype()));
  const double elems = double(sc.numel);
  const int dpn = c.dp * c.cp;  // the gradients' group
  const Link& dl = dp_intra ? intra : inter;
  const double f = dpn > 1 ? double(dpn - 1) / dpn : 0.0;
  double reduce = 0, gather = 0, gather_per_pass = 0;
  // The reductions' own streaming work on the rank: the gradients converted to the wire dtype
  // and back, the received chunks summed, and at stages 2-3 (on every micro-batch) the owned
  // chunk added into the gradient partition and the unit's buffer zeroed for the next one.
  const DType gt = cfg.grad_dtype();
  const double gsz = double(dtype_size(gt));
  const double convert = gt != cfg.comm_dtype() ? gsz + wire : 0.0;  // bytes an element
  double local_bytes = 0;
  if (dpn > 1) {
    if (!zero || cfg.zero.stage == 0) {
      reduce = collective_s(dl, 2.0 * f * elems * wire, 2 * (dpn - 1));
      local_bytes = 2.0 * convert * elems + 3.0 * wire * f * elems;
    } else {
      const int g = shard;
      const double fg = double(g - 1) / g;
      const Link& sl = int64_t(c.tp) * g <= c.per_node ? intra : inter;
      reduce = collective_s(sl, fg * elems * wire, g - 1);
      if (g < dpn) {  // MiCS: the shards' gradients are summed across replicas
        reduce +=
            collective_s(dl, 2.0 * (1.0 - 1.0 / (dpn / g)) * elems / g * wire, 2 * (dpn / g - 1));
      }
      local_bytes = convert * (elems + elems / g) + 3.0 * wire * fg * elems;
      if (cfg.zero.stage >= 2) {
        local_bytes = m * (local_bytes + 3.0 * gsz * elems / g + gsz * elems);
      }
      if (cfg.zero.stage <= 2) {
        gather = collective_s(sl, fg * elems * double(dtype_size(pt)), g - 1);
        if (cfg.zero.stage == 2) reduce *= m;  // a reduce-scatter per unit and micro-batch
      } else {
        // Stage 3: every micro-batch gathers each unit for forward and again for backward
        // (and for recompute), and reduce-scatters its gradients; without
        // stage3_reshard_after_forward each unit is gathered once per step.
        gather_per_pass = collective_s(sl, fg * elems * double(dtype_size(pt)), g - 1);
        gather = stage3_gather_passes(cfg, sc, m) * gather_per_pass;
        reduce *= m;
      }
    }
  }
  if (dpn == 1 && zero) {
    // ZeRO over a group of one still reduces through a one-rank reduce-scatter, bytes an
    // element: the gradients converted to the wire where it differs (convert), MPI's copy of
    // them (2 wire), and back through scratch, the result overlapping the input (wire + gsz).
    // Stage 1 once a step; stages 2-3 on every micro-batch, adding the result into the
    // partition (3 gsz) and zeroing the unit buffer handed to backward (gsz).
    // (GPT-2, C 384, dp 1 tp 2+sp pp 2 on 4 ranks of 2 cores: ZeRO-1 measured 1-6% slower than
    // ZeRO-0 in each of six pairs of layouts otherwise the same, which the model priced equal.)
    const double one_rank = elems * (convert + 2.0 * wire + wire + gsz);
    local_bytes = cfg.zero.stage == 1 ? one_rank : m * (one_rank + 3.0 * gsz * elems + gsz * elems);
  }
  // That work takes the rank's own cores (a GPU's memory) beside its compute: never hidden.
  const double reduce_work = d.memory_seconds(local_bytes, running);
  p.dp_comm_s = reduce + gather + reduce_work;
  const bool overlap = cfg.zero.overlap_comm;  // the parser applies DeepSpeed's default
  const double last_backward = bwd[slowest];
  if (cfg.zero.stage == 3 && zero) {
    // Prefetched gathers hide behind the compute they precede; reductions behind backward.
    const double hidden = overlap ? m * (fwd[slowest] + bwd[slowest]) : 0.0;
    p.dp_exposed_s = reduce_work + std::max(0.0, reduce + gather - hidden);
  } else {
    // Stage 2 reduces on every micro-batch, behind that micro-batch's backward.
    const double hidden = (cfg.zero.stage == 2 && zero ? m : 1) * last_backward;
    p.dp_exposed_s = reduce_work + gather + (overlap ? std::max(0.0, reduce - hidden) : reduce);
  }
  // The optimizer reads and writes the fp32 master, the moments and the gradient of each
  // element it owns, and writes the parameter.
  const double owned = zero ? elems / shard : elems;
  p.optimizer_s = d.memory_seconds(owned * (4.0 * 4 * 2 + double(dtype_size(pt))), running);
  p.model_step_s = span + p.dp_exposed_s + p.optimizer_s;
  if (sharing > running) {
    // More ranks than cores: strata launch pins local rank l to core l mod cores, and a rank
    // waiting (in a bubble, on a peer) leaves its core to those with work. The schedule is
    // simulated with each stage's ranks sharing their cores with the stages runnable at each
    // moment; after its list each rank does its data-parallel collectives' work (on one host
    // they are the cores' copies and sums, overlapped or not). The gradients' global norm then
    // waits for every rank, and all of them take their optimizer step at once, as many to a
    // core as the busiest core holds.
    std::vector<std::vector<int>> rank_cpu(size_t(c.pp));
    std::vector<double> node_busy(size_t((world + c.per_node - 1) / c.per_node));
    for (int rank = 0; rank < world; ++rank) {
      const size_t s = size_t(c.stage_of_rank[size_t(rank)]);
      const int node = rank / c.per_node, local = rank % c.per_node;
      rank_cpu[s].push_back(node * running + local % running);
      node_busy[size_t(node)] += m * (fwd[s] + bwd[s]) + p.dp_comm_s + p.optimizer_s;
    }
    // The node's busy core-seconds over its cores: what the step would be were no core idle.
    p.cores_bound_s = *std::max_element(node_busy.begin(), node_busy.end()) / running;
    const std::vector<double> tail(size_t(c.pp), p.dp_comm_s);
    // The columns at the rank's share of the cores: its compute and its optimizer step take
    // sharing / running times as long, the bubble is what remains.
    const double turns = double(sharing) / running;
    p.compute_s *= turns, p.recompute_s *= turns, p.optimizer_s *= turns;
    const pipeline::SharedResult sim = pipeline::shared_makespan(
        sim_spec, pipeline::generate(sim_spec), sim_costs, sim_scale, rank_cpu, tail);
    p.model_step_s = sim.makespan + p.optimizer_s;
    for (int s = 0; s < c.pp; ++s) {
      const StageWork& st = stages[size_t(s)];
      p.contended_collectives = std::max(
          p.contended_collectives,
          double(m) * sim.contended[size_t(s)] *
              ((c.tp > 1 ? st.tp_collectives : 0.0) + st.cp_collectives + st.ep_collectives));
    }
    p.bubble_s = std::max(0.0, p.model_step_s - p.compute_s - p.tp_comm_s - p.cp_comm_s -
                                   p.ep_comm_s - p.dp_exposed_s - p.optimizer_s);
  }
  count_calls(cfg, c, stages[slowest], p);
  apply_step_fit(cfg, d, c, p);
  return p;
}

}  // namespace strata::cost
