#include "strata/data/sampler.h"

#include <algorithm>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/rng.h"

namespace strata::data {

namespace {
constexpr int kFeistelRounds = 6;
}

Sampler::Sampler(const TokenDataset& dataset, int seq_len, uint64_t seed, SamplerOptions options)
    : dataset_(dataset), T_(seq_len), options_(options), key_(rng_key(seed, "data/sampler")) {
  STRATA_INPUT_CHECK(seq_len >= 1, "seq_len ", seq_len, " must be at least 1");
  const int64_t n = dataset.num_tokens();
  STRATA_INPUT_CHECK(options.pack || n >= int64_t(seq_len) + 1, "dataset ", dataset.source(),
                     " has ", n, " tokens but seq_len ", seq_len, " needs at least ",
                     int64_t(seq_len) + 1,
                     " (one window of seq_len inputs plus the next-token target); use a larger ",
                     "dataset or a shorter seq_len");
  const bool documents = options.pack || options.document_mask || options.eod_mask_loss;
  STRATA_INPUT_CHECK(!documents || !dataset.document_starts().empty(), "dataset ", dataset.source(),
                     " records no documents, which packing and document masking need (data."
                     "packing, data.document_mask, data.eod_mask_loss): prepare it in Megatron "
                     "format (strata data prepare --format megatron, or --jsonl), whose index "
                     "lists the documents");
  if (options.pack) {
    pack();
  } else {
    N_ = (n - 1) / seq_len;
  }
  half_bits_ = 1;
  while (half_bits_ < 32 && (uint64_t(1) << (2 * half_bits_)) < uint64_t(N_)) ++half_bits_;
  if (documents || dataset.has_loss_mask()) {
    // Each window's trained targets, for the loss's denominator (trained_tokens) without reading
    // the batch's other samples.
    trained_.assign(size_t(N_), 0);
#pragma omp parallel
    {
      std::vector<int32_t> in(static_cast<size_t>(T_)), tg(static_cast<size_t>(T_));
#pragma omp for schedule(dynamic, 64)
      for (int64_t w = 0; w < N_; ++w) {
        get_window(w, in.data(), tg.data());
        trained_[size_t(w)] =
            int32_t(std::count_if(tg.begin(), tg.end(), [](int32_t t) { return t >= 0; }));
      }
    }
  }
}

// First-fit in dataset order over windows of T positions: a max-tree over every window's free
// positions finds the first with room for a piece in O(log windows).
void Sampler::pack() {
  const std::vector<int64_t>& starts = dataset_.document_starts();
  const int64_t n = dataset_.num_tokens(), T = T_;
  std::vector<int64_t> begin;
  std::vector<int32_t> len;
  for (size_t d = 0; d < starts.size(); ++d) {
    const int64_t b = starts[d], e = d + 1 < starts.size() ? starts[d + 1] : n;
    // Pieces of T tokens overlapping by one, while a piece has a target.
    for (int64_t p = b; p + 1 < e; p += T - 1) {
      begin.push_back(p);
      len.push_back(int32_t(std::min(T, e - p)));
      if (T == 1) break;
    }
  }
  STRATA_INPUT_CHECK(!begin.empty() && T >= 2, "dataset ", dataset_.source(),
                     " has no document of two or more tokens to pack into windows of seq_len ", T,
                     " (a document needs a token and its next to train on)");
  size_t leaves = 1;
  while (leaves < begin.size()) leaves *= 2;
  std::vector<int32_t> room(2 * leaves, int32_t(T));  // max free positions in each subtree
  std::vector<int64_t> window(begin.size());
  int64_t used = 0;
  for (size_t i = 0; i < begin.size(); ++i) {
    size_t node = 1;
    while (node < leaves) node = room[2 * node] >= len[i] ? 2 * node : 2 * node + 1;
    window[i] = int64_t(node - leaves);
    used = std::max(used, window[i] + 1);
    room[node] -= len[i];
    for (node /= 2; node >= 1; node /= 2) room[node] = std::max(room[2 * node], room[2 * node + 1]);
  }
  N_ = used;
  // Pieces grouped by window, in placement order (a stable counting sort).
  window_first_.assign(size_t(N_) + 1, 0);
  for (int64_t w : window) ++window_first_[size_t(w) + 1];
  for (int64_t w = 0; w < N_; ++w) window_first_[size_t(w) + 1] += window_first_[size_t(w)];
  std::vector<int64_t> next(window_first_.begin(), window_first_.end() - 1);
  piece_begin_.resize(begin.size());
  piece_len_.resize(begin.size());
  for (size_t i = 0; i < begin.size(); ++i) {
    const int64_t at = next[size_t(window[i])]++;
    piece_begin_[size_t(at)] = begin[i];
    piece_len_[size_t(at)] = len[i];
  }
}

double Sampler::packing_efficiency() const {
  if (!options_.pack) return 1.0;
  int64_t tokens = 0;
  for (int32_t l : piece_len_) tokens += l;
  return double(tokens) / (double(N_) * double(T_));
}

int64_t Sampler::trained_tokens(int64_t first_sample, int64_t count) const {
  int64_t sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += trained_tokens(first_sample + i);
  return sum;
}

void Sampler::document_starts_in(int64_t start, int64_t count, std::vector<int64_t>& out) const {
  const std::vector<int64_t>& starts = dataset_.document_starts();
  out.clear();
  for (auto it = std::upper_bound(starts.begin(), starts.end(), start);
       it != starts.end() && *it <= start + count; ++it) {
    out.push_back(*it - start);
  }
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

void Sampler::get(int64_t sample_index, int32_t* inputs, int32_t* targets,
                  int32_t* doc_begin) const {
  get_window(window_of(sample_index), inputs, targets, doc_begin);
}

void Sampler::get_window(int64_t window, int32_t* inputs, int32_t* targets,
                         int32_t* doc_begin) const {
  STRATA_CHECK(window >= 0 && window < N_, "window ", window, " outside [0, ", N_, ")");
  const bool masked = dataset_.has_loss_mask();
  thread_local std::vector<uint8_t> mask;
  if (options_.pack) {
    std::fill(inputs, inputs + T_, 0);
    std::fill(targets, targets + T_, -1);
    int32_t at = 0;
    for (int64_t i = window_first_[size_t(window)]; i < window_first_[size_t(window) + 1]; ++i) {
      const int64_t b = piece_begin_[size_t(i)];
      const int32_t n = piece_len_[size_t(i)];
      dataset_.read(b, n, inputs + at);
      std::copy(inputs + at + 1, inputs + at + n, targets + at);
      if (masked) {
        mask.resize(size_t(n));
        dataset_.read_mask(b, n, mask.data());
        for (int32_t j = 0; j + 1 < n; ++j)
          if (mask[size_t(j) + 1] == 0) targets[at + j] = -1;
      }
      if (doc_begin != nullptr) std::fill(doc_begin + at, doc_begin + at + n, at);
      at += n;
    }
    if (doc_begin != nullptr) std::fill(doc_begin + at, doc_begin + T_, at);  // the padding's own
    return;
  }
  const int64_t start = window * T_;
  dataset_.read(start, T_, inputs);
  std::copy(inputs + 1, inputs + T_, targets);
  dataset_.read(start + T_, 1, targets + T_ - 1);
  if (masked) {
    mask.resize(size_t(T_));
    dataset_.read_mask(start + 1, T_, mask.data());
    for (int t = 0; t < T_; ++t)
      if (mask[size_t(t)] == 0) targets[t] = -1;
  }
  const bool boundaries = options_.document_mask || options_.eod_mask_loss;
  if (!boundaries && doc_begin == nullptr) return;
  thread_local std::vector<int64_t> starts;
  document_starts_in(start, T_, starts);  // relative, in (0, T]
  if (boundaries) {
    for (int64_t s : starts) targets[s - 1] = -1;  // the target at s opens a document
  }
  if (doc_begin != nullptr) {
    int32_t current = 0;
    size_t k = 0;
    for (int t = 0; t < T_; ++t) {
      while (k < starts.size() && starts[k] <= t) current = int32_t(starts[k++]);
      doc_begin[t] = current;
    }
  }
}

void Sampler::get_batch(int64_t first_sample, int64_t count, int32_t* inputs, int32_t* targets,
                        int32_t* doc_begin) const {
  for (int64_t b = 0; b < count; ++b) {
    get(first_sample + b, inputs + b * T_, targets + b * T_,
        doc_begin != nullptr ? doc_begin + b * T_ : nullptr);
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
