// Engine::evaluate: the validation loss (the mean over the trained targets), forward only, through
// the same chunks, tensor slices, pipeline transfers and ZeRO gathers as a training step, so every
// layout gives the loss of one process (DESIGN.md §1).
#include "strata/comm/flight_recorder.h"
#include "strata/core/check.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "strata/zero/zero_sync.h"

namespace strata {

void Engine::set_validation(const data::TokenDataset& val) {
  val_sampler_ = std::make_unique<data::Sampler>(val, cfg_.model.seq_len, cfg_.train.seed,
                                                 sampler_options(cfg_.data, val));
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

double Engine::evaluate(int64_t iters) {
  comm::flight::set_activity(step_, "validation");
  STRATA_CHECK(val_sampler_ != nullptr, "evaluate() needs set_validation() first");
  STRATA_CHECK(iters >= 1, "evaluate() over ", iters, " batches");
  const int64_t gbs = cfg_.train_batch_size, T = cfg_.model.seq_len;
  const int64_t local = gbs / data_size_, windows = val_sampler_->num_windows();
  int32_t* in = inputs_.as<int32_t>();
  int32_t* tg = targets_.as<int32_t>();
  // ZeRO-3 prefetches past a forward into the backward's units; an evaluation has none, so
  // each pass ends with nothing gathered, as a step does.
  std::function<void()> drop;
  if (sync_ && shard_ != nullptr && cfg_.zero.stage == 3) drop = [this] { sync_->drop_gathered(); };
  if (sync_) sync_->begin_eval();
  int32_t* docs = doc_begin_.as<int32_t>();
  double loss_sum = 0.0;
  int64_t trained = 0;  // the targets of every rank's windows, as a step counts them
  for (int64_t i = 0; i < iters; ++i) {
    for (int64_t w = i * gbs; w < (i + 1) * gbs; ++w)
      trained += val_sampler_->window_trained(w % windows);
    const int64_t first = data::Sampler::first_sample_of(i * gbs, data_rank_, data_size_, gbs);
    for (int64_t b = 0; b < local; ++b) {
      val_sampler_->get_window((first + b) % windows, in + b * T, tg + b * T,
                               docs != nullptr ? docs + b * T : nullptr);
    }
    const auto [rows_in, rows_tg] = context_rows(in, tg);
    loss_sum += pipe_->forward_only(rows_in, rows_tg, sync_.get(), drop, docs);
  }
  // As a step's loss: the last stage's sum over the pipeline, then over data parallelism.
  const float sum = float(sum_over_pp_dp(loss_sum));
  return trained > 0 ? double(sum) / double(trained) : 0.0;
}

}  // namespace strata
