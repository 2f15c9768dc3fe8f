#include "strata/data/tokenizer.h"

namespace strata::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode_append(text, ids);
  return ids;
}

void ByteTokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  const size_t n = out.size();
  out.resize(n + text.size());
  for (size_t i = 0; i < text.size(); ++i) out[n + i] = int32_t(static_cast<uint8_t>(text[i]));
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      text.push_back(char(uint8_t(id)));
    } else if (id == kEot) {
      text += kEotText;
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

}  // namespace strata::data
