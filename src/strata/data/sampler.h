// Training samples as a pure function of (seed, global sample index) — DESIGN.md §1.
//
// The dataset is cut into N = (num_tokens - 1) / T non-overlapping windows of T+1 tokens
// (window w starts at token w·T; consecutive windows share one token, the last target of one is
// the first input of the next). Sample i is window perm_e(i mod N) of epoch e = i / N, where
// perm_e is a seeded bijection on [0, N): a Feistel network keyed by Philox(seed, epoch) with
// cycle walking, computed per sample in O(1) and with no table. Nothing depends on the rank
// count, so the resumable state of the data is the one number consumed_samples.
#pragma once

#include <cstdint>

#include "strata/data/token_dataset.h"

namespace strata::data {

class Sampler {
 public:
  // Throws InputError if the dataset has fewer than seq_len + 1 tokens. Keeps a reference to
  // `dataset`, which must outlive the sampler.
  Sampler(const TokenDataset& dataset, int seq_len, uint64_t seed);

  int seq_len() const { return T_; }
  int64_t num_windows() const { return N_; }  // samples per epoch
  // The window (0..N-1) that global sample `sample_index` reads; its first token is window·T.
  int64_t window_of(int64_t sample_index) const;

  // inputs (T) = tokens [w·T, w·T+T), targets (T) = tokens [w·T+1, w·T+T+1).
  void get(int64_t sample_index, int32_t* inputs, int32_t* targets) const;
  // The same for window w itself (0..N-1), in no permutation: evaluation reads windows in order.
  void get_window(int64_t window, int32_t* inputs, int32_t* targets) const;
  // inputs, targets (count, T): samples first_sample .. first_sample+count-1, row-major.
  void get_batch(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets) const;

  // Global batch k holds samples [k·GBS, (k+1)·GBS); after consumed_samples = k·GBS, data-parallel
  // rank r of D reads GBS/D samples from consumed_samples + r·GBS/D (then splits them into
  // micro-batches). Throws InputError if GBS is not divisible by D.
  static int64_t first_sample_of(int64_t consumed_samples, int dp_rank, int dp_size,
                                 int64_t global_batch);

  // Throws InputError if the dataset holds a token id >= vocab (the model's vocabulary size).
  void check_vocab(int64_t vocab) const;

 private:
  uint64_t feistel(uint64_t x, uint64_t epoch) const;

  const TokenDataset& dataset_;
  int T_;
  int64_t N_;
  uint64_t key_;
  int half_bits_;  // the Feistel domain is [0, 4^half_bits), the smallest such power >= N
};

}  // namespace strata::data
