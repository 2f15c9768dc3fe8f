// Engine::evaluate: the validation loss, forward only, through the same chunks, tensor slices,
// pipeline transfers and ZeRO gathers as a training step, so every layout gives the loss of one
// process (DESIGN.md §1).
#include "strata/comm/communicator.h"
#include "strata/comm/peer_exchange.h"
#include "strata/core/check.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/pipeline/schedule.h"
#include "strata/train/engine.h"
#include "strata/zero/zero_sync.h"

namespace strata {

void Engine::set_validation(const data::TokenDataset& val) {
  val_sampler_ = std::make_unique<data::Sampler>(val, cfg_.model.seq_len, cfg_.train.seed);
  const int64_t bound = val.vocab_bound();
  STRATA_INPUT_CHECK(bound <= cfg_.model.vocab, "validation data ", val.source(), " has token id ",
                     bound - 1, " but model.vocab is ", cfg_.model.vocab,
                     ": it was tokenized with another vocabulary than the training data; "
                     "re-tokenize it with the training data's tokenizer or set data.val_path to "
                     "data of this vocabulary");
}

int64_t Engine::val_windows() const {
  return val_sampler_ ? val_sampler_->num_windows() : 0;
}

// This rank's micro-batches forward only: per micro-batch, this stage's chunks in global order,
// each after receiving its input from the previous chunk's stage and before sending its output
// to the next (sends never block: a stage runs ahead by at most its chunks, within the ring the
// training schedule bounds). Returns the summed token losses (the last stage's; 0 elsewhere).
double Engine::forward_only(const int32_t* inputs, const int32_t* targets) {
  const int64_t mb = cfg_.train_micro_batch_size_per_gpu, T = cfg_.model.seq_len;
  const int gas = int(cfg_.gradient_accumulation_steps);
  const int v = int(chunks_.size());
  const int last = stages_ * v - 1;
  const DType pt = cfg_.param_dtype();
  // The training schedule's tags and tensor-parallel row blocks (run_schedule).
  auto tag = [&](int micro, int g) { return (micro * (last + 1) + g) * 2; };
  const int tps = tp_->size();
  const bool split = tps > 1 && !tp_->sequence_parallel() && mb * T % tps == 0;
  auto tp_part = [&](const Tensor& t) {
    if (!split) return t;
    const int64_t rows = t.dim(0) / tps;
    return t.slice0(tp_->rank() * rows, (tp_->rank() + 1) * rows);
  };
  // ZeRO-3 prefetches past a forward into the backward's units; an evaluation has none, so
  // each pass ends with nothing gathered, as a step does.
  const bool gathers = sync_ && shard_ != nullptr && cfg_.zero.stage == 3;
  double loss_sum = 0.0;
  for (int micro = 0; micro < gas; ++micro) {
    const int64_t at = micro * mb * T;
    for (int k = 0; k < v; ++k) {
      const int g = pipeline::global_chunk(k, stage_, stages_);
      Transformer& c = *chunks_[size_t(k)];
      Tensor in;
      if (g > 0) {
        in = c.hidden_view(recv_act_[size_t(k)]);
        const Tensor part = tp_part(in);
        peers_->recv(part.data, size_t(part.numel()), pt, pipeline::stage_of(g - 1, stages_),
                     tag(micro, g), "an evaluation activation");
        if (part.data != in.data || part.numel() != in.numel()) tp_->all_gather(in, part);
      }
      loss_sum += c.forward(micro, g == 0 ? inputs + at : nullptr, in,
                            g == last ? targets + at : nullptr, 0.0f, false, sync_.get());
      if (gathers) sync_->drop_gathered();
      if (g < last) {
        const Tensor out = tp_part(c.output(micro));
        peers_->send(out.data, size_t(out.numel()), pt, pipeline::stage_of(g + 1, stages_),
                     tag(micro, g + 1), "an evaluation activation");
      }
    }
  }
  if (peers_) peers_->wait_sends();
  return loss_sum;
}

double Engine::evaluate(int64_t iters) {
  STRATA_CHECK(val_sampler_ != nullptr, "evaluate() needs set_validation() first");
  STRATA_CHECK(iters >= 1, "evaluate() over ", iters, " batches");
  const int64_t gbs = cfg_.train_batch_size, T = cfg_.model.seq_len;
  const int64_t local = gbs / dp_size_, windows = val_sampler_->num_windows();
  int32_t* in = inputs_.as<int32_t>();
  int32_t* tg = targets_.as<int32_t>();
  double loss_sum = 0.0;
  for (int64_t i = 0; i < iters; ++i) {
    const int64_t first = data::Sampler::first_sample_of(i * gbs, dp_rank_, dp_size_, gbs);
    for (int64_t b = 0; b < local; ++b) {
      val_sampler_->get_window((first + b) % windows, in + b * T, tg + b * T);
    }
    loss_sum += forward_only(in, tg);
  }
  // As a step's loss: the last stage's sum over the pipeline, then over data parallelism.
  float sum = float(loss_sum);
  if (pp_comm_ != nullptr) pp_comm_->all_reduce(&sum, 1, DType::F32, DType::F32);
  if (dp_ != nullptr && dp_size_ > 1) dp_->all_reduce(&sum, 1, DType::F32, DType::F32);
  return double(sum) / double(iters * gbs * T);
}

}  // namespace strata
