#include "strata/train/engine.h"

#include <chrono>
#include <cmath>

#include "strata/comm/communicator.h"
#include "strata/core/check.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/cpu/optimizer.h"
#include "strata/optim/lr_schedule.h"
#include "strata/zero/grad_sync.h"
#include "strata/zero/zero1.h"

namespace strata {

namespace {

// ZeRO stage 1 partitions every unit into dp chunks: units are padded to a multiple of dp.
bool zero1_in_effect(const Config& cfg, const comm::Communicator* dp) {
  return cfg.zero.stage == 1 && dp != nullptr && dp->size() > 1;
}

}  // namespace

Engine::Engine(const Config& cfg, const data::TokenDataset* dataset, comm::Communicator* dp)
    : cfg_(cfg),
      spec_(build_model_spec(cfg.model, zero1_in_effect(cfg, dp) ? dp->size() : 1)),
      dp_(dp) {
  if (dp_ != nullptr) dp_rank_ = dp_->rank(), dp_size_ = dp_->size();
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

  params_ = Buffer(MemCategory::Params, size_t(spec_.numel) * dtype_size(pt));
  grads_ = Buffer(MemCategory::Grads, size_t(spec_.numel) * dtype_size(gt));
  if (zero1_in_effect(cfg_, dp_)) {
    // Stage 1: the master and moments hold only the owned chunks; each rank initialises its
    // owned elements (a pure function of seed, name and index) and the units are gathered.
    zero1_ = std::make_unique<Zero1Sync>(*dp_, spec_, grads_.data(), gt, cfg_.comm_dtype(),
                                         cfg_.zero.overlap_comm);
    const std::vector<ParamRange>& owned = zero1_->owned_ranges();
    optimizer_ = std::make_unique<Optimizer>(cfg_.optimizer, pt, gt, params_.data(), spec_.numel,
                                             owned, zero1_->owned_numel());
    size_t pi = 0;
    for (const ParamRange& r : owned) {
      while (spec_.params[pi].offset + spec_.params[pi].numel() <= r.offset) ++pi;
      const ParamSpec& p = spec_.params[pi];
      init_param_slice(optimizer_->master() + r.state_offset, p, cfg_.train.seed,
                       r.offset - p.offset, r.numel);
    }
    optimizer_->publish();
    zero1_->gather_params(params_.data(), pt);
  } else {
    std::vector<ParamRange> ranges;
    for (const ParamSpec& p : spec_.params) ranges.push_back({p.offset, p.numel(), p.decay});
    optimizer_ = std::make_unique<Optimizer>(cfg_.optimizer, pt, gt, params_.data(), spec_.numel,
                                             std::move(ranges));
    for (const ParamSpec& p : spec_.params) {
      init_param_slice(optimizer_->master() + p.offset, p, cfg_.train.seed, 0, p.numel());
    }
    optimizer_->publish();
  }
  if (cfg_.fp16.enabled) scaler_ = LossScaler(cfg_.fp16);

  const int B = int(cfg_.train_micro_batch_size_per_gpu);
  model_ = make_transformer(spec_, pt, gt, params_.data(), grads_.data(), B, m.seq_len);
  const size_t local_samples =
      size_t(cfg_.train_micro_batch_size_per_gpu * cfg_.gradient_accumulation_steps);
  const size_t batch_bytes = local_samples * size_t(m.seq_len) * sizeof(int32_t);
  inputs_ = Buffer(MemCategory::Activations, batch_bytes);
  targets_ = Buffer(MemCategory::Activations, batch_bytes);
  flops_per_token_ = train_flops_per_token(spec_);
  if (dp_size_ > 1 && !zero1_) {
    grad_sync_ = std::make_unique<GradSync>(*dp_, spec_, grads_.data(), gt, cfg_.comm_dtype(),
                                            cfg_.zero.reduce_bucket_size, cfg_.zero.overlap_comm);
  }
}

Engine::~Engine() {
  // An error mid-step can leave buckets queued on the communication thread, which would go on
  // writing into the gradients: leave that memory to it; the job is being aborted.
  if ((grad_sync_ && grad_sync_->in_flight()) || (zero1_ && zero1_->in_flight())) grads_.leak();
}

void Engine::zero_grads() {
  std::memset(grads_.data(), 0, grads_.bytes());
}

double Engine::forward_backward(const int32_t* inputs, const int32_t* targets) {
  const int64_t tokens = cfg_.train_micro_batch_size_per_gpu * cfg_.model.seq_len;
  double loss = model_->forward(inputs, targets, scaler_.scale() / float(tokens), true);
  model_->backward();
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
  const int64_t mb = cfg_.train_micro_batch_size_per_gpu;
  const int64_t gas = cfg_.gradient_accumulation_steps;
  const int64_t gbs = cfg_.train_batch_size;
  const int64_t T = cfg_.model.seq_len;
  // Every target of a sampled window counts, so the global batch holds gbs·T loss terms; each
  // micro-batch's dlogits carry 1/(gbs·T), making the accumulated gradient the global mean's.
  const float dloss = scaler_.scale() / float(gbs * T);
  double loss_sum = 0.0, forward_s = 0.0, backward_s = 0.0;
  UnitHook* hook = zero1_ ? static_cast<UnitHook*>(zero1_.get()) : grad_sync_.get();
  for (int64_t k = 0; k < gas; ++k) {
    const int64_t at = k * mb * T;
    auto f0 = clock::now();
    loss_sum += model_->forward(inputs + at, targets + at, dloss, true);
    auto f1 = clock::now();
    const bool boundary = k == gas - 1;
    if (boundary) {
      if (grad_sync_) grad_sync_->begin_boundary();
      if (zero1_) zero1_->begin_boundary();
    }
    model_->backward(boundary ? hook : nullptr);
    forward_s += std::chrono::duration<double>(f1 - f0).count();
    backward_s += std::chrono::duration<double>(clock::now() - f1).count();
  }
  double comm_exposed_s = 0.0;
  if (grad_sync_ || zero1_) {
    if (grad_sync_) {
      grad_sync_->finish();
      comm_exposed_s = grad_sync_->exposed_seconds();
    } else {
      zero1_->finish();
      comm_exposed_s = zero1_->exposed_seconds();
    }
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
  double sumsq = 0.0;
  if (zero1_) {
    // Each rank holds the summed gradients of its owned chunks only: Σ g² over them, summed.
    float owned = float(zero1_->owned_sum_squares());
    dp_->all_reduce(&owned, 1, DType::F32, DType::F32);
    sumsq = owned;
  } else {
    sumsq = kernels::sum_squares(grads_.data(), grad_dtype_, size_t(spec_.numel));
  }
  s.grad_norm = std::sqrt(sumsq) / scaler_.scale();
  const bool overflow = !std::isfinite(sumsq);
  const bool check = !cfg_.bf16.enabled || cfg_.bf16.check_grad_overflow;
  s.skipped = overflow && check;
  s.lr = lr_at(cfg_.scheduler, cfg_.optimizer.lr, optimizer_->steps_taken());
  if (!s.skipped) {
    float clip = 1.0f;
    if (cfg_.gradient_clipping > 0.0f && s.grad_norm > cfg_.gradient_clipping) {
      clip = float(cfg_.gradient_clipping / (s.grad_norm + 1e-6));  // torch's clip_grad_norm_
    }
    optimizer_->step(grads_.data(), s.lr, clip / scaler_.scale());
  }
  // Every rank takes the same skip decision (the norm is global); gather regardless.
  if (zero1_) zero1_->gather_params(params_.data(), cfg_.param_dtype());
  if (cfg_.fp16.enabled) scaler_.update(overflow);
  zero_grads();

  s.tokens = gbs * T;
  const auto t1 = clock::now();
  s.seconds = std::chrono::duration<double>(t1 - t0).count();
  s.forward_s = forward_s;
  s.backward_s = backward_s;
  s.optimizer_s = std::chrono::duration<double>(t1 - o0).count();
  s.comm_exposed_s = comm_exposed_s;
  s.tokens_per_s = double(s.tokens) / s.seconds;
  s.flops = flops_per_token_ * double(s.tokens);
  for (int c = 0; c < kNumMemCategories; ++c) {
    s.peak_bytes[size_t(c)] = MemoryTracker::instance().peak(MemCategory(c));
  }
  return s;
}

}  // namespace strata
