#include "strata/data/megatron_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "strata/core/check.h"
#include "strata/data/loss_mask.h"

namespace strata::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSupportedCodes =
    "supported codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16";

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string hex_bytes(const uint8_t* p, int64_t n) {
  std::string s;
  char buf[4];
  for (int64_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", p[i]);
    s += buf;
  }
  return s;
}

}  // namespace

bool has_megatron_magic(const uint8_t* data, int64_t size) {
  return size >= 9 && std::memcmp(data, kMegatronMagic, 9) == 0;
}

std::optional<TokenType> megatron_token_type(int code) {
  switch (code) {
    case 1:
      return TokenType::U8;
    case 2:
      return TokenType::I8;
    case 3:
      return TokenType::I16;
    case 4:
      return TokenType::I32;
    case 5:
      return TokenType::I64;
    case 8:
      return TokenType::U16;
    default:
      return std::nullopt;
  }
}

int megatron_dtype_code(TokenType t) {
  switch (t) {
    case TokenType::U8:
      return 1;
    case TokenType::I8:
      return 2;
    case TokenType::I16:
      return 3;
    case TokenType::I32:
      return 4;
    case TokenType::I64:
      return 5;
    case TokenType::U16:
      return 8;
    case TokenType::U32:
      break;
  }
  STRATA_FAIL("uint32 has no Megatron dtype code");
}

TokenType megatron_token_type_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenType::U16 : TokenType::I32;
}

void add_megatron_dataset(MappedTokenDataset& ds, const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const bool has_idx = fs::exists(idx_path), has_bin = fs::exists(bin_path);
  if (!has_idx || !has_bin) {
    const std::string missing =
        !has_idx && !has_bin ? bin_path + " and " + idx_path : (has_idx ? bin_path : idx_path);
    STRATA_INPUT_FAIL("Megatron dataset ", prefix, ": ", missing, " missing",
                      has_idx || has_bin ? " (found " + (has_idx ? idx_path : bin_path) + ")" : "",
                      "; a Megatron dataset is prefix.bin plus prefix.idx, as written by ",
                      "Megatron's preprocess_data.py or strata data prepare --format megatron");
  }
  MappedFile idx(idx_path);
  const uint8_t* p = idx.data();
  const int64_t size = idx.size();
  STRATA_INPUT_CHECK(size > 0, idx_path, ": the file is empty (0 bytes); re-create the index");
  STRATA_INPUT_CHECK(size >= kMegatronHeaderBytes, idx_path, ": file size ", size,
                     " is smaller than the ", kMegatronHeaderBytes,
                     "-byte Megatron index header; the file is truncated");
  STRATA_INPUT_CHECK(has_megatron_magic(p, size), idx_path, ": bad magic 0x", hex_bytes(p, 9),
                     ", expected \"MMIDIDX\\x00\\x00\"; this is not a Megatron .idx file");
  const uint64_t version = load<uint64_t>(p + 9);
  STRATA_INPUT_CHECK(version == 1, idx_path, ": unsupported Megatron index version ", version,
                     ", expected 1; re-create it with Megatron's preprocess_data.py");
  const int code = p[17];
  const std::optional<TokenType> type = megatron_token_type(code);
  if (!type) {
    if (code == 6 || code == 7) {
      STRATA_INPUT_FAIL(idx_path, ": unsupported dtype code ", code, " (",
                        code == 6 ? "float64" : "float32", "): token ids must be integers (",
                        kSupportedCodes, "); this is not a token dataset");
    }
    STRATA_INPUT_FAIL(idx_path, ": unknown dtype code ", code, " (", kSupportedCodes,
                      "); the index is corrupt");
  }
  const int64_t width = token_type_size(*type);
  const uint64_t seqs = load<uint64_t>(p + 18), docs = load<uint64_t>(p + 26);
  STRATA_INPUT_CHECK(seqs <= uint64_t(size) && docs <= uint64_t(size), idx_path,
                     ": the header claims ", seqs, " sequences and ", docs,
                     " documents, more than a file of ", size,
                     " bytes can hold; the index is corrupt. Re-create it");
  const uint64_t expected = uint64_t(kMegatronHeaderBytes) + 12 * seqs + 8 * docs;
  STRATA_INPUT_CHECK(uint64_t(size) == expected || uint64_t(size) == expected + seqs, idx_path,
                     ": file size ", size, " does not match header: ", kMegatronHeaderBytes, " + ",
                     seqs, " sequences × 12 bytes + ", docs, " documents × 8 bytes = ", expected,
                     "; the index is truncated or corrupt. Re-create it");
  const uint8_t* sizes = p + kMegatronHeaderBytes;
  const uint8_t* pointers = sizes + 4 * seqs;
  const uint8_t* doc_idx = pointers + 8 * seqs;
  int64_t prev_doc = 0;
  for (uint64_t d = 0; d < docs; ++d) {
    const int64_t v = load<int64_t>(doc_idx + 8 * d);
    STRATA_INPUT_CHECK(v >= prev_doc && v <= int64_t(seqs), idx_path, ": document index ", d,
                       " is ", v, ", outside [", prev_doc, ", ", seqs,
                       "] (it must rise from 0 to the sequence count); the index is corrupt");
    prev_doc = v;
  }

  MappedFile bin(bin_path);
  const int64_t bin_size = bin.size();
  const int bin_index = ds.add_file(std::move(bin));
  int64_t tokens = 0;
  for (uint64_t s = 0; s < seqs; ++s) {
    const int64_t n = load<int32_t>(sizes + 4 * s);
    const int64_t ptr = load<int64_t>(pointers + 8 * s);
    STRATA_INPUT_CHECK(n >= 0, idx_path, ": sequence ", s, " has negative length ", n,
                       "; the index is corrupt");
    STRATA_INPUT_CHECK(ptr >= 0 && ptr % width == 0, idx_path, ": sequence ", s,
                       " has byte pointer ", ptr, ", which is not a non-negative multiple of the ",
                       width, "-byte ", token_type_name(*type), " token; the index is corrupt");
    STRATA_INPUT_CHECK(ptr <= bin_size && n * width <= bin_size - ptr, idx_path, ": sequence ", s,
                       " spans bytes [", ptr, ", ", ptr + n * width, ") but ", bin_path, " has ",
                       bin_size, " bytes; the .bin is truncated or does not belong to this .idx");
    ds.start_document();
    ds.add_segment(bin_index, ptr, n, *type);
    tokens += n;
  }
  add_loss_mask(ds, prefix, ds.num_tokens() - tokens, tokens);
  ds.note_part({"megatron", *type, tokens, docs > 0 ? int64_t(docs) - 1 : 0});
}

MegatronWriter::MegatronWriter(const std::string& prefix, TokenType type)
    : prefix_(prefix), bin_(prefix + ".bin"), type_(type) {
  STRATA_CHECK(type == TokenType::U16 || type == TokenType::I32,
               "MegatronWriter writes uint16 or int32, not ", token_type_name(type));
}

void MegatronWriter::append(const int32_t* tokens, int64_t n) {
  if (!doc_open_) {
    doc_start_ = bin_.bytes_written();
    doc_tokens_ = 0;
    doc_open_ = true;
  }
  STRATA_INPUT_CHECK(doc_tokens_ + n <= std::numeric_limits<int32_t>::max(), prefix_,
                     ".idx: a document of more than 2^31-1 tokens exceeds Megatron's int32 "
                     "sequence length; split it into several documents");
  const int32_t limit = type_ == TokenType::U16 ? 65535 : std::numeric_limits<int32_t>::max();
  const size_t width = size_t(token_type_size(type_));
  staging_.resize(size_t(n) * width);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    STRATA_INPUT_CHECK(t >= 0 && t <= limit, prefix_, ".bin: token id ", t, " does not fit ",
                       token_type_name(type_), "; ids must be in [0, ", limit, "]");
    if (type_ == TokenType::U16) {
      const uint16_t v = uint16_t(t);
      std::memcpy(&staging_[size_t(i) * 2], &v, 2);
    } else {
      std::memcpy(&staging_[size_t(i) * 4], &t, 4);
    }
  }
  bin_.write(staging_.data(), staging_.size());
  doc_tokens_ += n;
  num_tokens_ += n;
}

void MegatronWriter::end_document() {
  if (!doc_open_) append(nullptr, 0);  // an empty document
  pointers_.push_back(doc_start_);
  sizes_.push_back(int32_t(doc_tokens_));
  doc_open_ = false;
}

void MegatronWriter::commit() {
  if (doc_open_) end_document();
  AtomicFileWriter idx(prefix_ + ".idx");
  const uint64_t version = 1, seqs = sizes_.size(), docs = sizes_.size() + 1;
  const uint8_t code = uint8_t(megatron_dtype_code(type_));
  idx.write(kMegatronMagic, 9);
  idx.write(&version, 8);
  idx.write(&code, 1);
  idx.write(&seqs, 8);
  idx.write(&docs, 8);
  idx.write(sizes_.data(), sizes_.size() * 4);
  idx.write(pointers_.data(), pointers_.size() * 8);
  for (uint64_t d = 0; d < docs; ++d) {
    const int64_t v = int64_t(d);
    idx.write(&v, 8);
  }
  ::unlink(idx.path().c_str());
  // A loss mask of an earlier dataset under this prefix must not pair with the new tokens; a new
  // one (LossMaskWriter) is committed after the pair.
  ::unlink((prefix_ + ".lossmask").c_str());
  bin_.commit();
  idx.commit();
}

void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& documents,
                            int64_t vocab_size) {
  if (vocab_size <= 0) {
    int64_t mx = -1;
    for (const auto& doc : documents)
      for (int32_t t : doc) mx = std::max<int64_t>(mx, t);
    vocab_size = mx + 1;
  }
  MegatronWriter w(prefix, megatron_token_type_for_vocab(vocab_size));
  for (const auto& doc : documents) w.add_document(doc.data(), int64_t(doc.size()));
  w.commit();
}

}  // namespace strata::data
