// The BPE `model` of a tokenizer.json and its encoder, as `tokenizers`' BPE::merge_word: a word's
// first symbols are its bytes (byte-level tokenizers: GPT-2, Llama-3, Qwen2, SmolLM2) or its
// Unicode characters (SentencePiece-style ones: Llama-2, Mistral, Phi-3, Gemma); a symbol not in
// the vocabulary becomes <0xXX> tokens (byte_fallback) or unk (fused with fuse_unk) or nothing;
// then merges apply lowest rank first, leftmost first among equal ranks, through a heap over
// adjacent pairs and a linked list of symbols: O(n log n) in the word's length, so that a segment
// without pre-tokenizer (a whole document) is no slower per byte than a short word.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/data/hf_support.h"

namespace strata::data::hf {

// BPE merges: open addressing on the pair of ids.
class MergeTable {
 public:
  struct Value {
    int32_t rank, new_id;
  };
  void reserve(size_t n);
  // A later merge of the same pair replaces the earlier, as in `tokenizers`' map.
  void insert(int32_t a, int32_t b, Value v);
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & (keys_.size() - 1);
  }
  std::vector<uint64_t> keys_{kEmpty};
  std::vector<Value> values_{Value{}};
};

struct Bpe {
  StringMap vocab;  // model.vocab as written in the file
  MergeTable merges;
  int32_t unk_id = -1;
  bool fuse_unk = false, ignore_merges = false, byte_fallback = false;
  bool byte_level = false;  // symbols are bytes (the pre-tokenizer ends in ByteLevel)
  int64_t vocab_size = 0;   // largest id + 1

  // Byte-level: the one-byte symbols, by byte; -1 where the vocabulary lacks the byte's character.
  std::array<int32_t, 256> byte_id{};
  StringMap vocab_bytes;  // entries by the bytes they stand for (ignore_merges)
  // Character-level: the one-character entries, by code point.
  std::array<int32_t, 128> ascii_id{};
  std::unordered_map<uint32_t, int32_t> char_id;
  // byte_fallback: the <0xXX> token of each byte; -1 where absent.
  std::array<int32_t, 256> byte_token{};

  // Reads root["model"]; `byte_level` from the pre-tokenizer. `owner` receives the token of each
  // id, for the added tokens' checks.
  void read(const Reader& r, const json& root, bool byte_level,
            std::unordered_map<int32_t, std::string_view>& owner);
};

// Per-thread encoding state, with a cache of the ids of short words.
class BpeRun {
 public:
  explicit BpeRun(const Bpe& bpe) : bpe_(bpe) {}
  // Appends the ids of a non-empty word.
  void encode(std::string_view word, std::vector<int32_t>& out);

 private:
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  void merge_word(std::string_view word, std::vector<int32_t>& out);
  void push_symbol(int32_t id);
  // A symbol found in the vocabulary (`id`) or not (-1, with the bytes it stands for).
  void add_symbol(int32_t id, std::string_view bytes);

  const Bpe& bpe_;
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
  bool unk_pending_ = false;
  // Word -> a span of arena_; words of 256 bytes or more are not cached, as in `tokenizers`.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>
      cache_;
  std::vector<int32_t> arena_;
};

}  // namespace strata::data::hf
