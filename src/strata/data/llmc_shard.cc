#include "strata/data/llmc_shard.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "strata/core/check.h"

namespace strata::data {

void add_llmc_shard(MappedTokenDataset& ds, const std::string& path) {
  MappedFile file(path);
  const int64_t size = file.size();
  STRATA_INPUT_CHECK(size > 0, path, ": the file is empty (0 bytes); an llm.c shard is a ",
                     kLlmcHeaderBytes, "-byte header followed by its tokens. Re-create it ",
                     "(strata data prepare) or remove it from the dataset");
  // The magic comes first: a file too short for a header is more often not a shard at all.
  int32_t magic = 0;
  std::memcpy(&magic, file.data(), std::min<int64_t>(size, 4));
  if (size < 4 || !is_llmc_magic(magic)) {
    const bool bin = path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
    STRATA_INPUT_FAIL(path, ": bad magic ", magic, ", expected ", kLlmcMagicU16,
                      " (llm.c uint16) or ", kLlmcMagicU32, " (llm.c uint32); this is not an ",
                      "llm.c shard",
                      bin ? "; if it is a Megatron .bin, its index " +
                                path.substr(0, path.size() - 4) + ".idx is missing"
                          : "");
  }
  STRATA_INPUT_CHECK(size >= kLlmcHeaderBytes, path, ": file size ", size, " is smaller than the ",
                     kLlmcHeaderBytes,
                     "-byte llm.c header; the file is truncated or not an llm.c shard");
  int32_t header[3];
  std::memcpy(header, file.data(), sizeof(header));
  const int32_t version = header[1], ntok = header[2];
  const bool u32 = magic == kLlmcMagicU32;
  const int32_t want = u32 ? kLlmcVersionU32 : kLlmcVersionU16;
  STRATA_INPUT_CHECK(version == want, path, ": unsupported version ", version, " for magic ", magic,
                     " (llm.c ", u32 ? "uint32" : "uint16", "), expected version ", want,
                     "; re-create the shard with llm.c's data scripts or strata data prepare");
  STRATA_INPUT_CHECK(ntok >= 0, path, ": header token count ", ntok,
                     " is negative; the header is corrupt");
  const int64_t width = u32 ? 4 : 2;
  const int64_t expected = kLlmcHeaderBytes + int64_t(ntok) * width;
  STRATA_INPUT_CHECK(size == expected, path, ": file size ", size,
                     " does not match header: ", kLlmcHeaderBytes, " + ", ntok, " tokens × ", width,
                     " bytes = ", expected,
                     "; the file is truncated or not an llm.c shard. Re-create it");
  int index = ds.add_file(std::move(file));
  ds.add_segment(index, kLlmcHeaderBytes, ntok, u32 ? TokenType::U32 : TokenType::U16);
  ds.note_part({"llmc", u32 ? TokenType::U32 : TokenType::U16, ntok, -1});
}

LlmcShardWriter::LlmcShardWriter(const std::string& path, bool uint32)
    : out_(path), uint32_(uint32) {
  int32_t header[256] = {};
  out_.write(header, sizeof(header));
}

void LlmcShardWriter::append(const int32_t* tokens, int64_t n) {
  STRATA_INPUT_CHECK(ntok_ + n <= std::numeric_limits<int32_t>::max(), out_.path(),
                     ": an llm.c shard holds at most 2^31-1 tokens; split the data into several "
                     "shards or use the Megatron format");
  const int32_t limit = uint32_ ? std::numeric_limits<int32_t>::max() : 65535;
  const size_t width = uint32_ ? 4 : 2;
  staging_.resize(size_t(n) * width);
  for (int64_t i = 0; i < n; ++i) {
    int32_t t = tokens[i];
    STRATA_INPUT_CHECK(t >= 0 && t <= limit, out_.path(), ": token id ", t,
                       " does not fit an llm.c ", uint32_ ? "uint32" : "uint16",
                       " shard; ids must be in [0, ", limit, "]",
                       uint32_ ? "" : " (write a uint32 shard for larger vocabularies)");
    if (uint32_) {
      uint32_t v = uint32_t(t);
      std::memcpy(&staging_[size_t(i) * 4], &v, 4);
    } else {
      uint16_t v = uint16_t(t);
      std::memcpy(&staging_[size_t(i) * 2], &v, 2);
    }
  }
  out_.write(staging_.data(), staging_.size());
  ntok_ += n;
}

void LlmcShardWriter::commit() {
  int32_t header[3] = {uint32_ ? kLlmcMagicU32 : kLlmcMagicU16,
                       uint32_ ? kLlmcVersionU32 : kLlmcVersionU16, int32_t(ntok_)};
  out_.write_at(0, header, sizeof(header));
  out_.commit();
}

void write_llmc_shard(const std::string& path, const std::vector<int32_t>& tokens, bool uint32) {
  LlmcShardWriter w(path, uint32);
  w.append(tokens.data(), int64_t(tokens.size()));
  w.commit();
}

}  // namespace strata::data
