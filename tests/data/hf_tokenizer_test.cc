// The tokenizer.json reader and encoder on small tokenizers built here, whose ids follow by hand
// from `tokenizers`' rules; the peer comparison on a large corpus is tokenizer_peer_test.sh.
#include "strata/data/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "hf_test_tokenizer.h"

namespace strata::data {
namespace {

using nlohmann::json;
using test_util::Builder;
using test_util::expect_input_error;

std::vector<int32_t> encode(const HfTokenizer& tok, std::string_view text) {
  HfTokenizer::Session s(tok);
  std::vector<int32_t> ids;
  s.encode_append(text, ids);
  return ids;
}

TEST(HfTokenizerTest, MergesByRankAndLeftmostFirst) {
  Builder b;
  const int th = b.merge("t", "h");
  const int the = b.merge("th", "e");
  const int sp_c = b.merge("Ġ", "c");
  const int aa = b.merge("a", "a");
  const auto tok = b.tokenizer();
  // "the" merges fully; " cat" is its own pre-token (GPT-2's " ?\p{L}+"), " c" merges, "at" not.
  EXPECT_EQ(encode(*tok, "the cat"), (std::vector<int32_t>{the, sp_c, 'a', 't'}));
  EXPECT_EQ(encode(*tok, "th"), (std::vector<int32_t>{th}));
  // Equal ranks: the leftmost pair first.
  EXPECT_EQ(encode(*tok, "aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok->vocab_size(), 260);
}

TEST(HfTokenizerTest, Gpt2PatternSplitsContractionsDigitsAndSpaces) {
  Builder b;
  const int sp_sp = b.merge("Ġ", "Ġ");
  const auto tok = b.tokenizer();
  // "'s" is a pre-token; "  x" is "Ġ" + "Ġx" (\s+(?!\S) leaves the last space to the word).
  EXPECT_EQ(encode(*tok, "it's"), (std::vector<int32_t>{'i', 't', '\'', 's'}));
  EXPECT_EQ(encode(*tok, "   x"), (std::vector<int32_t>{sp_sp, ' ', 'x'}));
}

TEST(HfTokenizerTest, SpacesAreUnicodeWhiteSpaceAsInOniguruma) {
  // U+180E is no White_Space (Unicode 6.3): after a combining mark it stays in the same
  // pre-token (" ?[^\s\p{L}\p{N}]+"), so a merge across the two characters applies.
  Builder b;
  const int across = b.merge(test_util::byte_char(0xA8), test_util::byte_char(0xE1));
  const auto tok = b.tokenizer();
  EXPECT_EQ(encode(*tok, "\xcc\xa8\xe1\xa0\x8e"), (std::vector<int32_t>{0xCC, across, 0xA0, 0x8E}));
  // U+3000 is White_Space: its own pre-token, no merge into it.
  const int sp = b.merge(test_util::byte_char(0xA8), test_util::byte_char(0xE3));
  EXPECT_EQ(encode(*b.tokenizer(), "\xcc\xa8\xe3\x80\x80").size(), 5u) << sp;
}

TEST(HfTokenizerTest, MergePairFormEqualsStringForm) {
  Builder a;
  a.merge("h", "i");
  Builder p = a;
  p.merges = json::array({json::array({"h", "i"})});
  EXPECT_EQ(encode(*a.tokenizer(), "hi hi"), encode(*p.tokenizer(), "hi hi"));
}

TEST(HfTokenizerTest, SpecialTokensMatchInTheText) {
  Builder b;
  const int eot = b.add("<|endoftext|>");
  const auto tok = b.tokenizer();
  EXPECT_EQ(encode(*tok, "a<|endoftext|>b"), (std::vector<int32_t>{'a', eot, 'b'}));
  // Leftmost-longest: "<|endoftext|" alone is plain text.
  EXPECT_EQ(encode(*tok, "<|endoftext|").size(), 12u);
}

TEST(HfTokenizerTest, AddedTokenFlags) {
  Builder b;
  const int mask = b.add("<mask>", true, {{"lstrip", true}, {"rstrip", true}});
  const int word = b.add("ab", false, {{"single_word", true}});
  const auto tok = b.tokenizer();
  // lstrip/rstrip swallow the spaces around the token.
  EXPECT_EQ(encode(*tok, "x <mask> y"), (std::vector<int32_t>{'x', mask, 'y'}));
  // single_word: inside a word it is plain text.
  EXPECT_EQ(encode(*tok, "xab"), (std::vector<int32_t>{'x', 'a', 'b'}));
  EXPECT_EQ(encode(*tok, "ab"), (std::vector<int32_t>{word}));
}

// The next added token may start in the spaces rstrip took: `tokenizers` finds matches on the
// text as it is, then widens them.
TEST(HfTokenizerTest, AddedTokenInsideTheSpacesRstripTook) {
  Builder b;
  const int mask = b.add("<mask>", true, {{"rstrip", true}});
  const int sp_x = b.add(" x", false, {{"normalized", false}});
  const auto tok = b.tokenizer();
  EXPECT_EQ(encode(*tok, "<mask> x"), (std::vector<int32_t>{mask, sp_x}));
  EXPECT_EQ(encode(*tok, "b<mask> xb"), (std::vector<int32_t>{'b', mask, sp_x, 'b'}));
}

TEST(HfTokenizerTest, AddPrefixSpace) {
  Builder b;
  b.pre["add_prefix_space"] = true;
  const int sp_h = b.merge("Ġ", "h");
  const auto tok = b.tokenizer();
  EXPECT_EQ(encode(*tok, "h"), (std::vector<int32_t>{sp_h}));
  EXPECT_EQ(encode(*tok, " h"), (std::vector<int32_t>{sp_h}));
}

TEST(HfTokenizerTest, Llama3StyleSplitByteLevelAndTemplate) {
  Builder b;
  b.pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+)"}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", true},
              {"use_regex", false}}}}};
  const int d12 = b.merge("1", "2");
  const int bos = b.add("<|begin_of_text|>");
  b.post = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const auto tok = b.tokenizer();
  EXPECT_EQ(tok->template_prefix(), (std::vector<int32_t>{bos}));
  EXPECT_TRUE(tok->template_suffix().empty());
  // Digits go in threes: "1234" is "123" + "4", and "12" merges only inside "123".
  EXPECT_EQ(encode(*tok, "1234"), (std::vector<int32_t>{d12, '3', '4'}));
}

// A String pattern is literal ("." is a dot), and Removed drops what it matches; the pieces
// around it are BPE'd apart. The expected ids are what tokenizers 0.23 gives for the same file.
TEST(HfTokenizerTest, SplitStringPatternRemoved) {
  Builder b;
  const int ab = b.merge("a", "b");
  b.pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"String", "."}}},
              {"behavior", "Removed"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const auto tok = b.tokenizer();
  EXPECT_EQ(encode(*tok, "a.b"), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(encode(*tok, "ab.x"), (std::vector<int32_t>{ab, 'x'}));
  EXPECT_EQ(encode(*tok, "axb"), (std::vector<int32_t>{'a', 'x', 'b'}));
}

TEST(HfTokenizerTest, IgnoreMergesTakesWholeWords) {
  Builder b;
  b.merge("a", "b");
  const int abc = int(b.vocab.size());
  b.vocab["abc"] = abc;  // reachable by no merge
  b.extra_model["ignore_merges"] = true;
  EXPECT_EQ(encode(*b.tokenizer(), "abc"), (std::vector<int32_t>{abc}));
  b.extra_model["ignore_merges"] = false;
  EXPECT_EQ(encode(*b.tokenizer(), "abc"), (std::vector<int32_t>{abc - 1, 'c'}));
}

// Bytes whose character is not in the vocabulary: byte_fallback's <0xXX> tokens (of the
// character's UTF-8 bytes, as tokenizers does for a byte-level word), else unk (fused with
// fuse_unk), else nothing. The expected ids are what tokenizers 0.23 gives for the same file.
TEST(HfTokenizerTest, ByteFallbackUnkAndFuseUnk) {
  Builder b;
  b.vocab.erase("z");
  b.vocab.erase(test_util::byte_char('\n'));
  b.vocab.erase("q");
  b.vocab["<0x7A>"] = 300;
  b.vocab["<0xC4>"] = 301;
  b.vocab["<0x8A>"] = 302;
  b.vocab["<unk>"] = 303;
  b.extra_model = {{"byte_fallback", true}, {"unk_token", "<unk>"}};
  EXPECT_EQ(encode(*b.tokenizer(), "az\n"), (std::vector<int32_t>{'a', 300, 301, 302}));
  EXPECT_EQ(encode(*b.tokenizer(), "aqqa"), (std::vector<int32_t>{'a', 303, 303, 'a'}));
  b.extra_model["fuse_unk"] = true;
  EXPECT_EQ(encode(*b.tokenizer(), "aqqa"), (std::vector<int32_t>{'a', 303, 'a'}));
  b.extra_model = {{"byte_fallback", true}};
  EXPECT_EQ(encode(*b.tokenizer(), "aqqa"), (std::vector<int32_t>{'a', 'a'}));
  b.extra_model = {{"unk_token", "<nope>"}};
  expect_input_error([&] { b.tokenizer(); }, {"model.unk_token", "<nope>", "not in model.vocab"});
}

TEST(HfTokenizerTest, FirstInvalidUtf8) {
  EXPECT_FALSE(first_invalid_utf8("plain ascii, ünïcödé, 日本語, 🙂"));
  EXPECT_EQ(first_invalid_utf8("abc\xff"), 3u);
  EXPECT_EQ(first_invalid_utf8("ab\xc3"), 2u);            // truncated
  EXPECT_EQ(first_invalid_utf8("\xc0\xaf"), 0u);          // overlong
  EXPECT_EQ(first_invalid_utf8("xx\xed\xa0\x80"), 2u);    // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("0123456789\x80"), 10u);   // after the 8-byte fast path
}

// ---- hostile tokenizer files: each a clear InputError naming the key ----

void expect_refused(const std::string& text, std::initializer_list<std::string> parts) {
  expect_input_error([&] { HfTokenizer::parse(text, "bad.json"); }, parts);
}

TEST(HfTokenizerTest, RefusesTruncatedJson) {
  const std::string full = Builder().build().dump();
  for (size_t n : {size_t(0), size_t(1), full.size() / 2, full.size() - 1}) {
    expect_refused(full.substr(0, n), {"bad.json", "not valid JSON"});
  }
}

TEST(HfTokenizerTest, RefusesWrongTypes) {
  json j = Builder().build();
  j["model"]["vocab"] = json::array({"a"});
  expect_refused(j.dump(), {"model.vocab", "must be an object"});
  j = Builder().build();
  j["model"]["merges"] = json::array({7});
  expect_refused(j.dump(), {"model.merges[0]"});
  j = Builder().build();
  j["model"]["vocab"]["a"] = "one";
  expect_refused(j.dump(), {"model.vocab[\"a\"]", "integer"});
  j = Builder().build();
  j["added_tokens"] = json::array({{{"id", 300}, {"content", 5}}});
  expect_refused(j.dump(), {"added_tokens[0].content", "string"});
  j = Builder().build();
  j["model"]["byte_fallback"] = "yes";
  expect_refused(j.dump(), {"model.byte_fallback", "true or false"});
  expect_refused("[1, 2]", {"top level", "object"});
}

TEST(HfTokenizerTest, RefusesMergesOfUnknownTokens) {
  json j = Builder().build();
  j["model"]["merges"] = json::array({"Ġ zz"});
  expect_refused(j.dump(), {"model.merges[0]", "\"zz\"", "not in model.vocab"});
  j = Builder().build();
  j["model"]["merges"] = json::array({"a b"});  // "ab" is no entry
  expect_refused(j.dump(), {"model.merges[0]", "\"ab\""});
  j = Builder().build();
  j["model"]["merges"] = json::array({"a b c"});
  expect_refused(j.dump(), {"model.merges[0]", "one space"});
}

TEST(HfTokenizerTest, RefusesDuplicateAndOutOfRangeIds) {
  json j = Builder().build();
  j["model"]["vocab"]["extra"] = 5;
  expect_refused(j.dump(), {"model.vocab", "gives id 5"});
  j = Builder().build();
  j["model"]["vocab"]["extra"] = -1;
  expect_refused(j.dump(), {"model.vocab[\"extra\"]", "outside [0, 16777216)"});
  j = Builder().build();
  j["model"]["vocab"]["extra"] = int64_t(1) << 24;
  expect_refused(j.dump(), {"outside [0, 16777216)"});
  j = Builder().build();
  j["model"]["vocab"]["extra"] = uint64_t(1) << 63;
  expect_refused(j.dump(), {"outside [0, 16777216)"});
  j = Builder().build();
  j["model"]["vocab"]["extra"] = 1.5;
  expect_refused(j.dump(), {"integer"});
  Builder b;
  b.add("<a>");
  j = b.build();
  j["added_tokens"][0]["id"] = 7;
  expect_refused(j.dump(), {"added_tokens[0].id", "already the id of"});
  j = b.build();
  j["added_tokens"].push_back(j["added_tokens"][0]);
  expect_refused(j.dump(), {"added_tokens[1]", "repeats"});
}

TEST(HfTokenizerTest, RefusesWhatItDoesNotImplement) {
  json j = Builder().build();
  j["model"]["type"] = "WordPiece";
  expect_refused(j.dump(), {"model.type", "WordPiece", "BPE"});
  j = Builder().build();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_refused(j.dump(), {"normalizer.type", "Lowercase", "NFC"});
  j = Builder().build();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_refused(j.dump(), {"pre_tokenizer.type", "Whitespace", "Metaspace"});
  j = Builder().build();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  expect_refused(j.dump(), {"pattern", "does not compile in PCRE2"});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "x";
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_refused(j.dump(), {"pre_tokenizer.pretokenizers[0].behavior", "Sideways", "Contiguous"});
  j = Builder().build();
  j["model"]["dropout"] = 0.1;
  expect_refused(j.dump(), {"model.dropout"});
  j = Builder().build();
  j["truncation"] = {{"max_length", 8}};
  expect_refused(j.dump(), {"truncation"});
  j = Builder().build();
  j["post_processor"] = {{"type", "BertProcessing"}};
  expect_refused(j.dump(), {"post_processor.type", "BertProcessing"});
}

class HfTokenizerFileTest : public test_util::TempDirTest {};

TEST_F(HfTokenizerFileTest, LoadsADirectoryAndNamesAMissingFile) {
  const std::string dir = path("tok");
  std::filesystem::create_directories(dir);
  test_util::write_text(dir + "/tokenizer.json", Builder().build().dump());
  EXPECT_EQ(HfTokenizer::load(dir)->vocab_size(), 256);
  EXPECT_EQ(HfTokenizer::load(dir + "/tokenizer.json")->source(), dir + "/tokenizer.json");
  std::filesystem::remove_all(dir);
  expect_input_error([&] { HfTokenizer::load(dir); }, {dir, "does not exist"});
}

}  // namespace
}  // namespace strata::data
