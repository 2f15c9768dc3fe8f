// `strata data inspect`: what a token dataset holds, for a person to check before training.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata::data {

struct DatasetSummary {
  std::string format;      // "llmc", "megatron" or "llmc+megatron"
  std::string token_type;  // "uint16", "uint32", "int32", ... ("uint16+uint32" when mixed)
  int64_t tokens = 0;
  // Megatron: from the .idx. llm.c: the occurrences of `delimiter` (shards record no documents).
  int64_t documents = 0;
  std::optional<int32_t> delimiter;  // the id counted in llm.c shards
  int64_t max_id = -1;
  int64_t trained = -1;  // tokens a loss mask trains (data/loss_mask.h); -1 without a mask
};

// `delimiter`: the token that opens (or closes) each document; nullopt takes the first token of
// the first llm.c shard, which opens every document in llm.c's convention.
DatasetSummary summarize_dataset(const std::string& path, const std::string& format,
                                 std::optional<int32_t> delimiter);

}  // namespace strata::data
