#include "strata/planner/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/cost/predict.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/pipeline/executor.h"
#include "strata/pipeline/partition.h"
#include "strata/pipeline/schedule.h"
#include "strata/pipeline/schedule_check.h"
#include "strata/train/engine.h"

namespace strata::planner {

using nlohmann::json;

Cluster uniform_cluster(int devices, int per_node) {
  STRATA_INPUT_CHECK(devices >= 1, "--devices must be at least 1, got ", devices);
  STRATA_INPUT_CHECK(per_node >= 1, "--devices-per-node must be at least 1, got ", per_node);
  Cluster c;
  c.devices = devices, c.per_node = std::min(per_node, devices);
  for (int left = devices, n = 0; left > 0; left -= per_node, ++n) {
    c.hosts.emplace_back("node" + std::to_string(n), std::min(left, per_node));
  }
  return c;
}

std::string describe(const Candidate& c) {
  std::string s = "dp" + std::to_string(c.dp) + " tp" + std::to_string(c.tp);
  if (c.sequence_parallel) s += "+sp";
  if (c.cp > 1) s += " cp" + std::to_string(c.cp) + "/" + c.context_impl;
  if (c.ep > 1) s += " ep" + std::to_string(c.ep);
  if (c.whole_experts) s += " etp1";
  s += " pp" + std::to_string(c.pp);
  if (c.pp > 1) {
    s += "/" + c.schedule;
    if (c.virtual_stages > 1) s += "x" + std::to_string(c.virtual_stages);
  }
  s += " z" + std::to_string(c.zero);
  if (c.mics > 0) s += "/mics" + std::to_string(c.mics);
  s += " mb" + std::to_string(c.micro_batch) + "x" + std::to_string(c.accumulation);
  if (c.recompute != "none") s += " rc=" + c.recompute;
  return s;
}

namespace {

std::vector<int> divisors(int64_t n, int64_t cap) {
  std::vector<int> d;
  for (int64_t k = 1; k <= std::min(n, cap); ++k) {
    if (n % k == 0) d.push_back(int(k));
  }
  return d;
}

int64_t global_batch(const json& base) {
  STRATA_INPUT_CHECK(base.is_object() && base.contains("train_batch_size") &&
                         base["train_batch_size"].is_number_integer() &&
                         base["train_batch_size"].get<int64_t>() >= 1,
                     "strata plan needs the global batch: set train_batch_size in the config "
                     "(the sequences of one optimizer step over every data-parallel rank)");
  return base["train_batch_size"].get<int64_t>();
}

}  // namespace

json candidate_config(const json& base, const Candidate& c) {
  json j = base;
  j["train_batch_size"] = c.micro_batch * c.accumulation * c.dp;
  j["train_micro_batch_size_per_gpu"] = c.micro_batch;
  j["gradient_accumulation_steps"] = c.accumulation;
  json& p = j["parallelism"];
  if (!p.is_object()) p = json::object();
  p["tensor"] = c.tp, p["pipeline"] = c.pp, p["sequence_parallel"] = c.sequence_parallel;
  p["schedule"] = c.schedule, p["virtual_stages"] = c.virtual_stages;
  if (c.cp > 1) {
    p["context"] = c.cp, p["context_impl"] = c.context_impl;
  } else {
    p.erase("context"), p.erase("context_impl");
  }
  if (c.ep > 1) {
    p["expert"] = c.ep;
  } else {
    p.erase("expert");
  }
  if (c.whole_experts) {
    p["expert_tensor"] = 1;
  } else {
    p.erase("expert_tensor");
  }
  json& z = j["zero_optimization"];
  if (!z.is_object()) z = json::object();
  z["stage"] = c.zero;
  if (c.mics > 0) {
    z["mics_shard_size"] = c.mics;
  } else {
    z.erase("mics_shard_size");
  }
  if (c.recompute == "none") {
    j.erase("activation_checkpointing");
  } else {
    json& a = j["activation_checkpointing"];
    if (!a.is_object()) a = json::object();
    a["recompute_granularity"] = c.recompute;
  }
  return j;
}

std::vector<Candidate> enumerate(const PlanInput& in) {
  const int64_t G = global_batch(in.base);
  const Config base = parse_config(in.base);
  const int N = in.cluster.devices, layers = base.model.layers;
  // Context parallelism: powers of two up to 8 that split the sequence, by either
  // implementation, on the CPU backend (the CUDA backend has no context-parallel attention).
  std::vector<std::pair<int, std::string>> contexts = {{1, "ulysses"}};
  if (!in.device.gpu) {
    for (int cp = 2; cp <= 8; cp *= 2) {
      if (base.model.seq_len % cp == 0) contexts.emplace_back(cp, "ulysses");
      if (base.model.seq_len % (2 * cp) == 0) contexts.emplace_back(cp, "ring");
    }
  }
  std::vector<Candidate> out;
  for (int tp : divisors(N, 64)) {
    for (int pp : divisors(N / tp, layers)) {
      for (const auto& [cp, impl] : contexts) {
        if ((N / tp / pp) % cp != 0) continue;
        const int dp = N / tp / pp / cp;
        if (G % dp != 0) continue;  // no micro-batch × accumulation gives the global batch
        const int64_t per_rank = G / dp;
        // Expert parallelism: every size dividing both the experts and dp × cp, on the CPU
        // backend (a mixture of experts runs there only); with whole experts beside tp (under
        // sequence parallelism), every size dividing the experts and tp × dp × cp.
        std::vector<int> experts = {1}, whole = {};
        if (base.model.moe.experts > 0 && !in.device.gpu) {
          for (int ep : divisors(dp * cp, base.model.moe.experts)) {
            if (ep > 1 && base.model.moe.experts % ep == 0) experts.push_back(ep);
          }
          for (int ep : divisors(int64_t(tp) * dp * cp, base.model.moe.experts)) {
            if (tp > 1 && base.model.moe.experts % ep == 0) whole.push_back(ep);
          }
        }
        std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
        if (pp > 1) {
          schedules = {{"1f1b", 1}, {"gpipe", 1}, {"zero_bubble", 1}};
          for (int v = 2; v <= 4 && pp * v <= layers; ++v) schedules.emplace_back("interleaved", v);
        }
        std::vector<int64_t> mics = {-1};
        for (int g : divisors(dp, dp - 1)) {
          if (g > 1 && int64_t(g) * tp <= in.cluster.per_node) mics.push_back(g);
        }
        for (int64_t mb : divisors(per_rank, per_rank)) {
          for (const auto& [sched, v] : schedules) {
            for (int zero = 0; zero <= 3; ++zero) {
              for (int64_t g : mics) {
                if (g > 0 && zero == 0) continue;
                for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                  for (const char* rc : {"none", "selective", "full"}) {
                    const auto add = [&](int ep, bool whole_experts) {
                      // MiCS with expert parallelism (or whole experts): refused
                      if ((ep > 1 || whole_experts) && g > 0) return;
                      Candidate c;
                      c.dp = dp, c.tp = tp, c.pp = pp, c.virtual_stages = v, c.schedule = sched;
                      c.zero = zero, c.mics = g, c.sequence_parallel = sp != 0, c.recompute = rc;
                      c.cp = cp, c.context_impl = impl, c.ep = ep;
                      c.whole_experts = whole_experts;
                      c.micro_batch = mb, c.accumulation = per_rank / mb;
                      out.push_back(c);
                    };
                    for (int ep : experts) add(ep, false);
                    for (int ep : whole) {
                      if (sp != 0) add(ep, true);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

// What depends only on the model's cut (tp, stages, virtual stages, shard group, stage): built
// once per plan and shared by every candidate with that cut.
struct SpecCache {
  struct Entry {
    ModelSpec spec;
    pipeline::StagePlan plan;
    pipeline::UnitFlops flops;
  };
  std::map<std::array<int, 7>, Entry> entries;
  // A chunk's arena bytes by (its cut, units, B, slots, input slots, deferred weight gradients,
  // recompute, sequence parallelism): sizing one walks every unit and parameter of the spec.
  std::map<std::tuple<const Entry*, int, int, int, int, int, bool, std::string, bool, int, int>,
           ArenaBytes>
      arenas;
  ArenaBytes arena_of(const Entry& e, DType pt, DType gt, int B, int T, const ChunkOptions& ch,
                      bool sp, const std::string& recompute) {
    const int context = ch.context.size * 2 + (ch.context.impl == ContextOptions::Impl::Ring);
    const auto key = std::make_tuple(&e, ch.unit_begin, ch.unit_end, B, ch.slots, ch.input_slots,
                                     ch.defer_weight, recompute, sp, int(ch.device), context);
    auto it = arenas.find(key);
    if (it == arenas.end()) {
      it = arenas.emplace(key, transformer_arena_bytes(e.spec, pt, gt, B, T, ch, sp)).first;
    }
    return it->second;
  }
  // Per schedule (kind, stages, micro-batches, virtual stages): each stage's chunk slots.
  std::map<std::array<int, 4>, std::vector<pipeline::ChunkSlots>> slots;
  const pipeline::ChunkSlots& slots_of(const pipeline::ScheduleSpec& s, int stage) {
    const std::array<int, 4> key{int(s.kind), s.stages, s.micro, s.virtual_stages};
    auto it = slots.find(key);
    if (it == slots.end()) {
      std::vector<pipeline::ChunkSlots> per_stage;
      for (const std::vector<pipeline::Action>& list : pipeline::generate(s)) {
        per_stage.push_back(pipeline::chunk_slots(list, s.virtual_stages));
      }
      it = slots.emplace(key, std::move(per_stage)).first;
    }
    return it->second[size_t(stage)];
  }
  // The spec of expert-parallel rank 0 of cfg's parallelism.expert (every rank of the group holds
  // as many experts), split over tp or whole.
  Entry& at(const Config& cfg, int tp, int pp, int v, int shard, int stage) {
    const std::array<int, 7> key{
        tp, pp, v, shard, stage, cfg.parallelism.expert, int(cfg.parallelism.whole_experts())};
    auto it = entries.find(key);
    if (it != entries.end()) return it->second;
    Entry e;
    e.spec = stage_model_spec(cfg, shard, tp, 0, pp, stage, e.plan);
    e.flops = pipeline::unit_flops(e.spec);
    return entries.emplace(key, std::move(e)).first->second;
  }
};

namespace {

cost::StageWork stage_cost(const PlanInput& in, const Config& cfg, const Candidate& c, int stage,
                           int shard, bool zero, Device device, SpecCache& cache) {
  cost::StageWork s;
  SpecCache::Entry& entry =
      cache.at(cfg, c.tp, c.pp, c.pp > 1 ? c.virtual_stages : 1, shard, stage);
  const ModelSpec& spec = entry.spec;
  const pipeline::StagePlan& plan = entry.plan;
  cost::Layout layout = cost::layout_of(cfg);
  layout.local_ranks = in.cluster.per_node;
  const cost::MemoryPrediction m = cost::predict_memory(layout, spec, zero ? int(spec.align) : 0);
  s.bytes = m.bytes;
  s.numel = spec.numel;
  for (const UnitSpec& u : spec.units) {
    if (!u.held || u.numel == 0) continue;
    ++s.units;
    if (u.numel > cfg.zero.stage3_param_persistence_threshold) ++s.gathered_units;
  }
  // The chunks this stage holds, with the slots its schedule asks for.
  const pipeline::ExecutorOptions o = executor_options(cfg, stage, c.pp);
  const pipeline::ScheduleSpec sched{o.schedule, c.pp, o.micro_batches, o.virtual_stages};
  const pipeline::ChunkSlots& cs = cache.slots_of(sched, stage);
  const DType pt = o.param_dtype, gt = o.grad_dtype;
  const pipeline::UnitFlops& uf = entry.flops;
  const int B = int(c.micro_batch);
  // This rank's rows of each sequence (T/cp); attention's T² work splits over cp as well.
  const double T = double(cfg.model.seq_len) / c.cp, C = double(cfg.model.hidden);
  for (int k = 0; k < o.virtual_stages; ++k) {
    const int g = pipeline::global_chunk(k, stage, c.pp);
    ChunkOptions ch;
    ch.unit_begin = plan.chunks[size_t(g)].first, ch.unit_end = plan.chunks[size_t(g)].second;
    ch.slots = cs.slots[size_t(k)], ch.input_slots = cs.input_slots[size_t(k)];
    ch.defer_weight = cs.defer_weight;
    ch.recompute = o.recompute;
    ch.device = device;
    ch.context = o.context;
    const ArenaBytes a =
        cache.arena_of(entry, pt, gt, B, int(o.seq_len), ch, c.sequence_parallel, c.recompute);
    s.bytes[size_t(MemCategory::Activations)] += a.activations;
    s.bytes[size_t(MemCategory::Workspace)] += a.workspace;
    s.bytes[size_t(a.host_checkpoints ? MemCategory::HostCheckpoints
                                      : MemCategory::CheckpointedActivations)] += a.checkpoints;
  }
  // The step's token ids, targets and, with document masking, document starts (the engine's,
  // host memory), and under context parallelism this rank's rows of the first two.
  const size_t sequences = size_t(c.micro_batch * c.accumulation);
  s.bytes[size_t(MemCategory::Activations)] +=
      (cfg.data.document_mask ? 3 : 2) * sequences * size_t(cfg.model.seq_len) * sizeof(int32_t);
  if (c.cp > 1) {
    s.bytes[size_t(MemCategory::Activations)] +=
        2 * sequences * size_t(cfg.model.seq_len / c.cp) * sizeof(int32_t);
  }
  // FLOPs of the blocks this stage holds (the plan's, or the whole model's without a pipeline).
  int full_blocks = 0;  // of them, those a full recompute reruns
  if (c.pp > 1) {
    for (int k = 0; k < o.virtual_stages; ++k) {
      const int g = pipeline::global_chunk(k, stage, c.pp);
      for (int b = plan.layers_begin[size_t(g)];
           b < plan.layers_begin[size_t(g)] + plan.blocks[size_t(g)]; ++b) {
        s.forward_flops += uf.block[size_t(b)] * B;
        s.blocks++;
        if (o.recompute.is_full(b)) s.recompute_flops += uf.block[size_t(b)] * B, ++full_blocks;
      }
    }
    if (stage == 0) s.forward_flops += uf.embedding * B;
    if (stage == c.pp - 1) s.forward_flops += uf.head * B;
  } else {
    for (double f : uf.block) s.forward_flops += f * B;
    s.forward_flops += (uf.embedding + uf.head) * B;
    s.blocks = cfg.model.layers;
    for (int b = 0; b < cfg.model.layers; ++b) {
      if (o.recompute.is_full(b)) s.recompute_flops += uf.block[size_t(b)] * B, ++full_blocks;
    }
  }
  // Context parallelism: each rank computes 1/cp of every sequence's work (its rows through the
  // linear layers; under either attention its share of the T² scores).
  s.forward_flops /= c.cp, s.recompute_flops /= c.cp;
  // The attention core: 4·T²·(heads held·head dim) per block over the whole sequence, 1/cp of it
  // here (unit_flops counts it in the blocks'), again for each block a full recompute reruns.
  const double heads_dim = C / double(c.tp), Tw = double(cfg.model.seq_len);
  const double core = 4.0 * Tw * Tw / c.cp * heads_dim * B;
  s.attention_flops = core * s.blocks;
  s.attention_recompute_flops = core * full_blocks;
  // Selective recompute reruns the attention core alone.
  if (o.recompute.selective) {
    s.recompute_flops += core * s.blocks, s.attention_recompute_flops += core * s.blocks;
  }
  const double rows = double(B) * T;
  const double ffn = double(cfg.model.ffn_hidden > 0 ? cfg.model.ffn_hidden : 4 * cfg.model.hidden);
  s.gemm_call_flops = 2.0 * rows * C * ffn / double(c.tp);
  s.gemm_rows = rows;
  // Kernel calls of a block's forward: 2 norms, 4 linears, attention, activation, 2 residual
  // adds, and their bias and copy steps (about 14); the embedding and the head's few.
  s.forward_calls = 14.0 * s.blocks + 6.0;
  // Elementwise traffic per block forward: two norms, the residual adds, the activation and
  // the attention's softmax rows, each read and written (about 12 (rows, C) tensors), plus the
  // (rows, ffn) activation.
  const double rows_local = c.sequence_parallel ? rows / c.tp : rows;
  s.elementwise_bytes =
      s.blocks * (12.0 * rows_local * C + 3.0 * rows * ffn / c.tp) * double(dtype_size(pt));
  if (o.schedule == pipeline::ScheduleKind::ZeroBubble) {
    // Per linear rows·(K + 2N): QKV, the attention's projection, the MLP's up (Llama's gate and
    // up) and down; the head on the last stage.
    const double tp = c.tp, qkv = C + 2.0 * C * cfg.model.kv_heads / cfg.model.heads;
    const double up = (cfg.model.gpt2_block() ? 1.0 : 2.0) * ffn;
    double per_block =
        (C + 2.0 * qkv / tp) + (C / tp + 2.0 * C) + (C + 2.0 * up / tp) + (ffn / tp + 2.0 * C);
    double total = s.blocks * per_block;
    if (stage == c.pp - 1) total += C + 2.0 * double(cfg.model.vocab) / tp;
    s.deferred_bytes = rows * total * double(dtype_size(pt));
  }
  // Tensor-parallel traffic: the step's (one stage's share of the blocks), per micro-batch.
  if (c.tp > 1) {
    cost::Layout one = layout;
    one.accumulation = 1;
    one.seq_len = int64_t(T);  // this rank's rows
    const ModelSpec& whole = cache.at(cfg, c.tp, 1, 1, shard, 0).spec;
    const double share = double(s.blocks) / double(std::max(1, cfg.model.layers));
    s.tp_bytes = uint64_t(double(cost::predict_tp_bytes(one, whole)) * share);
    s.tp_collectives = 4 * s.blocks + (c.sequence_parallel ? 2 * s.blocks : 0) + 2;
  }
  // Context parallelism, per micro-batch and block: Ulysses' all-to-alls of the QKV and the
  // attention output forward, of their gradients backward (and the forward's again for a full
  // recompute), each moving (cp−1)/cp of its buffer; ring attention's cp−1 passes of the keys and
  // values forward and again backward (overlapped with the blocks in hand) and cp hops of their
  // fp32 gradients (waited for).
  if (c.cp > 1) {
    const double kv_dim = 2.0 * heads_dim * double(cfg.model.kv_heads) / double(cfg.model.heads);
    const double qkv = rows * (heads_dim + kv_dim), out = rows * heads_dim;
    const double f = double(c.cp - 1) / c.cp, b = double(dtype_size(pt));
    int recomputed = 0;
    for (int k = 0; k < o.virtual_stages; ++k) {
      const int g = c.pp > 1 ? pipeline::global_chunk(k, stage, c.pp) : 0;
      const int first = c.pp > 1 ? plan.layers_begin[size_t(g)] : 0;
      const int n = c.pp > 1 ? plan.blocks[size_t(g)] : cfg.model.layers;
      for (int blk = first; blk < first + n; ++blk) recomputed += o.recompute.is_full(blk) ? 1 : 0;
    }
    if (c.context_impl == "ring") {
      const double kv = rows * kv_dim * b;
      s.cp_overlapped_bytes = (2.0 * s.blocks + recomputed) * (c.cp - 1) * kv;
      s.cp_bytes = s.blocks * double(c.cp) * 2.0 * kv;  // the gradients in fp32
      s.cp_collectives = (2 * s.blocks + recomputed) * (c.cp - 1) + s.blocks * c.cp;
    } else {
      s.cp_bytes = (2.0 * s.blocks + recomputed) * f * (qkv + out) * b;
      s.cp_collectives = 4 * s.blocks + 2 * recomputed;
    }
  }
  // Expert parallelism, per micro-batch and MoE block of the stage, the forward's again for a
  // full recompute. All-to-all: the counts and the rows to the experts' ranks and back forward,
  // the outputs' and inputs' gradients backward; each moving (ep−1)/ep of the rank's
  // rows·top_k·C (balanced routing). All-gather: the counts, tokens, plans and gates gathered and
  // the outputs reduce-scattered forward; the outputs' gradients gathered, the gates' and the
  // inputs' reduce-scattered backward; a ring's (ep−1)·rows·C of tokens each (and top_k int32 or
  // fp32 values a row for the plans and gates). Whole experts dispatch a rank's own rows.
  if (c.ep > 1) {
    int moe = 0, moe_recomputed = 0;
    for (int k = 0; k < o.virtual_stages; ++k) {
      const int g = c.pp > 1 ? pipeline::global_chunk(k, stage, c.pp) : 0;
      const int first = c.pp > 1 ? plan.layers_begin[size_t(g)] : 0;
      const int n = c.pp > 1 ? plan.blocks[size_t(g)] : cfg.model.layers;
      for (int blk = first; blk < first + n; ++blk) {
        if (!cfg.model.moe_layer(blk)) continue;
        ++moe;
        moe_recomputed += o.recompute.is_full(blk) ? 1 : 0;
      }
    }
    const double f = double(c.ep - 1) / c.ep, b = double(dtype_size(pt));
    const double k = double(cfg.model.moe.top_k);
    const double routed = c.whole_experts ? rows_local : rows;  // whole experts: its own rows
    if (cfg.parallelism.expert_dispatch == "all_gather") {
      const double tokens = double(c.ep - 1) * routed * C * b,
                   plans = double(c.ep - 1) * routed * k * 4;
      s.ep_bytes =
          (4.0 * moe + 2.0 * moe_recomputed) * tokens + (3.0 * moe + 2.0 * moe_recomputed) * plans;
      s.ep_collectives = 8 * moe + 5 * moe_recomputed;
    } else {
      s.ep_bytes = (4.0 * moe + 2.0 * moe_recomputed) * f * routed * k * C * b;
      s.ep_collectives = 5 * moe + 3 * moe_recomputed;
    }
  }
  // The pipeline's buffers: the send ring and a receive buffer per direction and chunk (and a
  // GPU's receive stage in host memory).
  if (c.pp > 1) {
    const size_t msg = pipeline::pipeline_message_bytes(o, c.tp, c.sequence_parallel);
    size_t comm = size_t(pipeline::send_ring_slots(cs)) * msg + 2 * size_t(o.virtual_stages) * msg;
    if (device == Device::CUDA) comm += msg;
    s.bytes[size_t(MemCategory::CommBuffers)] += comm;
  }
  return s;
}

}  // namespace

Row evaluate(const PlanInput& in, const Candidate& c) {
  SpecCache cache;
  return evaluate(in, c, cache);
}

Row evaluate(const PlanInput& in, const Candidate& c, SpecCache& cache) {
  Row r;
  r.c = c;
  try {
    const json j = candidate_config(in.base, c);
    Config cfg = parse_config(j);
    resolve_batch(cfg, c.dp);
    const int world = in.cluster.devices;
    const comm::RankGrid grid(world, c.tp, c.pp, "tp-dp-pp", c.cp);
    comm::check_tp_within_hosts(grid, in.cluster.hosts);
    const bool dp_group = world > 1;
    // Gradients are summed and ZeRO shards over dp × cp (the parameters are whole on every
    // context-parallel rank).
    const int shard = shard_group_size(cfg, c.dp * c.cp, dp_group);
    check_expert_grid(cfg, c.dp * c.cp);
    check_pipeline_layout(cfg, c.pp);
    const bool zero = zero_in_effect(cfg, dp_group);
    const cost::DeviceProfile& d = in.device;
    const Device device = d.gpu ? Device::CUDA : Device::CPU;

    // Memory: the stage whose rank holds the most.
    std::vector<cost::StageWork> stages;
    Prediction& p = r.p;
    for (int s = 0; s < c.pp; ++s) {
      stages.push_back(stage_cost(in, cfg, c, s, shard, zero, device, cache));
      p.stage_bytes.push_back(stages.back().bytes);
      size_t dev = 0;
      for (int k = 0; k < kNumMemCategories; ++k) {
        if (MemCategory(k) != MemCategory::HostCheckpoints) dev += stages.back().bytes[size_t(k)];
      }
      if (s == 0 || dev > p.device_bytes) {
        p.device_bytes = dev, p.bytes = stages.back().bytes, p.worst_stage = s;
      }
      // The first stage that does not fit refuses the layout: the others need not be sized.
      STRATA_INPUT_CHECK(!d.gpu || p.device_bytes <= d.memory_bytes,
                         "out of memory: ", format_bytes(p.device_bytes), " per GPU (stage ",
                         p.worst_stage, ") exceeds its ", format_bytes(d.memory_bytes));
    }
    size_t all = 0;
    for (size_t b : p.bytes) all += b;
    const int local = std::min(in.cluster.per_node, world);
    p.node_host_bytes =
        size_t(local) * (d.gpu ? p.bytes[size_t(MemCategory::HostCheckpoints)] : all);
    STRATA_INPUT_CHECK(p.node_host_bytes <= d.host_memory_bytes,
                       "out of memory: ", format_bytes(p.node_host_bytes), " per node exceeds its ",
                       format_bytes(d.host_memory_bytes), " of host memory");

    // Time: the cost model's (cost/step_time.h) over the stages' work.
    cost::StepShape shape;
    shape.world = world, shape.per_node = in.cluster.per_node;
    shape.dp = c.dp, shape.tp = c.tp, shape.pp = c.pp, shape.cp = c.cp, shape.ep = c.ep;
    shape.whole_experts = c.whole_experts;
    shape.context_impl = c.context_impl, shape.sequence_parallel = c.sequence_parallel;
    shape.micro_batch = c.micro_batch, shape.accumulation = c.accumulation;
    shape.shard = shard, shape.zero = zero;
    if (c.pp > 1) {
      const pipeline::ExecutorOptions o = executor_options(cfg, 0, c.pp);
      shape.schedule = o.schedule, shape.virtual_stages = o.virtual_stages;
      shape.message_bytes = double(pipeline::pipeline_message_bytes(o, c.tp, c.sequence_parallel));
    }
    for (int rank = 0; rank < world; ++rank) {
      shape.stage_of_rank.push_back(grid.coord(rank).at(comm::Axis::PP));
    }
    shape.param_numel = double(cache.at(cfg, 1, 1, 1, 1, 0).spec.global_param_numel);
    static_cast<cost::StepTime&>(p) = cost::predict_step_time(cfg, d, shape, stages);
  } catch (const InputError& e) {
    r.reason = e.what();
    if (r.reason.empty()) r.reason = "refused";
  }
  return r;
}

std::vector<Row> plan(const PlanInput& in) {
  std::vector<Row> rows;
  SpecCache cache;
  for (const Candidate& c : enumerate(in)) rows.push_back(evaluate(in, c, cache));
  // Layouts the model cannot tell apart (the same step to single precision: on cores the ranks
  // share, 1F1B, GPipe and interleaving the same stages run the same work) rank by the memory
  // they leave free.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.valid() != b.valid()) return a.valid();
    if (!a.valid()) return false;
    const float ta = float(a.p.step_s), tb = float(b.p.step_s);
    return ta != tb ? ta < tb : a.p.device_bytes < b.p.device_bytes;
  });
  return rows;
}

std::string explain(const PlanInput& in, const Row& r) {
  std::string s = describe(r.c) + "\n";
  char line[1024];
  if (!r.valid()) return s + "refused: " + r.reason + "\n";
  const Prediction& p = r.p;
  std::snprintf(line, sizeof line, "memory per rank (stage %d, the largest):\n", p.worst_stage);
  s += line;
  for (int k = 0; k < kNumMemCategories; ++k) {
    std::snprintf(line, sizeof line, "  %-26s %s\n", mem_category_name(MemCategory(k)),
                  format_bytes(p.bytes[size_t(k)]).c_str());
    s += line;
  }
  std::snprintf(line, sizeof line, "  %-26s %s of the device's %s\n", "device total",
                format_bytes(p.device_bytes).c_str(), format_bytes(in.device.memory_bytes).c_str());
  s += line;
  std::snprintf(line, sizeof line, "  %-26s %s of %s\n", "host memory per node",
                format_bytes(p.node_host_bytes).c_str(),
                format_bytes(in.device.host_memory_bytes).c_str());
  s += line;
  s += "  (not counted: the communicators' scratch buffers, which grow to the largest collective "
       "needing a dtype conversion)\n";
  std::snprintf(line, sizeof line,
                "step %.4f s = compute %.4f (recompute %.4f) + tensor-parallel %.4f + "
                "context-parallel %.4f + expert-parallel %.4f + bubble %.4f (checker: %.1f%% "
                "idle, sends %.4f) + exposed data-parallel %.4f (of %.4f) + optimizer %.4f\n",
                p.step_s, p.compute_s, p.recompute_s, p.tp_comm_s, p.cp_comm_s, p.ep_comm_s,
                p.bubble_s, 100.0 * p.bubble_fraction, p.pp_comm_s, p.dp_exposed_s, p.dp_comm_s,
                p.optimizer_s);
  s += line;
  if (p.cores_bound_s > 0) {
    std::snprintf(line, sizeof line,
                  "  (ranks outnumber the cores: the schedule simulated with the ranks sharing "
                  "them takes %.4f s; the node's busy time is %.4f s a core)\n",
                  p.model_step_s, p.cores_bound_s);
    s += line;
  }
  if (const cost::StepFit* f = in.device.gpu ? nullptr : in.device.step_fit(in.cluster.per_node)) {
    std::snprintf(
        line, sizeof line,
        "fitted at %d ranks per node (%s): %.4f s = %.3f x the model's %.4f s + %.0f "
        "collectives x %.1f us + %.0f ZeRO-3 gathers x %.1f us + %.0f messages x %.1f us + "
        "%.0f kernel calls x %.2f us + %.0f tp collectives beside reductions x %.1f us + %.0f "
        "contended tp/cp collectives x %.1f us + %.1f us\n",
        f->ranks_per_node, f->source.c_str(), p.step_s, f->model_scale, p.model_step_s,
        p.collectives, f->per_collective_s * 1e6, p.gathers, f->per_gather_s * 1e6, p.messages,
        f->per_message_s * 1e6, p.kernel_calls, f->per_call_s * 1e6, p.tp_beside_reductions,
        f->per_tp_beside_s * 1e6, p.contended_collectives, f->per_contended_s * 1e6,
        f->per_step_s * 1e6);
    s += line;
  }
  std::snprintf(line, sizeof line, "%.0f tokens/s, MFU %.1f%% (device: %s)\n", p.tokens_per_s,
                100.0 * p.mfu, in.device.name.c_str());
  s += line;
  return s;
}

}  // namespace strata::planner
