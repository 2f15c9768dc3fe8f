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
#include <vector>

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

  // Where each document starts, as token indices (ascending, the first 0), when the files record
  // documents: a Megatron index's sequences, each one document. Empty when they do not (llm.c
  // shards): the data is then one stream.
  virtual const std::vector<int64_t>& document_starts() const {
    static const std::vector<int64_t> none;
    return none;
  }
  // The loss mask (data/loss_mask.h: x.lossmask beside a Megatron pair x, written by `data
  // prepare --jsonl`): out[0..count) = 1 for each of tokens [begin, begin+count) that is trained
  // as a target, 0 for one that is not. has_loss_mask() false: every token is trained.
  virtual bool has_loss_mask() const { return false; }
  virtual void read_mask(int64_t begin, int64_t count, uint8_t* out) const;
};

// format: "auto" | "llmc" | "megatron".
std::unique_ptr<TokenDataset> open_dataset(const std::string& path,
                                           const std::string& format = "auto");

// Which split a file's name says it holds: a name (without directory and extension) with the
// word "val", "valid" or "validation" in it (words: runs of letters and digits) is validation,
// one with the word "train" training, any other neither. llm.c names shards
// fineweb_train_000001.bin / fineweb_val_000000.bin; `data prepare` writes train.bin + val.bin or
// PREFIX_train.bin + PREFIX_val.bin (Megatron: .bin/.idx pairs).
enum class Split { None, Train, Val };
Split split_of(const std::string& file);

// The training and the held-out validation data of a run (data.path, data.val_path).
//   - path a directory whose files are named as splits: training reads its train files (those
//     named neither as train nor as val when none is named train), validation its val files;
//     files of neither split beside train files are ignored (listed). A directory without split
//     names is all training data, as open_dataset reads it.
//   - any other path (file, glob pattern, prefix) is the training data; when val_path is empty and
//     its last path component has the word "train", the same path with that word as "val"
//     (data/corpus_train.bin -> data/corpus_val.bin, fineweb_train_*.bin -> fineweb_val_*.bin,
//     DIR/train -> DIR/val) is the validation data if it exists.
//   - val_path, when given, is the validation data (a directory of splits: its val files).
// val is nullptr when there is no validation data. The file lists are for the log.
struct DataSplits {
  std::unique_ptr<TokenDataset> train, val;
  std::vector<std::string> train_files, val_files, ignored_files;
  std::string
      val_origin;  // "data.val_path", "the val files of data.path", "found beside data.path"
};
DataSplits open_splits(const std::string& path, const std::string& val_path,
                       const std::string& format = "auto");

}  // namespace strata::data
