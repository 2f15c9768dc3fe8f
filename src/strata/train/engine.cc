#include "strata/train/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "strata/comm/communicator.h"
#include "strata/comm/heartbeat.h"
#include "strata/comm/peer_exchange.h"
#include "strata/core/check.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/ops.h"
#include "strata/optim/lr_schedule.h"
#include "strata/pipeline/partition.h"
#include "strata/train/weight_decay.h"
#include "strata/zero/zero_sync.h"

namespace strata {

namespace {

// ZeRO runs whenever a stage is asked for and a data-parallel communicator is given (even of
// one rank); the model spec is then padded to a multiple of the shard group's size.
bool zero_in_effect(const Config& cfg, const comm::Communicator* dp) {
  return cfg.zero.stage >= 1 && dp != nullptr;
}

int shard_size(const Config& cfg, const comm::Communicator* dp) {
  if (!zero_in_effect(cfg, dp)) return 1;
  const int64_t g = cfg.zero.mics_shard_size;
  if (g < 0 || g == dp->size()) return dp->size();
  STRATA_INPUT_CHECK(g < dp->size(), "zero_optimization.mics_shard_size=", g,
                     " exceeds the data-parallel size ", dp->size(),
                     "; set it to the ranks of one host (a divisor of ", dp->size(), ") or -1");
  STRATA_INPUT_CHECK(dp->size() % g == 0, "zero_optimization.mics_shard_size=", g,
                     " must divide the data-parallel size ", dp->size(),
                     "; set it to a divisor (the ranks of one host) or -1");
  return int(g);
}

ZeroOptions zero_options(const Config& cfg) {
  const ZeroConfig& z = cfg.zero;
  ZeroOptions o;
  o.stage = z.stage;
  o.param_dtype = cfg.param_dtype();
  o.grad_dtype = cfg.fp16.enabled || cfg.bf16.enabled ? cfg.grad_accum_dtype : DType::F32;
  o.wire = cfg.comm_dtype();
  o.overlap = z.overlap_comm;
  o.bucket_elems = z.reduce_bucket_size;
  o.prefetch_elems = z.stage3_prefetch_bucket_size;
  o.persistence_threshold = z.stage3_param_persistence_threshold;
  o.max_live = z.stage3_max_live_parameters;
  o.max_reuse_distance = z.stage3_max_reuse_distance;
  o.recompute_full = recompute_options(cfg).full;
  return o;
}

}  // namespace

// The model states of every rank on this host must fit in its memory: pages are committed only
// when first touched, so a model that does not fit would otherwise be killed by the kernel
// mid-initialisation instead of failing with a message.
void check_fits_in_memory(const Config& cfg, const ModelSpec& spec, int shard) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const size_t ranks = local != nullptr ? size_t(std::max(1, std::atoi(local))) : 1;
  const size_t host = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  const MemoryPrediction m = predict_memory(cfg, spec, shard);
  if (m.model_states * ranks <= host) return;
  STRATA_INPUT_FAIL("the model states need ", format_bytes(m.model_states), " per rank x ", ranks,
                    " rank(s) on this host, more than its ", format_bytes(host),
                    " of memory; use a smaller model, bf16, or more ranks with "
                    "zero_optimization.stage 1-3 to shard the model states");
}

MemoryPrediction predict_memory(const Config& cfg, const ModelSpec& spec, int shard) {
  const ZeroOptions o = zero_options(cfg);
  const int stage = shard >= 1 ? cfg.zero.stage : 0;
  const size_t psi = size_t(spec.numel), N = size_t(std::max(shard, 1));
  const size_t p = dtype_size(o.param_dtype), g = dtype_size(o.grad_dtype);
  const bool sgd = cfg.optimizer.type == "sgd";
  const size_t moments = sgd ? (cfg.optimizer.momentum != 0.0f ? 1 : 0) : 2;
  // fp32 parameters are stepped in place: they are the master copy (at every stage).
  const size_t master = o.param_dtype == DType::F32 ? 0 : 4;
  const size_t k = master + 4 * moments;  // optimizer bytes per element: DeepSpeed's K
  MemoryPrediction m;
  auto at = [&](MemCategory c) -> size_t& { return m.bytes[size_t(c)]; };
  const ZeroBuffers b = stage >= 1 ? zero_buffers(spec, shard, o) : ZeroBuffers{};
  const size_t part = psi / N;
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
      m.formula = (p + g) * psi + k * psi / N;
      break;
    case 2:
      m.formula = p * psi + (g + k) * psi / N;
      break;
    default:
      m.formula = (p + g + k) * psi / N;
      break;
  }
  m.buffers = size_t(b.persistent + b.param_slots + b.grad_slots);
  return m;
}

uint64_t predict_tp_bytes(const Config& cfg, const ModelSpec& spec) {
  const uint64_t t = uint64_t(spec.tp.size);
  if (t == 1) return 0;
  const bool sp = cfg.parallelism.sequence_parallel;
  const ModelConfig& m = cfg.model;
  const uint64_t b = dtype_size(cfg.param_dtype());
  const uint64_t g =
      dtype_size(cfg.fp16.enabled || cfg.bf16.enabled ? cfg.grad_accum_dtype : DType::F32);
  const uint64_t N = uint64_t(cfg.train_micro_batch_size_per_gpu) * uint64_t(m.seq_len);
  const uint64_t C = uint64_t(m.hidden), L = uint64_t(m.layers);
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
  const RecomputeOptions rc = recompute_options(cfg);
  uint64_t R = 0;
  for (uint64_t l = 0; l < L; ++l) R += rc.is_full(int(l)) ? 1 : 0;
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
  return uint64_t(cfg.gradient_accumulation_steps) * micro + ar(t, 1, 4);  // + the norm's
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

namespace {

// The model cut into pipeline chunks: stages × virtual stages of them (one without a pipeline).
pipeline::StagePlan plan_chunks(const ModelSpec& full, const ParallelismConfig& p, int stages) {
  const int v = stages > 1 ? p.virtual_stages : 1;
  if (stages * v == 1) {
    pipeline::StagePlan plan;
    plan.chunks = {{0, int(full.units.size())}};
    return plan;
  }
  return pipeline::partition(full, stages * v, pipeline::parse_partition(p.partition),
                             p.partition_blocks);
}

// This rank's spec: its tensor-parallel slices of the units its pipeline stage holds (all of them
// without a pipeline); with tied embeddings the last stage holds the vocabulary units too.
// `plan` receives the units of every global chunk.
ModelSpec stage_spec(const Config& cfg, int shard, const comm::Communicator* tp,
                     const comm::Communicator* pp, pipeline::StagePlan& plan) {
  ModelSpec full = build_model_spec(cfg.model, shard, tp != nullptr ? tp->size() : 1,
                                    tp != nullptr ? tp->rank() : 0);
  set_weight_decay(cfg.optimizer, full);
  const int stages = pp != nullptr ? pp->size() : 1;
  plan = plan_chunks(full, cfg.parallelism, stages);
  if (stages == 1) return full;
  std::vector<bool> held(full.units.size(), false);
  for (size_t g = 0; g < plan.chunks.size(); ++g) {
    if (pipeline::stage_of(int(g), stages) != pp->rank()) continue;
    for (int u = plan.chunks[g].first; u < plan.chunks[g].second; ++u) held[size_t(u)] = true;
  }
  if (cfg.model.tied_embeddings && pp->rank() == stages - 1) {
    for (int u : full.units_of(UnitKind::Vocab)) held[size_t(u)] = true;
  }
  return hold_units(full, held);
}

}  // namespace

Engine::Engine(const Config& cfg, const data::TokenDataset* dataset, comm::Communicator* dp,
               comm::Communicator* tp, comm::Communicator* pp)
    : cfg_(cfg),
      spec_(stage_spec(cfg, shard_size(cfg, dp), tp, pp, plan_)),
      dp_(dp),
      tp_comm_(tp),
      pp_comm_(pp != nullptr && pp->size() > 1 ? pp : nullptr) {
  if (dp_ != nullptr) dp_rank_ = dp_->rank(), dp_size_ = dp_->size();
  if (pp_comm_ != nullptr) {
    stage_ = pp_comm_->rank(), stages_ = pp_comm_->size();
    STRATA_INPUT_CHECK(!zero_in_effect(cfg, dp) || cfg.zero.stage <= 2,
                       "zero_optimization.stage 3 with parallelism.pipeline=", stages_,
                       " is not supported: stage 3 gathers each unit in a static order computed "
                       "from one forward and one backward pass, and a pipeline schedule "
                       "interleaves the passes of several micro-batches; use stage 1 or 2 (the "
                       "optimizer states and gradients are still sharded) or "
                       "parallelism.pipeline=1");
    pipeline::validate({pipeline::parse_schedule(cfg.parallelism.schedule), stages_,
                        int(cfg.gradient_accumulation_steps), cfg.parallelism.virtual_stages});
  }
  if (tp_comm_ != nullptr && tp_comm_->size() > 1 && spec_.tp.kv_replicated) {
    // The ranks that hold the same key/value heads: tp / kv_heads consecutive ranks.
    const int share = tp_comm_->size() / cfg.model.kv_heads;
    kv_comm_ = tp_comm_->split(tp_comm_->rank() / share, tp_comm_->rank(), "tp-kv");
    kv_comm_->set_timeout(tp_comm_->timeout());
  }
  tp_ = std::make_unique<tp::Group>(tp_comm_, kv_comm_.get(), cfg.parallelism.sequence_parallel);
  replicated_ = replicated_ranges(spec_);
  STRATA_CHECK(cfg_.gradient_accumulation_steps > 0 && cfg_.train_micro_batch_size_per_gpu > 0 &&
                   cfg_.train_batch_size == cfg_.train_micro_batch_size_per_gpu *
                                                cfg_.gradient_accumulation_steps * dp_size_,
               "the batch triangle must be resolved for data-parallel size ", dp_size_,
               " before building the engine");
  const ModelConfig& m = cfg_.model;
  const DType pt = cfg_.param_dtype();
  const DType gt = grad_dtype_ =
      cfg_.fp16.enabled || cfg_.bf16.enabled ? cfg_.grad_accum_dtype : DType::F32;
  if (dataset != nullptr) {
    sampler_ = std::make_unique<data::Sampler>(*dataset, m.seq_len, cfg_.train.seed);
    sampler_->check_vocab(m.vocab);
  }

  const bool zero = zero_in_effect(cfg_, dp_);
  const int stage = zero ? cfg_.zero.stage : 0;
  check_fits_in_memory(cfg_, spec_, zero ? int(spec_.align) : 0);
  if (stage < 3) params_ = Buffer(MemCategory::Params, size_t(spec_.numel) * dtype_size(pt));
  if (stage < 2) grads_ = Buffer(MemCategory::Grads, size_t(spec_.numel) * dtype_size(gt));
  if (zero) {
    // The shard group: the data-parallel group, or with MiCS its consecutive groups of G ranks
    // (one host), replicated across groups.
    const int g = int(spec_.align);
    shard_ = dp_;
    if (g < dp_size_) {
      shard_comm_ = dp_->split(dp_rank_ / g, dp_rank_, "dp-shard");
      replica_comm_ = dp_->split(dp_rank_ % g, dp_rank_, "dp-replica");
      shard_ = shard_comm_.get();
      for (comm::Communicator* c : {shard_comm_.get(), replica_comm_.get()}) {
        c->set_timeout(dp_->timeout());
      }
    }
    // The master and moments hold only the owned chunks; each rank initialises its owned
    // elements (a pure function of seed, name and index), then the units are gathered.
    sync_ = std::make_unique<ZeroSync>(*shard_, replica_comm_.get(), spec_, zero_options(cfg_),
                                       params_.data(), grads_.data());
    const ZeroPartition& part = sync_->partition();
    optimizer_ =
        std::make_unique<Optimizer>(cfg_.optimizer, pt, gt, sync_->optimizer_params(), spec_.numel,
                                    part.owned_ranges(), part.owned_numel(), sync_->packed());
    size_t pi = 0;
    for (const ParamRange& r : optimizer_->ranges()) {
      while (!spec_.params[pi].held ||
             spec_.params[pi].offset + spec_.params[pi].numel() <= r.offset) {
        ++pi;
      }
      const ParamSpec& p = spec_.params[pi];
      init_param_slice(Tensor(optimizer_->master_of(r), DType::F32, {r.numel}), p, cfg_.train.seed,
                       r.offset - p.offset);
    }
    optimizer_->publish();
    sync_->after_step();
  } else {
    std::vector<ParamRange> ranges;
    std::vector<const ParamSpec*> of_range;
    for (const ParamSpec& p : spec_.params) {
      if (!p.held) continue;
      ranges.push_back({p.offset, p.numel(), p.decay});
      of_range.push_back(&p);
    }
    optimizer_ = std::make_unique<Optimizer>(cfg_.optimizer, pt, gt, params_.data(), spec_.numel,
                                             std::move(ranges));
    for (const ParamRange& r : optimizer_->ranges()) {
      const ParamSpec& p = *of_range[size_t(&r - optimizer_->ranges().data())];
      init_param_slice(Tensor(optimizer_->master_of(r), DType::F32, {p.numel()}), p,
                       cfg_.train.seed, 0);
    }
    optimizer_->publish();
  }
  if (cfg_.fp16.enabled) scaler_ = LossScaler(cfg_.fp16);

  build_pipeline();
  const size_t local_samples =
      size_t(cfg_.train_micro_batch_size_per_gpu * cfg_.gradient_accumulation_steps);
  const size_t batch_bytes = local_samples * size_t(m.seq_len) * sizeof(int32_t);
  inputs_ = Buffer::host(MemCategory::Activations, batch_bytes);  // the sampler writes them
  targets_ = Buffer::host(MemCategory::Activations, batch_bytes);
  flops_per_token_ = train_flops_per_token(spec_);
  if (dp_size_ > 1 && !sync_) {  // stage 0: the gradients are summed over dp
    ZeroOptions o = zero_options(cfg_);
    o.stage = 0;
    sync_ = std::make_unique<ZeroSync>(*dp_, nullptr, spec_, o, params_.data(), grads_.data());
  }
}

void Engine::maybe_kill(KillPhase phase, int64_t step) {
  // Hang stops where the reduction would start: the process lives on (its heartbeat too), so
  // only the other ranks' watchdog can tell.
  const bool hang = kill_phase_ == KillPhase::Hang && phase == KillPhase::Reduce;
  if ((phase != kill_phase_ && !hang) || step != kill_step_) return;
  static constexpr const char* kNames[] = {"none",      "forward", "backward", "reduce",
                                           "optimizer", "save",    "hang"};
  comm::heartbeat_fault(kNames[int(kill_phase_)]);
  std::fflush(stdout);
  std::fflush(stderr);
  if (hang) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  ::kill(::getpid(), SIGKILL);
}

Engine::~Engine() {
  // An error mid-step can leave buckets queued on the communication thread, which would go on
  // writing into the gradients: leave that memory to it; the job is being aborted.
  if (sync_ && sync_->in_flight()) {
    grads_.leak();
    params_.leak();
    (void)sync_.release();  // its buffers too
  }
}

void Engine::zero_grads() {
  if (grads_.data() != nullptr) ops::fill_zero(Tensor(grads_.data(), grad_dtype_, {spec_.numel}));
  if (sync_) sync_->zero_grads();
}

void Engine::gather_params(void* out) {
  if (sync_) return sync_->gather_all_params(out);
  const DType pt = cfg_.param_dtype();
  ops::copy(Tensor(out, pt, {spec_.numel}), Tensor(params_.data(), pt, {spec_.numel}));
}

uint64_t Engine::wire_bytes() const {
  uint64_t b = dp_ != nullptr ? dp_->wire_bytes() : 0;
  for (const auto* c : {&shard_comm_, &replica_comm_}) {
    if (*c) b += (*c)->wire_bytes();
  }
  return b;
}

// The stage's model chunks and its actions. Without a pipeline: one chunk of every unit and
// F0 B0 F1 B1 …; with one, the units of global chunks g ≡ stage (mod stages), the schedule's
// actions for this stage, and the buffers its transfers use (bounded and allocated here).
void Engine::build_pipeline() {
  const ParallelismConfig& p = cfg_.parallelism;
  const int v = stages_ > 1 ? p.virtual_stages : 1;
  const int gas = int(cfg_.gradient_accumulation_steps);
  pipeline::ScheduleSpec sched;
  sched.kind =
      stages_ > 1 ? pipeline::parse_schedule(p.schedule) : pipeline::ScheduleKind::OneFOneB;
  sched.stages = stages_, sched.micro = gas, sched.virtual_stages = v;
  schedule_ = pipeline::generate(sched)[size_t(stage_)];
  // Activation slots per chunk: the most micro-batches whose forward ran and whose weight
  // gradients did not, in this stage's list.
  // Input slots: the most whose forward ran and whose input gradient did not.
  std::vector<int> in_flight(size_t(v), 0), slots(size_t(v), 1);
  std::vector<int> awaiting(size_t(v), 0), input_slots(size_t(v), 1);
  bool defer = false;
  for (const pipeline::Action& a : schedule_) {
    const size_t k = size_t(a.chunk);
    using pipeline::Op;
    if (a.op == Op::Forward) {
      slots[k] = std::max(slots[k], ++in_flight[k]);
      input_slots[k] = std::max(input_slots[k], ++awaiting[k]);
    }
    if (a.op == Op::Backward || a.op == Op::BackwardInput) --awaiting[k];
    if (a.op == Op::Backward || a.op == Op::BackwardWeight) --in_flight[k];
    if (a.op == Op::BackwardInput) defer = true;
  }
  const int B = int(cfg_.train_micro_batch_size_per_gpu);
  const DType pt = cfg_.param_dtype();
  for (int k = 0; k < v; ++k) {
    const int g = pipeline::global_chunk(k, stage_, stages_);
    ChunkOptions o;
    o.unit_begin = plan_.chunks[size_t(g)].first, o.unit_end = plan_.chunks[size_t(g)].second;
    o.slots = slots[size_t(k)];
    o.input_slots = input_slots[size_t(k)];
    o.defer_weight = defer;
    o.recompute = recompute_options(cfg_);
    chunk_global_.push_back(g);
    chunks_.push_back(make_transformer(spec_, pt, grad_dtype_, params_.data(), grads_.data(), B,
                                       cfg_.model.seq_len, o, tp_.get()));
  }
  // The executor keeps one receive buffer and one input gradient per chunk: a receive must
  // come right before the compute that consumes it, a send right after the compute that made it
  // (as every generator places them; the checker alone would accept other orders).
  for (size_t i = 0; i < schedule_.size(); ++i) {
    using pipeline::Op;
    const pipeline::Action& a = schedule_[i];
    const bool recv = a.op == Op::RecvActivation || a.op == Op::RecvGradient;
    const bool send = a.op == Op::SendActivation || a.op == Op::SendGradient;
    if (!recv && !send) continue;
    const bool act = a.op == Op::RecvActivation || a.op == Op::SendActivation;
    const size_t j = recv ? i + 1 : i - 1;
    const bool ok = (recv || i > 0) && j < schedule_.size() && schedule_[j].micro == a.micro &&
                    schedule_[j].chunk == a.chunk &&
                    (act ? schedule_[j].op == Op::Forward
                         : schedule_[j].op == Op::Backward || schedule_[j].op == Op::BackwardInput);
    STRATA_CHECK(ok, "pipeline stage ", stage_, ": ", pipeline::action_name(a),
                 " must be adjacent to the compute that ", recv ? "consumes" : "produces", " it");
  }
  last_dx_.assign(chunks_.size(), Tensor());
  trace_.reserve(schedule_.size());
  if (stages_ == 1) return;
  // Hidden states between chunks: (rows, C), rows = B·T or B·T/tp under sequence parallelism.
  const int64_t rows =
      int64_t(B) * cfg_.model.seq_len / (tp_->sequence_parallel() ? tp_->size() : 1);
  const size_t msg = size_t(rows) * size_t(cfg_.model.hidden) * dtype_size(pt);
  // Sends a peer has not yet received: a chunk's activation sends are received before its
  // micro-batch's gradient comes back (at most its slots), its gradient sends before the
  // upstream chunk frees that micro-batch (at most as many).
  int ring = 2;
  for (int n : slots) ring += 2 * n;
  peers_ = std::make_unique<comm::PeerExchange>(
      *pp_comm_, std::chrono::seconds(cfg_.parallelism.timeout_s), ring, msg);
  pipe_ = Buffer(MemCategory::CommBuffers, 2 * size_t(v) * msg);
  char* at = static_cast<char*>(pipe_.data());
  for (int k = 0; k < v; ++k) {
    recv_act_.push_back(at), at += msg;
    recv_grad_.push_back(at), at += msg;
  }
  if (cfg_.model.tied_embeddings) {
    // The first and the last stage hold the vocabulary units; their gradients are summed
    // between them (Megatron's embedding group), so both copies stay equal.
    const bool ends = stage_ == 0 || stage_ == stages_ - 1;
    embed_comm_ = pp_comm_->split(ends ? 0 : 1, stage_, "pp-embedding");
    embed_comm_->set_timeout(pp_comm_->timeout());
    if (ends) {
      for (int u : spec_.units_of(UnitKind::Vocab)) vocab_numel_ += spec_.units[size_t(u)].numel;
      // Counted half on each stage in the gradient norm.
      replicated_.push_back({0, vocab_numel_, 2});
    }
  }
}

// Runs this stage's actions for one step (pipeline/schedule.h's semantics: sends never block,
// a receive waits for its message).
void Engine::run_schedule(const int32_t* inputs, const int32_t* targets, float dloss,
                          double& loss_sum, double& forward_s, double& backward_s) {
  using clock = std::chrono::steady_clock;
  using pipeline::Op;
  const int64_t mb = cfg_.train_micro_batch_size_per_gpu, T = cfg_.model.seq_len;
  const int64_t gas = cfg_.gradient_accumulation_steps;
  const int last = stages_ * (stages_ > 1 ? cfg_.parallelism.virtual_stages : 1) - 1;
  const DType pt = cfg_.param_dtype();
  // Messages are tagged by (micro-batch, receiving global chunk, activation | gradient).
  auto tag = [&](int micro, int g, int kind) { return (micro * (last + 1) + g) * 2 + kind; };
  // With tensor parallelism and no sequence parallelism every tp rank holds the same hidden
  // states: each sends and receives only its block of rows, re-gathered over tp on arrival.
  const int tps = tp_->size();
  const bool split = tps > 1 && !tp_->sequence_parallel() &&
                     int64_t(cfg_.train_micro_batch_size_per_gpu) * T % tps == 0;
  auto tp_part = [&](const Tensor& t) {
    if (!split) return t;
    const int64_t rows = t.dim(0) / tps;
    return t.slice0(tp_->rank() * rows, (tp_->rank() + 1) * rows);
  };
  trace_.clear();
  for (const pipeline::Action& a : schedule_) {
    if (a.op == pipeline::Op::Forward) maybe_kill(KillPhase::Forward, step_ + 1);
    if (a.op == pipeline::Op::Backward || a.op == pipeline::Op::BackwardInput) {
      maybe_kill(KillPhase::Backward, step_ + 1);
    }
    if (step_ + 1 == fault_step_ && size_t(&a - schedule_.data()) == fault_action_) {
      STRATA_RUNTIME_FAIL("injected fault at step ", fault_step_, ", action ", fault_action_, " (",
                          pipeline::action_name(a), ") of pipeline stage ", stage_);
    }
    const int k = a.chunk, g = chunk_global_[size_t(k)];
    Transformer& c = *chunks_[size_t(k)];
    const int64_t at = a.micro * mb * T;
    const auto t0 = clock::now();
    switch (a.op) {
      case Op::RecvActivation:
      case Op::RecvGradient: {
        const bool act = a.op == Op::RecvActivation;
        const Tensor in = c.hidden_view(act ? recv_act_[size_t(k)] : recv_grad_[size_t(k)]);
        const Tensor part = tp_part(in);
        peers_->recv(part.data, size_t(part.numel()), pt, a.peer, tag(a.micro, g, act ? 0 : 1),
                     act ? "an activation" : "a gradient");
        if (part.data != in.data || part.numel() != in.numel()) tp_->all_gather(in, part);
        break;
      }
      case Op::SendActivation:
      case Op::SendGradient: {
        const bool act = a.op == Op::SendActivation;
        const Tensor out = tp_part(act ? c.output(a.micro) : last_dx_[size_t(k)]);
        peers_->send(out.data, size_t(out.numel()), pt, a.peer,
                     tag(a.micro, act ? g + 1 : g - 1, act ? 0 : 1),
                     act ? "an activation" : "a gradient");
        break;
      }
      case Op::Forward:
        loss_sum += c.forward(a.micro, g == 0 ? inputs + at : nullptr,
                              g == 0 ? Tensor() : c.hidden_view(recv_act_[size_t(k)]),
                              g == last ? targets + at : nullptr, dloss, true, sync_.get());
        forward_s += std::chrono::duration<double>(clock::now() - t0).count();
        break;
      case Op::Backward:
      case Op::BackwardInput:
      case Op::BackwardWeight:
        // Gradients of the step's last micro-batch are final: ZeRO may reduce them.
        if (sync_) sync_->begin_micro(a.micro == gas - 1);
        if (a.op == Op::BackwardWeight) {
          c.backward_weight(a.micro, sync_.get());
        } else {
          last_dx_[size_t(k)] = c.backward_input(
              a.micro, g == last ? Tensor() : c.hidden_view(recv_grad_[size_t(k)]), sync_.get());
        }
        backward_s += std::chrono::duration<double>(clock::now() - t0).count();
        break;
    }
    if (tracing_) {
      trace_.push_back({a, std::chrono::duration<double>(t0.time_since_epoch()).count(),
                        std::chrono::duration<double>(clock::now().time_since_epoch()).count()});
    }
  }
  if (peers_) peers_->wait_sends();
}

// Tied embeddings under a pipeline: the vocabulary units' reduced gradients summed between the
// first and the last stage (at ZeRO stages 0-1 the flat gradients, whose owned chunks are the
// reduced ones; at stage 2 the partition, where the vocabulary units come first too).
void Engine::sync_tied_embeddings() {
  if (vocab_numel_ == 0) return;
  void* g = sync_ ? const_cast<void*>(sync_->optimizer_grads()) : grads_.data();
  const int64_t n =
      cfg_.zero.stage >= 2 && shard_ != nullptr ? vocab_numel_ / spec_.align : vocab_numel_;
  embed_comm_->all_reduce(g, size_t(n), grad_dtype_, grad_dtype_);
}

uint64_t Engine::tp_wire_bytes() const {
  return (tp_comm_ != nullptr ? tp_comm_->wire_bytes() : 0) +
         (kv_comm_ ? kv_comm_->wire_bytes() : 0);
}

double Engine::forward_backward(const int32_t* inputs, const int32_t* targets) {
  STRATA_CHECK(params_.data() != nullptr && grads_.data() != nullptr,
               "forward_backward needs whole parameters and gradients; ZeRO stage ",
               cfg_.zero.stage, " partitions them (use train_batch)");
  const int64_t tokens = cfg_.train_micro_batch_size_per_gpu * cfg_.model.seq_len;
  STRATA_CHECK(chunks_.size() == 1 && pp_comm_ == nullptr,
               "forward_backward runs the whole model as one chunk: not under a pipeline");
  double loss = model().forward(inputs, targets, scaler_.scale() / float(tokens), true);
  model().backward();
  return loss / double(tokens);
}

StepMetrics Engine::train_batch() {
  STRATA_CHECK(sampler_ != nullptr, "this engine was built without a dataset");
  const int64_t gbs = cfg_.train_batch_size;
  int32_t* in = inputs_.as<int32_t>();
  int32_t* tg = targets_.as<int32_t>();
  const int64_t first = data::Sampler::first_sample_of(consumed_samples_, dp_rank_, dp_size_, gbs);
  sampler_->get_batch(first, gbs / dp_size_, in, tg);
  return train_batch_on(in, tg);
}

StepMetrics Engine::train_batch_on(const int32_t* inputs, const int32_t* targets) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  MemoryTracker::instance().reset_peaks();
  const int64_t gbs = cfg_.train_batch_size;
  const int64_t T = cfg_.model.seq_len;
  // Every target of a sampled window counts, so the global batch holds gbs·T loss terms; each
  // micro-batch's dlogits carry 1/(gbs·T), making the accumulated gradient the global mean's.
  const float dloss = scaler_.scale() / float(gbs * T);
  double loss_sum = 0.0, forward_s = 0.0, backward_s = 0.0;
  const uint64_t bytes0 = wire_bytes(), tp_bytes0 = tp_wire_bytes();
  const uint64_t cross0 = replica_comm_ ? replica_comm_->wire_bytes() : 0;
  if (sync_) sync_->begin_step();
  for (auto& c : chunks_) c->take_tp_seconds(), c->take_recompute_seconds();
  run_schedule(inputs, targets, dloss, loss_sum, forward_s, backward_s);
  double tp_comm_s = 0.0, recompute_s = 0.0;
  const bool profile = cfg_.activation_checkpointing.profile;
  if (profile) recompute_block_s_.assign(size_t(cfg_.model.layers), 0.0);  // sized once
  for (auto& c : chunks_) {
    tp_comm_s += c->take_tp_seconds();
    recompute_s += c->take_recompute_seconds(profile ? &recompute_block_s_ : nullptr);
  }
  double comm_exposed_s = 0.0, gather_exposed_s = 0.0;
  maybe_kill(KillPhase::Reduce, step_ + 1);
  if (sync_) {
    sync_->finish();
    comm_exposed_s = sync_->reduce_wait_seconds();
    gather_exposed_s = sync_->gather_wait_seconds();
  }
  sync_tied_embeddings();
  if (pp_comm_ != nullptr) {
    float loss = float(loss_sum);  // only the last stage computes the loss
    pp_comm_->all_reduce(&loss, 1, DType::F32, DType::F32);
    loss_sum = loss;
  }
  if (dp_ != nullptr && dp_size_ > 1) {
    float loss = float(loss_sum);  // the logged loss: this rank's sum, summed over the group
    dp_->all_reduce(&loss, 1, DType::F32, DType::F32);
    loss_sum = loss;
  }
  auto o0 = clock::now();
  consumed_samples_ += gbs;
  ++step_;

  StepMetrics s;
  s.step = step_;
  s.loss = loss_sum / double(gbs * T);
  s.loss_scale = scaler_.scale();
  // Under ZeRO each rank holds the reduced gradients of its owned chunks only: Σ g² over them,
  // summed over the shard group.
  double sumsq = sync_ ? sync_->sum_squares(replicated_)
                       : ops::sum_squares(Tensor(grads_.data(), grad_dtype_, {spec_.numel}));
  if (tp_->size() > 1 || pp_comm_ != nullptr) {
    // Each tensor-parallel rank holds its slices (replicated elements weighted 1/replicas), each
    // pipeline stage its units (a tied vocabulary on two stages counted half on each).
    if (!sync_) {
      for (const ReplicatedRange& r : replicated_) {
        sumsq -= (1.0 - 1.0 / r.replicas) *
                 ops::sum_squares(Tensor(
                     static_cast<char*>(grads_.data()) + size_t(r.offset) * dtype_size(grad_dtype_),
                     grad_dtype_, {r.numel}));
      }
    }
    float total = float(sumsq);
    if (tp_->size() > 1) tp_comm_->all_reduce(&total, 1, DType::F32, DType::F32);
    if (pp_comm_ != nullptr) pp_comm_->all_reduce(&total, 1, DType::F32, DType::F32);
    sumsq = total;
  }
  s.grad_norm = std::sqrt(sumsq) / scaler_.scale();
  const bool overflow = !std::isfinite(sumsq);
  const bool check = !cfg_.bf16.enabled || cfg_.bf16.check_grad_overflow;
  s.skipped = overflow && check;
  s.lr = lr_of_step(cfg_.scheduler, cfg_.optimizer.lr, optimizer_->steps_taken());
  if (!s.skipped) {
    float clip = 1.0f;
    if (cfg_.gradient_clipping > 0.0f && s.grad_norm > cfg_.gradient_clipping) {
      clip = float(cfg_.gradient_clipping / (s.grad_norm + 1e-6));  // torch's clip_grad_norm_
    }
    maybe_kill(KillPhase::Optimizer, step_);
    optimizer_->step(sync_ ? sync_->optimizer_grads() : grads_.data(), s.lr,
                     clip / scaler_.scale());
  }
  // Every rank takes the same skip decision (the norm is global); gather regardless.
  if (sync_) sync_->after_step();
  if (cfg_.fp16.enabled) scaler_.update(overflow);
  zero_grads();

  s.tokens = gbs * T;
  const auto t1 = clock::now();
  s.seconds = std::chrono::duration<double>(t1 - t0).count();
  s.forward_s = forward_s;
  s.backward_s = backward_s;
  s.optimizer_s = std::chrono::duration<double>(t1 - o0).count();
  s.comm_exposed_s = comm_exposed_s;
  s.tp_comm_s = tp_comm_s;
  s.recompute_s = recompute_s;
  s.recompute_block_s = recompute_block_s_;
  s.tp_bytes = tp_wire_bytes() - tp_bytes0;
  s.gather_exposed_s = gather_exposed_s;
  s.comm_bytes = wire_bytes() - bytes0;
  s.cross_group_bytes = (replica_comm_ ? replica_comm_->wire_bytes() : 0) - cross0;
  s.tokens_per_s = double(s.tokens) / s.seconds;
  s.flops = flops_per_token_ * double(s.tokens);
  for (int c = 0; c < kNumMemCategories; ++c) {
    s.peak_bytes[size_t(c)] = MemoryTracker::instance().peak(MemCategory(c));
  }
  return s;
}

}  // namespace strata
