// The loss mask beside a Megatron pair: which tokens are trained as targets (`data prepare
// --jsonl`: the assistant's turns of each conversation). For the pair x.bin + x.idx it is
// x.lossmask:
//   8 bytes "STRLMASK" · u64 version 1 · u64 token count N (the pair's tokens) · N bytes, one per
//   token in the order of the .bin's sequences: 1 trained (the token is a target: the loss counts
//   the prediction of it from the tokens before), 0 not (prompts, system text, template markup).
// Little-endian, like the .idx. A pair without a .lossmask trains on every token.
#pragma once

#include <cstdint>
#include <string>

#include "strata/data/file_io.h"
#include "strata/data/mapped_token_dataset.h"

namespace strata::data {

inline constexpr char kLossMaskMagic[8] = {'S', 'T', 'R', 'L', 'M', 'A', 'S', 'K'};
constexpr int64_t kLossMaskHeaderBytes = 24;

// Reads prefix.lossmask, when it exists, as the mask of the ntok tokens the pair added to `ds`
// from token `first`. InputError naming the file when it is not a loss mask of those tokens.
void add_loss_mask(MappedTokenDataset& ds, const std::string& prefix, int64_t first, int64_t ntok);

// Streams a mask into prefix.lossmask, committed atomically like the pair it goes with.
class LossMaskWriter {
 public:
  explicit LossMaskWriter(const std::string& prefix);
  void append(const uint8_t* mask, int64_t n);
  int64_t num_tokens() const { return tokens_; }
  void commit();

 private:
  AtomicFileWriter file_;
  int64_t tokens_ = 0;
};

}  // namespace strata::data
