// A training corpus as one read-only sequence of token ids, whatever files hold it.
//
// open_dataset() accepts, for `path`:
//   - one llm.c shard (.bin with a 1024-byte header);
//   - a glob pattern ("data/fineweb_train_*.bin"): the matches, sorted by name, concatenated;
//   - a directory: its *.bin files (not recursive), sorted by name, concatenated; a .bin with an
//     .idx beside it is a Megatron pair, any other .bin an llm.c shard;
//   - a Megatron prefix "x" meaning x.bin + x.idx, or either of "x.bin" / "x.idx" directly.
// format "auto" tells llm.c from Megatron by magic; "llmc" or "megatron" insists on one.
// Every file is mmapped read-only. A Megatron dataset is the concatenation of its sequences in
// index order. Anything wrong with the files throws InputError naming the file and the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace strata::data {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;

  virtual int64_t num_tokens() const = 0;
  // out[0..count) = tokens [begin, begin+count); the range may cross shard and document
  // boundaries. Thread-safe.
  virtual void read(int64_t begin, int64_t count, int32_t* out) const = 0;
  // Largest token id + 1. Datasets up to 1 GiB of token data are scanned once when opened (which
  // also rejects negative ids early); larger ones are scanned, in parallel, on the first call.
  virtual int64_t vocab_bound() const = 0;
  // What the user asked for (the path as given), for messages.
  virtual const std::string& source() const = 0;
};

// format: "auto" | "llmc" | "megatron".
std::unique_ptr<TokenDataset> open_dataset(const std::string& path,
                                           const std::string& format = "auto");

}  // namespace strata::data
