#include "strata/data/tokenizer.h"

#include <gtest/gtest.h>

namespace strata::data {
namespace {

TEST(ByteTokenizerTest, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(ByteTokenizerTest, Utf8IsEncodedByteByByte) {
  const std::string text =
      "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82";  // héllo 世界 🙂
  ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xC3);
  EXPECT_EQ(ids[2], 0xA9);
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteTokenizerTest, EndOfTextAndOutOfRangeIds) {
  ByteTokenizer tok;
  EXPECT_EQ(ByteTokenizer::kVocabSize, 257);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', ByteTokenizer::kEot, 'b'}), "a<|endoftext|>b");
  // The special text is plain bytes when encoded: only the data pipeline inserts kEot.
  EXPECT_EQ(tok.encode("<|endoftext|>").size(), 13u);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'x', 300, -1}), "x\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizerTest, EncodeAppendKeepsWhatWasThere) {
  ByteTokenizer tok;
  std::vector<int32_t> ids = {ByteTokenizer::kEot};
  tok.encode_append("ab", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 'a', 'b'}));
}

}  // namespace
}  // namespace strata::data
