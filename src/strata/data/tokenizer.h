// The built-in tokenizer: one token per byte (ids 0..255) plus an end-of-text token, id 256.
// Vocabulary 257; a model may have a larger vocab, whose extra ids this tokenizer never emits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data {

class ByteTokenizer {
 public:
  static constexpr int32_t kEot = 256;
  static constexpr int32_t kVocabSize = 257;
  static constexpr std::string_view kEotText = "<|endoftext|>";

  // Every byte of `text` becomes its own id; the text "<|endoftext|>" is not special here.
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `out`.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // Ids back to bytes; kEot renders as "<|endoftext|>" and any id outside [0, 257) (a model with
  // a larger vocab may sample one) as U+FFFD, the Unicode replacement character.
  std::string decode(std::span<const int32_t> ids) const;
};

}  // namespace strata::data
