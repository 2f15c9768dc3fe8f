// The one concrete TokenDataset: a list of segments, each a run of fixed-width integer tokens
// inside an mmapped file. An llm.c shard is one segment; a Megatron dataset is one segment per
// run of contiguous sequences. Readers of each format append their files and segments here.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "strata/data/file_io.h"
#include "strata/data/token_dataset.h"

namespace strata::data {

enum class TokenType : uint8_t { U8, I8, I16, U16, I32, U32, I64 };

int token_type_size(TokenType t);
const char* token_type_name(TokenType t);  // "uint8", "int16", ...

class MappedTokenDataset final : public TokenDataset {
 public:
  explicit MappedTokenDataset(std::string source);

  // Takes ownership of a mapped file; returns its index for add_segment.
  int add_file(MappedFile file);
  // ntok tokens of type `type` at byte `offset` of file `file_index`, appended to the sequence.
  // The caller has checked the range lies inside the file and is aligned to the token size.
  void add_segment(int file_index, int64_t offset, int64_t ntok, TokenType type);
  // Call once after the last add_segment: rejects an empty dataset, and scans ids when small.
  void finalize();

  int64_t num_tokens() const override { return num_tokens_; }
  void read(int64_t begin, int64_t count, int32_t* out) const override;
  int64_t vocab_bound() const override;
  const std::string& source() const override { return source_; }

  const std::vector<MappedFile>& files() const { return files_; }

  // The next document starts at the current end of the sequence (before its add_segment).
  void start_document() {
    if (doc_starts_.empty() || doc_starts_.back() < num_tokens_) doc_starts_.push_back(num_tokens_);
  }
  // The loss mask of the tokens added since `first_token`: one byte per token at byte `offset`
  // of mapped file `file_index` (data/loss_mask.h). Tokens no part gives a mask for are trained.
  void add_mask(int file_index, int64_t offset, int64_t first_token, int64_t ntok);
  const std::vector<int64_t>& document_starts() const override { return doc_starts_; }
  bool has_loss_mask() const override { return !masks_.empty(); }
  void read_mask(int64_t begin, int64_t count, uint8_t* out) const override;

  // What `strata data inspect` reports, noted by the format readers: per part (an llm.c shard or
  // a Megatron prefix) its format, token type and, for Megatron, the documents its index lists
  // (-1 for llm.c, whose shards record no documents).
  struct Part {
    std::string format;
    TokenType type;
    int64_t tokens;
    int64_t documents;
  };
  void note_part(Part part) { parts_.push_back(std::move(part)); }
  const std::vector<Part>& parts() const { return parts_; }

 private:
  struct Segment {
    const uint8_t* data;
    int64_t ntok;
    int64_t first;        // index of its first token in the dataset
    int64_t file_offset;  // byte offset of its first token in the file
    int file;
    TokenType type;
  };
  void read_segment(const Segment& s, int64_t begin, int64_t count, int32_t* out) const;
  void scan() const;

  std::string source_;
  std::vector<MappedFile> files_;
  std::vector<Segment> segments_;
  std::vector<Part> parts_;
  std::vector<int64_t> doc_starts_;
  struct MaskRun {
    const uint8_t* data;
    int64_t first, ntok;  // tokens [first, first+ntok) of the dataset
  };
  std::vector<MaskRun> masks_;  // ascending, not overlapping
  int64_t num_tokens_ = 0;
  mutable std::once_flag scanned_;
  mutable int64_t vocab_bound_ = 0;
};

}  // namespace strata::data
