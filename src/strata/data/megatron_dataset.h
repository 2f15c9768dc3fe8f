// Megatron-LM indexed datasets (megatron/core/datasets/indexed_dataset.py): a prefix "x" names
// x.bin (token arrays back to back, no header) and x.idx:
//   9 bytes "MMIDIDX\0\0" · u64 version 1 · u8 dtype code · u64 sequence_count S ·
//   u64 document_count D · int32 sizes[S] (tokens) · int64 pointers[S] (bytes into .bin) ·
//   int64 doc_idx[D] · optional int8 modes[S] (multimodal).
// For training, the dataset is the concatenation of the S sequences in index order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/data/file_io.h"
#include "strata/data/mapped_token_dataset.h"

namespace strata::data {

inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kMegatronHeaderBytes = 34;

bool has_megatron_magic(const uint8_t* data, int64_t size);
// The integer token type of a Megatron dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 8 u16);
// nullopt for the float codes 6, 7 and unknown codes.
std::optional<TokenType> megatron_token_type(int code);
int megatron_dtype_code(TokenType t);
// What Megatron's writers pick: uint16 when the vocabulary is below 65,500, else int32.
TokenType megatron_token_type_for_vocab(int64_t vocab_size);

// Checks prefix.idx against prefix.bin and appends the sequences to `ds`.
void add_megatron_dataset(MappedTokenDataset& ds, const std::string& prefix);

// Streams documents (one sequence each) into prefix.bin and prefix.idx. commit() renames both
// into place, removing a stale prefix.idx first so a crash never pairs a new .bin with an old .idx.
class MegatronWriter {
 public:
  MegatronWriter(const std::string& prefix, TokenType type);  // TokenType::U16 or I32
  // A document may arrive in pieces: append() any number of times, then end_document().
  void append(const int32_t* tokens, int64_t n);
  void end_document();
  void add_document(const int32_t* tokens, int64_t n) { append(tokens, n), end_document(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return int64_t(sizes_.size()); }
  void commit();  // ends an open document first

 private:
  std::string prefix_;
  AtomicFileWriter bin_;
  TokenType type_;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<uint8_t> staging_;
  int64_t num_tokens_ = 0;
  int64_t doc_start_ = 0;  // byte offset in .bin where the open document began
  int64_t doc_tokens_ = 0;
  bool doc_open_ = false;
};

// vocab_size <= 0: taken as the largest id + 1. The token type follows
// megatron_token_type_for_vocab.
void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& documents,
                            int64_t vocab_size = 0);

}  // namespace strata::data
