#include "strata/train/engine.h"

#include <algorithm>
#include <chrono>

#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/config/weight_decay.h"
#include "strata/core/check.h"
#include "strata/cost/predict.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/ops.h"
#include "strata/optim/lr_schedule.h"
#include "strata/pipeline/partition.h"
#include "strata/zero/zero_sync.h"

namespace strata {

namespace {

bool zero_in_effect(const Config& cfg, const comm::Communicator* dp) {
  return zero_in_effect(cfg, dp != nullptr);
}

int shard_size(const Config& cfg, const comm::Communicator* dp) {
  return shard_group_size(cfg, dp != nullptr ? dp->size() : 1, dp != nullptr);
}

// This rank's place among the ranks of its stage the experts are placed over: its data ×
// context-parallel rank, or with whole experts its rank among the stage's tp × dp × cp ranks in
// (dp, tp) order (Communicator::product).
int expert_group_rank(const Config& cfg, const comm::Communicator* dp,
                      const comm::Communicator* tp) {
  const int d = dp != nullptr ? dp->rank() : 0;
  if (!cfg.parallelism.whole_experts() || cfg.model.moe.experts == 0 || tp == nullptr) return d;
  return d * tp->size() + tp->rank();
}

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

// dp: the data × context-parallel group, whose consecutive ranks form the expert-parallel
// groups (Engine::ep_comm_); with whole experts, those of the stage's ranks in (dp, tp) order.
ModelSpec stage_spec(const Config& cfg, int shard, const comm::Communicator* dp,
                     const comm::Communicator* tp, const comm::Communicator* pp,
                     pipeline::StagePlan& plan) {
  check_expert_grid(cfg, dp != nullptr ? dp->size() : 1);
  const int ep_rank = expert_group_rank(cfg, dp, tp) % cfg.parallelism.expert;
  return stage_model_spec(cfg, shard, tp != nullptr ? tp->size() : 1,
                          tp != nullptr ? tp->rank() : 0, pp != nullptr ? pp->size() : 1,
                          pp != nullptr ? pp->rank() : 0, plan, ep_rank);
}

// ZeRO's options; at stage 3 with the gather order of this stage's whole step (every action of
// its schedule, for every micro-batch and chunk) and of an evaluation, recorded from the chunks'
// own passes run dry: a pure function of (model, layout, schedule), the same on every rank of a
// shard group.
ZeroOptions zero_options_of(const Config& cfg, const ModelSpec& spec,
                            const pipeline::StagePlan& plan, int stage, int stages) {
  ZeroOptions o = zero_options(cfg);
  if (o.stage != 3) return o;
  const pipeline::ExecutorOptions eo = executor_options(cfg, stage, stages);
  GatherRecorder step, eval;
  pipeline::dry_run_stage(eo, plan, spec, step, true);
  pipeline::dry_run_stage(eo, plan, spec, eval, false);
  o.step_order = step.take(), o.eval_order = eval.take();
  return o;
}

}  // namespace

pipeline::ExecutorOptions executor_options(const Config& cfg, int stage, int stages) {
  const ParallelismConfig& p = cfg.parallelism;
  pipeline::ExecutorOptions o;
  o.schedule = stages > 1 ? pipeline::parse_schedule(p.schedule) : pipeline::ScheduleKind::OneFOneB;
  o.stages = stages, o.stage = stage;
  o.virtual_stages = stages > 1 ? p.virtual_stages : 1;
  o.micro_batches = int(cfg.gradient_accumulation_steps);
  o.micro_batch = int(cfg.train_micro_batch_size_per_gpu);
  o.seq_len = cfg.model.seq_len / std::max(1, p.context), o.hidden = cfg.model.hidden;
  o.context.size = std::max(1, p.context);
  o.context.impl =
      p.context_impl == "ring" ? ContextOptions::Impl::Ring : ContextOptions::Impl::Ulysses;
  o.param_dtype = cfg.param_dtype();
  o.grad_dtype = cfg.grad_dtype();
  o.recompute = recompute_options(cfg);
  o.timeout_s = p.timeout_s;
  o.tied_embeddings = cfg.model.tied_embeddings;
  return o;
}

ModelSpec stage_model_spec(const Config& cfg, int shard, int tp, int tp_rank, int stages, int stage,
                           pipeline::StagePlan& plan, int ep_rank) {
  const ParallelismConfig& p = cfg.parallelism;
  const bool moe = cfg.model.moe.experts > 0, whole = moe && p.whole_experts() && tp > 1;
  const int ep = moe ? p.expert : 1;
  // ZeRO shards whole experts over the expert-data-parallel group, tp × dp × cp / ep ranks.
  const int64_t expert_align = whole && cfg.zero.stage >= 1 ? int64_t(tp) * shard / ep : 1;
  ModelSpec full =
      build_model_spec(cfg.model, shard, tp, tp_rank, ep, ep_rank, whole, expert_align);
  full.ep.all_gather = full.ep.size > 1 && cfg.parallelism.expert_dispatch == "all_gather";
  full.ep.overlap = full.ep.size > 1 && cfg.parallelism.expert_overlap;
  set_weight_decay(cfg.optimizer, full);
  plan = plan_chunks(full, cfg.parallelism, stages);
  if (stages == 1) return full;
  std::vector<bool> held(full.units.size(), false);
  for (size_t g = 0; g < plan.chunks.size(); ++g) {
    if (pipeline::stage_of(int(g), stages) != stage) continue;
    for (int u = plan.chunks[g].first; u < plan.chunks[g].second; ++u) held[size_t(u)] = true;
  }
  if (cfg.model.tied_embeddings && stage == stages - 1) {
    for (int u : full.units_of(UnitKind::Vocab)) held[size_t(u)] = true;
  }
  return hold_units(full, held);
}

bool zero_in_effect(const Config& cfg, bool dp_group) {
  return cfg.zero.stage >= 1 && dp_group;
}

int shard_group_size(const Config& cfg, int dp, bool dp_group) {
  if (!zero_in_effect(cfg, dp_group)) return 1;
  const int64_t g = cfg.zero.mics_shard_size;
  if (g < 0 || g == dp) return dp;
  STRATA_INPUT_CHECK(g < dp, "zero_optimization.mics_shard_size=", g,
                     " exceeds the data-parallel size ", dp,
                     "; set it to the ranks of one host (a divisor of ", dp, ") or -1");
  STRATA_INPUT_CHECK(dp % g == 0, "zero_optimization.mics_shard_size=", g,
                     " must divide the data-parallel size ", dp,
                     "; set it to a divisor (the ranks of one host) or -1");
  return int(g);
}

void check_pipeline_layout(const Config& cfg, int stages) {
  if (stages <= 1) return;
  pipeline::validate({pipeline::parse_schedule(cfg.parallelism.schedule), stages,
                      int(cfg.gradient_accumulation_steps), cfg.parallelism.virtual_stages});
}

Engine::Engine(const Config& cfg, const data::TokenDataset* dataset, comm::Communicator* dp,
               comm::Communicator* tp, comm::Communicator* pp, comm::Communicator* cp)
    : cfg_(cfg),
      spec_(stage_spec(cfg, shard_size(cfg, dp), dp, tp, pp, plan_)),
      dp_(dp),
      tp_comm_(tp),
      pp_comm_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      clipper_({cfg.gradient_clipping, !cfg.bf16.enabled || cfg.bf16.check_grad_overflow}, tp, pp) {
  if (dp_ != nullptr) dp_rank_ = dp_->rank(), dp_size_ = dp_->size();
  if (cp != nullptr && cp->size() > 1) cp_comm_ = cp, cp_rank_ = cp->rank(), cp_size_ = cp->size();
  STRATA_CHECK(cp_size_ == std::max(1, cfg.parallelism.context),
               "parallelism.context=", cfg.parallelism.context, " needs a context-parallel group ",
               "of that size; got ", cp_size_);
  STRATA_CHECK(dp_size_ % cp_size_ == 0 && dp_rank_ % cp_size_ == cp_rank_,
               "under context parallelism the engine's data-parallel group spans dp x cp, ordered "
               "by dp then cp (ProcessGroups::dp_cp)");
  data_rank_ = dp_rank_ / cp_size_, data_size_ = dp_size_ / cp_size_;
  if (pp_comm_ != nullptr) {
    stage_ = pp_comm_->rank(), stages_ = pp_comm_->size();
    check_pipeline_layout(cfg, stages_);
  }
  if (tp_comm_ != nullptr && tp_comm_->size() > 1 && spec_.tp.kv_replicated) {
    // The ranks that hold the same key/value heads: tp / kv_heads consecutive ranks.
    const int share = tp_comm_->size() / cfg.model.kv_heads;
    kv_comm_ = tp_comm_->split(tp_comm_->rank() / share, tp_comm_->rank(), "tp-kv");
    kv_comm_->set_timeout(tp_comm_->timeout());
  }
  tp_ = std::make_unique<tp::Group>(tp_comm_, kv_comm_.get(), cfg.parallelism.sequence_parallel);
  if (spec_.ep.size > 1 || spec_.ep.whole) {
    // Expert parallelism: groups of ep consecutive ranks of the data × context-parallel group
    // (with whole experts, of the stage's tp × dp × cp ranks) hold the experts between them (the
    // group's rank is the spec's expert-parallel rank); the ranks with the same place in their
    // groups hold the same experts and sum their gradients.
    STRATA_CHECK(dp_ != nullptr, "expert parallelism needs the data-parallel group");
    const int ep = spec_.ep.size;
    comm::Communicator* over = dp_;
    if (spec_.ep.whole) {
      stage_comm_ = dp_->product(*tp_comm_, "stage");
      stage_comm_->set_timeout(dp_->timeout());
      over = stage_comm_.get();
    }
    const int r = over->rank();
    if (ep > 1) ep_comm_ = over->split(r / ep, r, "ep");
    edp_comm_ = over->split(r % ep, r, "edp");
    for (comm::Communicator* c : {ep_comm_.get(), edp_comm_.get()}) {
      if (c != nullptr) c->set_timeout(dp_->timeout());
    }
  }
  replicated_ = replicated_ranges(spec_);
  STRATA_CHECK(cfg_.gradient_accumulation_steps > 0 && cfg_.train_micro_batch_size_per_gpu > 0 &&
                   cfg_.train_batch_size == cfg_.train_micro_batch_size_per_gpu *
                                                cfg_.gradient_accumulation_steps * data_size_,
               "the batch triangle must be resolved for data-parallel size ", data_size_,
               " before building the engine");
  const ModelConfig& m = cfg_.model;
  const DType pt = cfg_.param_dtype();
  const DType gt = grad_dtype_ = cfg_.grad_dtype();
  if (dataset != nullptr) {
    sampler_ = std::make_unique<data::Sampler>(*dataset, m.seq_len, cfg_.train.seed,
                                               sampler_options(cfg_.data, *dataset));
    sampler_->check_vocab(m.vocab);
  }

  const bool zero = zero_in_effect(cfg_, dp_);
  const int stage = zero ? cfg_.zero.stage : 0;
  cost::check_fits_in_memory(cost::layout_of(cfg_), spec_, zero ? int(spec_.align) : 0);
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
    sync_ = std::make_unique<ZeroSync>(*shard_, replica_comm_.get(), spec_,
                                       zero_options_of(cfg_, spec_, plan_, stage_, stages_),
                                       params_.data(), grads_.data(), edp_comm_.get());
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

  pipeline::ExecutorOptions eo = executor_options(cfg_, stage_, stages_);
  eo.context.rank = cp_rank_, eo.context.comm = cp_comm_;
  eo.experts = ep_comm_.get();
  pipe_ = std::make_unique<pipeline::Executor>(eo, plan_, spec_, params_.data(), grads_.data(),
                                               *tp_, pp_comm_, faults_);
  if (m.moe.experts > 0 && m.moe.router == "sigmoid") {
    expert_bias_.assign(size_t(m.layers) * size_t(m.moe.experts), 0.0f);
    for (auto& c : pipe_->chunks()) c->set_expert_bias(expert_bias_.data());
  }
  // A tied vocabulary on two stages is counted half on each in the gradient norm.
  if (pipe_->tied_numel() > 0) replicated_.push_back({0, pipe_->tied_numel(), 2});
  const size_t local_samples =
      size_t(cfg_.train_micro_batch_size_per_gpu * cfg_.gradient_accumulation_steps);
  const size_t batch_bytes = local_samples * size_t(m.seq_len) * sizeof(int32_t);
  inputs_ = Buffer::host(MemCategory::Activations, batch_bytes);  // the sampler writes them
  targets_ = Buffer::host(MemCategory::Activations, batch_bytes);
  if (cfg_.data.document_mask) doc_begin_ = Buffer::host(MemCategory::Activations, batch_bytes);
  if (cp_comm_ != nullptr) {  // this rank's rows of them
    context_pos_ = eo.context.positions(m.seq_len);
    context_inputs_ = Buffer::host(MemCategory::Activations, batch_bytes / size_t(cp_size_));
    context_targets_ = Buffer::host(MemCategory::Activations, batch_bytes / size_t(cp_size_));
  }
  flops_per_token_ = train_flops_per_token(spec_);
  // The reductions that overlap backward run beside the compute thread's blocking tensor- and
  // context-parallel collectives: poll them rather than spin (Communicator::set_polled_background).
  const bool beside =
      (tp_comm_ != nullptr && tp_comm_->size() > 1) || cp_comm_ != nullptr || ep_comm_ != nullptr;
  for (comm::Communicator* c : {dp_, shard_comm_.get(), replica_comm_.get(), edp_comm_.get()}) {
    if (c != nullptr) c->set_polled_background(beside);
  }
  if ((dp_size_ > 1 || edp_comm_) && !sync_) {  // stage 0: the gradients are summed over dp
    ZeroOptions o = zero_options(cfg_);
    o.stage = 0;
    sync_ = std::make_unique<ZeroSync>(*dp_, nullptr, spec_, o, params_.data(), grads_.data(),
                                       edp_comm_.get());
  }
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
  for (const auto* c : {&shard_comm_, &replica_comm_, &edp_comm_}) {
    if (*c) b += (*c)->wire_bytes();
  }
  return b;
}

// Tied embeddings under a pipeline: the vocabulary units' reduced gradients summed between the
// first and the last stage (at ZeRO stages 0-1 the flat gradients, whose owned chunks are the
// reduced ones; at stage 2 the partition, where the vocabulary units come first too).
void Engine::sum_tied_embeddings() {
  const int64_t n = pipe_->tied_numel();
  if (n == 0) return;
  void* g = sync_ ? const_cast<void*>(sync_->optimizer_grads()) : grads_.data();
  pipe_->sum_tied_grads(g, cfg_.zero.stage >= 2 && shard_ != nullptr ? n / spec_.align : n);
}

// A sum of this rank's over the pipeline, then over data parallelism (in fp32, where reduced).
double Engine::sum_over_pp_dp(double local) {
  double sum = local;
  for (comm::Communicator* c : {pp_comm_, dp_size_ > 1 ? dp_ : nullptr}) {
    if (c == nullptr) continue;
    float x = float(sum);
    c->all_reduce(&x, 1, DType::F32, DType::F32);
    sum = x;
  }
  return sum;
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
  STRATA_CHECK(pipe_->chunks().size() == 1 && pp_comm_ == nullptr && cp_comm_ == nullptr,
               "forward_backward runs the whole model as one chunk on whole sequences: not under a "
               "pipeline or context parallelism");
  double loss = model().forward(inputs, targets, scaler_.scale() / float(tokens), true);
  model().backward();
  return loss / double(tokens);
}

StepMetrics Engine::train_batch() {
  STRATA_CHECK(sampler_ != nullptr, "this engine was built without a dataset");
  const int64_t gbs = cfg_.train_batch_size;
  int32_t* in = inputs_.as<int32_t>();
  int32_t* tg = targets_.as<int32_t>();
  const int64_t first =
      data::Sampler::first_sample_of(consumed_samples_, data_rank_, data_size_, gbs);
  int32_t* docs = doc_begin_.as<int32_t>();
  sampler_->get_batch(first, gbs / data_size_, in, tg, docs);
  // The loss is the mean over the global batch's trained targets, whichever rank holds them.
  return train_batch_on(in, tg, docs, sampler_->trained_tokens(consumed_samples_, gbs));
}

data::SamplerOptions sampler_options(const DataConfig& d, const data::TokenDataset& dataset) {
  return {d.pack(dataset.has_loss_mask()), d.document_mask, d.eod_mask_loss};
}

std::pair<const int32_t*, const int32_t*> Engine::context_rows(const int32_t* inputs,
                                                               const int32_t* targets) {
  if (cp_comm_ == nullptr) return {inputs, targets};
  const int64_t T = cfg_.model.seq_len, Tl = T / cp_size_;
  const int64_t samples = cfg_.train_micro_batch_size_per_gpu * cfg_.gradient_accumulation_steps;
  int32_t* in = context_inputs_.as<int32_t>();
  int32_t* tg = context_targets_.as<int32_t>();
  for (int64_t b = 0; b < samples; ++b) {
    for (int64_t t = 0; t < Tl; ++t) {
      in[b * Tl + t] = inputs[b * T + context_pos_[size_t(t)]];
      tg[b * Tl + t] = targets[b * T + context_pos_[size_t(t)]];
    }
  }
  return {in, tg};
}

StepMetrics Engine::train_batch_on(const int32_t* inputs, const int32_t* targets) {
  return train_batch_on(inputs, targets, nullptr, cfg_.train_batch_size * cfg_.model.seq_len);
}

StepMetrics Engine::train_batch_on(const int32_t* inputs, const int32_t* targets,
                                   const int32_t* doc_begin, int64_t trained_tokens) {
  const Probe probe = begin_probe();
  const int64_t gbs = cfg_.train_batch_size;
  // Each micro-batch's dlogits carry 1/(the global batch's trained targets), making the
  // accumulated gradient that of their mean. A batch with none trains nothing.
  trained_tokens_ = trained_tokens;
  const float dloss = trained_tokens > 0 ? scaler_.scale() / float(trained_tokens) : 0.0f;
  // The schedule: every forward and backward of the step, gradients accumulated (and, under data
  // parallelism, reduced as their units finish).
  begin_gradients();
  // A mixture of experts' balancing losses: a mean over the global batch's sequences.
  if (cfg_.model.moe.experts > 0) {
    for (auto& c : pipe_->chunks()) c->set_aux_scale(scaler_.scale() / float(gbs));
  }
  const auto [rows_in, rows_tg] = context_rows(inputs, targets);
  const pipeline::Executor::Pass pass =
      pipe_->run(rows_in, rows_tg, dloss, sync_.get(), step_ + 1, doc_begin);
  enter_phase(KillPhase::Reduce, step_ + 1, "gradient reduction");
  const Reduced reduced = reduce_gradients(pass.loss_sum);
  consumed_samples_ += gbs;
  ++step_;
  const auto update_start = std::chrono::steady_clock::now();
  const Update update = update_parameters();
  return step_metrics(probe, pass, reduced, update, update_start);
}

void Engine::begin_gradients() {
  if (sync_) sync_->begin_step();
}

Engine::Reduced Engine::reduce_gradients(double local_loss_sum) {
  Reduced r;
  if (sync_) {
    sync_->finish();
    r.comm_exposed_s = sync_->reduce_wait_seconds();
    r.gather_exposed_s = sync_->gather_wait_seconds();
  }
  // The tied embedding's gradient and the loss are summed over the stages: under a pipeline a
  // wait for the other stages to finish their schedule, counted with the pipeline's receives.
  const auto w0 = std::chrono::steady_clock::now();
  sum_tied_embeddings();
  r.loss_sum = sum_over_pp_dp(local_loss_sum);  // only the last stage has the loss
  if (cfg_.model.moe.experts > 0) {             // the balancing losses, in token-loss units
    double aux = 0.0;
    for (auto& c : pipe_->chunks()) aux += c->take_aux_loss();
    r.aux_loss = sum_over_pp_dp(aux) / double(cfg_.train_batch_size);
    r.loss_sum += r.aux_loss * double(trained_tokens_);
    sum_expert_tokens();
    update_expert_bias();
  }
  if (pp_comm_ != nullptr) {
    r.stage_sum_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  }
  return r;
}

// The tokens each MoE layer routed to each expert this step, summed over the pipeline stages
// (their layers) and the data- and context-parallel ranks (their rows); tensor-parallel ranks
// route the same rows and count once (with whole experts, their own rows: summed).
void Engine::sum_expert_tokens() {
  const ModelConfig& m = cfg_.model;
  const int E = m.moe.experts;
  if (expert_layers_.empty()) {
    for (int l = 0; l < m.layers; ++l) {
      if (m.moe_layer(l)) expert_layers_.push_back(l);
    }
  }
  expert_tokens_.assign(size_t(m.layers) * E, 0.0);
  for (auto& c : pipe_->chunks()) c->take_expert_tokens(expert_tokens_);
  expert_sum_.assign(expert_tokens_.begin(), expert_tokens_.end());  // exact below 2^24
  // With whole experts each tensor-parallel rank routes its own rows: summed over them too.
  comm::Communicator* own_rows = spec_.ep.whole ? tp_comm_ : nullptr;
  for (comm::Communicator* c : {pp_comm_, dp_size_ > 1 ? dp_ : nullptr, own_rows}) {
    if (c != nullptr) c->all_reduce(expert_sum_.data(), expert_sum_.size(), DType::F32, DType::F32);
  }
  size_t at = 0;
  for (int l : expert_layers_) {
    for (int e = 0; e < E; ++e) expert_tokens_[at++] = expert_sum_[size_t(l) * E + size_t(e)];
  }
  expert_tokens_.resize(at);
}

// The auxiliary-loss-free balancing (DeepSeek-V3's, Megatron's moe_router_bias_update_rate): each
// MoE layer's bias moves by the rate towards the expert that took fewer than its layer's mean of
// the global batch's tokens, away from one that took more. The counts are the global batch's on
// every rank, so every rank and layout moves it alike.
void Engine::update_expert_bias() {
  const MoeConfig& moe = cfg_.model.moe;
  if (expert_bias_.empty() || moe.expert_bias_update_rate <= 0) return;
  const int E = moe.experts;
  for (size_t i = 0; i < expert_layers_.size(); ++i) {
    const double* load = expert_tokens_.data() + i * size_t(E);
    double mean = 0.0;
    for (int e = 0; e < E; ++e) mean += load[e];
    mean /= E;
    float* bias = expert_bias_.data() + size_t(expert_layers_[i]) * size_t(E);
    for (int e = 0; e < E; ++e) {
      if (load[e] < mean) bias[e] += moe.expert_bias_update_rate;
      if (load[e] > mean) bias[e] -= moe.expert_bias_update_rate;
    }
  }
}

Engine::Update Engine::update_parameters() {
  // Under ZeRO each rank holds the reduced gradients of its owned chunks only: Σ g² over them,
  // summed over the shard group.
  const double sumsq = sync_ ? sync_->sum_squares(replicated_)
                             : clipper_.flat_sum_squares(
                                   Tensor(grads_.data(), grad_dtype_, {spec_.numel}), replicated_);
  Update u;
  u.loss_scale = scaler_.scale();
  enter_phase(KillPhase::None, step_, "optimizer");
  u.clip = clipper_.decide(sumsq, u.loss_scale);
  u.lr = lr_of_step(cfg_.scheduler, cfg_.optimizer.lr, optimizer_->steps_taken());
  if (!u.clip.skipped) enter_phase(KillPhase::Optimizer, step_, "optimizer");
  clipper_.step(*optimizer_, u.clip, sync_ ? sync_->optimizer_grads() : grads_.data(), u.lr,
                u.loss_scale);
  // Publishing: every rank took the same skip decision (the norm is global); gather regardless.
  if (sync_) sync_->after_step();
  if (cfg_.fp16.enabled) scaler_.update(u.clip.overflow);
  zero_grads();
  return u;
}

void Engine::enter_phase(KillPhase phase, int64_t step, const char* activity) {
  comm::flight::set_activity(step, activity);
  if (phase != KillPhase::None) faults_.at(phase, step);
}

Engine::Probe Engine::begin_probe() {
  MemoryTracker::instance().reset_peaks();
  for (auto& c : pipe_->chunks()) {
    c->take_tp_seconds(), c->take_recompute_seconds(), c->take_ep_seconds();
  }
  return {std::chrono::steady_clock::now(), wire_bytes(), tp_wire_bytes(),
          replica_comm_ ? replica_comm_->wire_bytes() : 0};
}

StepMetrics Engine::step_metrics(const Probe& probe, const pipeline::Executor::Pass& pass,
                                 const Reduced& reduced, const Update& update,
                                 std::chrono::steady_clock::time_point update_start) {
  StepMetrics s;
  const bool profile = cfg_.activation_checkpointing.profile;
  if (profile) recompute_block_s_.assign(size_t(cfg_.model.layers), 0.0);  // sized once
  if (ep_comm_ != nullptr) s.ep_comm_s = 0.0;
  for (auto& c : pipe_->chunks()) {
    s.tp_comm_s += c->take_tp_seconds();
    if (ep_comm_ != nullptr) s.ep_comm_s += c->take_ep_seconds();
    s.recompute_s += c->take_recompute_seconds(profile ? &recompute_block_s_ : nullptr);
  }
  s.recompute_block_s = recompute_block_s_;
  const int64_t tokens = cfg_.train_batch_size * cfg_.model.seq_len;
  s.step = step_;
  s.loss = trained_tokens_ > 0 ? reduced.loss_sum / double(trained_tokens_) : 0.0;
  s.trained_tokens = trained_tokens_;
  if (cfg_.model.moe.experts > 0) {
    s.moe_aux_loss = reduced.aux_loss;
    s.expert_layers = expert_layers_;
    s.expert_tokens = expert_tokens_;
    s.experts = cfg_.model.moe.experts;
    if (cfg_.model.moe.capacity_factor > 0) {
      double taken = 0;
      for (double t : expert_tokens_) taken += t;
      s.moe_dropped =
          1.0 - taken / (double(expert_layers_.size()) * double(tokens) * cfg_.model.moe.top_k);
    }
  }
  s.lr = update.lr;
  s.grad_norm = update.clip.grad_norm;
  s.loss_scale = update.loss_scale;
  s.skipped = update.clip.skipped;
  s.tokens = tokens;
  const auto t1 = std::chrono::steady_clock::now();
  s.seconds = std::chrono::duration<double>(t1 - probe.t0).count();
  s.forward_s = pass.forward_s;
  s.backward_s = pass.backward_s;
  s.pipeline_wait_s = pass.recv_wait_s + reduced.stage_sum_s;
  s.optimizer_s = std::chrono::duration<double>(t1 - update_start).count();
  s.comm_exposed_s = reduced.comm_exposed_s;
  s.gather_exposed_s = reduced.gather_exposed_s;
  s.tp_bytes = tp_wire_bytes() - probe.tp_bytes0;
  s.comm_bytes = wire_bytes() - probe.bytes0;
  s.cross_group_bytes = (replica_comm_ ? replica_comm_->wire_bytes() : 0) - probe.cross0;
  s.tokens_per_s = double(s.tokens) / s.seconds;
  s.trained_tokens_per_s = double(s.trained_tokens) / s.seconds;
  s.flops = flops_per_token_ * double(s.tokens);
  for (int c = 0; c < kNumMemCategories; ++c) {
    s.peak_bytes[size_t(c)] = MemoryTracker::instance().peak(MemCategory(c));
  }
  return s;
}

}  // namespace strata
