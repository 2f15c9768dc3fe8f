// Shared helpers for the data tests: a fresh temp directory per test, raw file writers for
// malformed inputs, an in-memory TokenDataset, and an InputError matcher.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/token_dataset.h"
#include "tests/temp_dir_test.h"

namespace strata::data::test_util {

namespace fs = std::filesystem;

using TempDirTest = strata::test::TempDirTest;

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
void append_le(std::vector<uint8_t>& bytes, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  bytes.insert(bytes.end(), b, b + sizeof(T));
}

template <typename T>
void patch_le(std::vector<uint8_t>& bytes, size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// An llm.c header (magic, version, ntok) followed by `payload_bytes` zero bytes.
inline std::vector<uint8_t> llmc_bytes(int32_t magic, int32_t version, int32_t ntok,
                                       size_t payload_bytes) {
  std::vector<uint8_t> bytes(1024 + payload_bytes, 0);
  patch_le(bytes, 0, magic);
  patch_le(bytes, 4, version);
  patch_le(bytes, 8, ntok);
  return bytes;
}

inline std::vector<int32_t> read_all(const TokenDataset& ds) {
  std::vector<int32_t> out(size_t(ds.num_tokens()));
  ds.read(0, ds.num_tokens(), out.data());
  return out;
}

// Runs f and expects an InputError whose message contains every one of `parts`.
template <typename F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected strata::InputError";
  } catch (const strata::InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
    }
  }
}

class VectorDataset final : public TokenDataset {
 public:
  explicit VectorDataset(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t num_tokens() const override { return int64_t(tokens_.size()); }
  void read(int64_t begin, int64_t count, int32_t* out) const override {
    std::memcpy(out, tokens_.data() + begin, size_t(count) * sizeof(int32_t));
  }
  int64_t vocab_bound() const override {
    int64_t mx = -1;
    for (int32_t t : tokens_) mx = std::max<int64_t>(mx, t);
    return mx + 1;
  }
  const std::string& source() const override { return source_; }

 private:
  std::vector<int32_t> tokens_;
  std::string source_ = "in-memory";
};

}  // namespace strata::data::test_util
