#include "strata/data/sampler.h"

#include <algorithm>

#include "strata/core/check.h"
#include "strata/core/rng.h"

namespace strata::data {

namespace {
constexpr int kFeistelRounds = 6;
}

Sampler::Sampler(const TokenDataset& dataset, int seq_len, uint64_t seed)
    : dataset_(dataset), T_(seq_len), key_(rng_key(seed, "data/sampler")) {
  STRATA_INPUT_CHECK(seq_len >= 1, "seq_len ", seq_len, " must be at least 1");
  const int64_t n = dataset.num_tokens();
  STRATA_INPUT_CHECK(n >= int64_t(seq_len) + 1, "dataset ", dataset.source(), " has ", n,
                     " tokens but seq_len ", seq_len, " needs at least ", int64_t(seq_len) + 1,
                     " (one window of seq_len inputs plus the next-token target); use a larger ",
                     "dataset or a shorter seq_len");
  N_ = (n - 1) / seq_len;
  half_bits_ = 1;
  while (half_bits_ < 32 && (uint64_t(1) << (2 * half_bits_)) < uint64_t(N_)) ++half_bits_;
}

// A balanced Feistel network on 2·half_bits bits: a bijection for any round function.
uint64_t Sampler::feistel(uint64_t x, uint64_t epoch) const {
  const uint64_t mask = (uint64_t(1) << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int r = 0; r < kFeistelRounds; ++r) {
    const uint64_t f = philox4x32(right, (epoch << 8) | uint64_t(r), key_)[0] & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t Sampler::window_of(int64_t sample_index) const {
  STRATA_CHECK(sample_index >= 0, "negative sample index ", sample_index);
  const uint64_t epoch = uint64_t(sample_index / N_);
  uint64_t x = uint64_t(sample_index % N_);
  // Cycle walking: re-applying the bijection until it lands in [0, N) restricts it to [0, N).
  // The domain is below 4N, so this takes fewer than 4 steps on average.
  do {
    x = feistel(x, epoch);
  } while (x >= uint64_t(N_));
  return int64_t(x);
}

void Sampler::get(int64_t sample_index, int32_t* inputs, int32_t* targets) const {
  get_window(window_of(sample_index), inputs, targets);
}

void Sampler::get_window(int64_t window, int32_t* inputs, int32_t* targets) const {
  STRATA_CHECK(window >= 0 && window < N_, "window ", window, " outside [0, ", N_, ")");
  const int64_t start = window * T_;
  dataset_.read(start, T_, inputs);
  std::copy(inputs + 1, inputs + T_, targets);
  dataset_.read(start + T_, 1, targets + T_ - 1);
}

void Sampler::get_batch(int64_t first_sample, int64_t count, int32_t* inputs,
                        int32_t* targets) const {
  for (int64_t b = 0; b < count; ++b) {
    get(first_sample + b, inputs + b * T_, targets + b * T_);
  }
}

int64_t Sampler::first_sample_of(int64_t consumed_samples, int dp_rank, int dp_size,
                                 int64_t global_batch) {
  STRATA_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "dp rank ", dp_rank,
               " outside a data-parallel group of ", dp_size);
  STRATA_CHECK(consumed_samples >= 0, "negative consumed_samples ", consumed_samples);
  STRATA_INPUT_CHECK(global_batch > 0 && global_batch % dp_size == 0, "global batch size ",
                     global_batch, " is not a positive multiple of the data-parallel size ",
                     dp_size, "; choose train_batch_size divisible by dp");
  return consumed_samples + int64_t(dp_rank) * (global_batch / dp_size);
}

void Sampler::check_vocab(int64_t vocab) const {
  const int64_t bound = dataset_.vocab_bound();
  STRATA_INPUT_CHECK(bound <= vocab, "dataset ", dataset_.source(), " has token id ", bound - 1,
                     " but model.vocab is ", vocab,
                     "; use a model with a larger vocab or re-tokenize the data");
}

}  // namespace strata::data
