// Training samples as a pure function of (seed, global sample index) — DESIGN.md §1.
//
// Windows. By default the dataset is cut into N = (num_tokens - 1) / T non-overlapping windows of
// T+1 tokens (window w starts at token w·T; consecutive windows share one token, the last target
// of one is the first input of the next), crossing documents. Packed (SamplerOptions::pack), the
// dataset's documents (TokenDataset::document_starts) are placed whole into windows of T
// positions, first-fit in dataset order: each document goes into the first window with room for
// it; a document longer than T is cut into pieces of T tokens that overlap by one (every token
// but its first is a target exactly once), each piece placed as a document; documents of one
// token (no target) are left out. Every position a window's pieces leave free at its end is
// padding (token 0, no target). In a window, each position's target is the next token of its
// own document: the last token of a piece has none.
//
// Sample i is window perm_e(i mod N) of epoch e = i / N, where perm_e is a seeded bijection on
// [0, N): a Feistel network keyed by Philox(seed, epoch) with cycle walking, computed per sample
// in O(1) and with no table. Nothing depends on the rank count, so the resumable state of the
// data is the one number consumed_samples.
//
// Targets not trained are -1: where the dataset's loss mask (TokenDataset::read_mask) says 0,
// the padding, and, with document_mask or eod_mask_loss, a target that opens a document (its
// prediction would read another document).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/data/token_dataset.h"

namespace strata::data {

struct SamplerOptions {
  bool pack = false;           // first-fit packed documents (above), else contiguous windows
  bool document_mask = false;  // doc_begin below is filled, and document-opening targets are -1
  bool eod_mask_loss = false;  // document-opening targets are -1 (Megatron's --eod-mask-loss)
};

class Sampler {
 public:
  // Throws InputError if the dataset has fewer than seq_len + 1 tokens, or, packed or with
  // document masking, records no documents. Keeps a reference to `dataset`, which must outlive
  // the sampler. Packing, a loss mask or document masking read the whole dataset once here (in
  // parallel) for each window's trained targets.
  Sampler(const TokenDataset& dataset, int seq_len, uint64_t seed, SamplerOptions options = {});

  int seq_len() const { return T_; }
  int64_t num_windows() const { return N_; }  // samples per epoch
  const SamplerOptions& options() const { return options_; }
  // The window (0..N-1) that global sample `sample_index` reads.
  int64_t window_of(int64_t sample_index) const;

  // inputs (T), targets (T, -1 where not trained) and, when doc_begin is given, each position's
  // document start within the window (0 for the first; ops::AttentionShape::doc_begin). Contiguous,
  // inputs = tokens [w·T, w·T+T), targets = tokens [w·T+1, w·T+T+1).
  void get(int64_t sample_index, int32_t* inputs, int32_t* targets,
           int32_t* doc_begin = nullptr) const;
  // The same for window w itself (0..N-1), in no permutation: evaluation reads windows in order.
  void get_window(int64_t window, int32_t* inputs, int32_t* targets,
                  int32_t* doc_begin = nullptr) const;
  // inputs, targets, doc_begin (count, T): samples first_sample .. first_sample+count-1.
  void get_batch(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets,
                 int32_t* doc_begin = nullptr) const;
  // The targets (not -1) of a sample, of a window, and of count samples from first_sample.
  int64_t trained_tokens(int64_t sample_index) const {
    return window_trained(window_of(sample_index));
  }
  int64_t window_trained(int64_t window) const {
    return trained_.empty() ? T_ : trained_[size_t(window)];
  }
  int64_t trained_tokens(int64_t first_sample, int64_t count) const;

  // Packing's figures: documents placed (pieces of long ones counted each), and the share of the
  // windows' positions that hold a token (1 for contiguous windows).
  int64_t packed_pieces() const { return int64_t(piece_begin_.size()); }
  double packing_efficiency() const;

  // Global batch k holds samples [k·GBS, (k+1)·GBS); after consumed_samples = k·GBS, data-parallel
  // rank r of D reads GBS/D samples from consumed_samples + r·GBS/D (then splits them into
  // micro-batches). Throws InputError if GBS is not divisible by D.
  static int64_t first_sample_of(int64_t consumed_samples, int dp_rank, int dp_size,
                                 int64_t global_batch);

  // Throws InputError if the dataset holds a token id >= vocab (the model's vocabulary size).
  void check_vocab(int64_t vocab) const;

 private:
  uint64_t feistel(uint64_t x, uint64_t epoch) const;

  void pack();
  // The dataset's documents that begin in (start, start + count], relative to start.
  void document_starts_in(int64_t start, int64_t count, std::vector<int64_t>& out) const;

  const TokenDataset& dataset_;
  int T_;
  SamplerOptions options_;
  int64_t N_;
  // Packed: window w's pieces are [window_first_[w], window_first_[w+1]) of piece_begin_ (the
  // first token, in the dataset) and piece_len_ (tokens), in placement order.
  std::vector<int64_t> window_first_, piece_begin_;
  std::vector<int32_t> piece_len_;
  std::vector<int32_t> trained_;  // per window, when not all T targets are trained
  uint64_t key_;
  int half_bits_;  // the Feistel domain is [0, 4^half_bits), the smallest such power >= N
};

}  // namespace strata::data
