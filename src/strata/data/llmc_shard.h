// llm.c token shards (karpathy/llm.c dev/data/data_common.py): a header of 256 int32 —
// [0] magic, [1] version, [2] token count — then the tokens, little-endian.
//   GPT-2:   magic 20240520, version 1, uint16 tokens.
//   Llama-3: magic 20240801, version 7, uint32 tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/data/file_io.h"
#include "strata/data/mapped_token_dataset.h"

namespace strata::data {

constexpr int32_t kLlmcMagicU16 = 20240520;
constexpr int32_t kLlmcVersionU16 = 1;
constexpr int32_t kLlmcMagicU32 = 20240801;
constexpr int32_t kLlmcVersionU32 = 7;
constexpr int64_t kLlmcHeaderBytes = 1024;

inline bool is_llmc_magic(int32_t magic) {
  return magic == kLlmcMagicU16 || magic == kLlmcMagicU32;
}

// Checks the header and size of the shard at `path` and appends its tokens to `ds`.
void add_llmc_shard(MappedTokenDataset& ds, const std::string& path);

// Streams tokens into a shard; the header's count is written at commit(). Throws InputError for
// an id that does not fit the token type, or more than 2^31-1 tokens (llm.c's limit).
class LlmcShardWriter {
 public:
  LlmcShardWriter(const std::string& path, bool uint32);
  void append(const int32_t* tokens, int64_t n);
  int64_t num_tokens() const { return ntok_; }
  void commit();

 private:
  AtomicFileWriter out_;
  bool uint32_;
  int64_t ntok_ = 0;
  std::vector<uint8_t> staging_;
};

// Writes one shard: uint32 tokens (Llama-3 layout) or uint16 (GPT-2 layout).
void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens, bool uint32);

}  // namespace strata::data
