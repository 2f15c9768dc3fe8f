// The tokenizer.json parts of the families after GPT-2 and Llama-3 (Qwen2/3: NFC; Gemma: Replace,
// byte_fallback, fuse_unk; Llama-2/Mistral/Phi-3: Prepend + Replace or Metaspace; SmolLM2:
// Digits), on small tokenizers built here. Every expected id list is what tokenizers 0.23 gives
// for the same file and text; the large-corpus comparison is tokenizer_peer_test.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "hf_test_tokenizer.h"
#include "strata/data/hf_tokenizer.h"

namespace strata::data {
namespace {

using nlohmann::json;
using test_util::expect_input_error;
using Ids = std::vector<int32_t>;

Ids encode(const json& file, std::string_view text) {
  const auto tok = HfTokenizer::parse(file.dump(), "test.json");
  HfTokenizer::Session s(*tok);
  Ids ids;
  s.encode_append(text, ids);
  return ids;
}

// A SentencePiece-style BPE (symbols are characters): <unk> 0, <s> 1, </s> 2, then <0x00>..<0xFF>
// (3..258) when `byte_tokens`, then the pieces added.
struct SpBuilder {
  json vocab = json::object();
  json merges = json::array();
  json added = json::array();
  json normalizer = nullptr;
  json pre = nullptr;
  json post = nullptr;
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}};

  explicit SpBuilder(bool byte_tokens = true) {
    for (const char* s : {"<unk>", "<s>", "</s>"}) {
      const int id = int(vocab.size());
      vocab[s] = id;
      added.push_back({{"id", id},
                       {"content", s},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    for (int b = 0; byte_tokens && b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = int(vocab.size());
    }
  }
  int piece(const std::string& s) {
    if (!vocab.contains(s)) vocab[s] = int(vocab.size());
    return vocab[s].get<int>();
  }
  int merge(const std::string& a, const std::string& b) {
    piece(a), piece(b);
    const int id = piece(a + b);
    merges.push_back(json::array({a, b}));
    return id;
  }
  // Llama-2's and Gemma's post-processor: the single template "<s> $A".
  void bos_template() {
    post = {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", json::array()},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  }
  json build() const {
    json m = model;
    m["vocab"] = vocab;
    m["merges"] = merges;
    return {{"version", "1.0"},       {"truncation", nullptr},    {"padding", nullptr},
            {"added_tokens", added},  {"normalizer", normalizer}, {"pre_tokenizer", pre},
            {"post_processor", post}, {"decoder", nullptr},       {"model", m}};
  }
};

json replace(const std::string& from, const std::string& to) {
  return {{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}
json metaspace(const std::string& scheme, bool split) {
  return {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", split}};
}

// "▁hi" and "i▁" reachable by merges; "i▁" first.
struct HiVocab {
  SpBuilder b;
  int h, i, sp, sp_h, sp_hi, i_sp;
  HiVocab() {
    h = b.piece("h"), i = b.piece("i"), sp = b.piece("▁");
    i_sp = b.merge("i", "▁");
    sp_h = b.merge("▁", "h");
    sp_hi = b.merge("▁h", "i");
  }
};

// Llama-2 legacy: Prepend is a normalizer, so every piece between special tokens gets "▁".
TEST(HfTokenizerFamiliesTest, LegacyPrependNormalizerPrependsAfterEverySpecialToken) {
  HiVocab v;
  v.b.normalizer = {{"type", "Sequence"},
                    {"normalizers", {{{"type", "Prepend"}, {"prepend", "▁"}}, replace(" ", "▁")}}};
  v.b.bos_template();
  const json f = v.b.build();
  EXPECT_EQ(HfTokenizer::parse(f.dump(), "t")->template_prefix(), Ids{1});
  // No pre-tokenizer: "▁hi▁hi" is one word, and "i▁" merges first.
  EXPECT_EQ(encode(f, "hi hi"), (Ids{v.sp_h, v.i_sp, v.h, v.i}));
  EXPECT_EQ(encode(f, "hi</s>hi"), (Ids{v.sp_hi, 2, v.sp_hi}));
  EXPECT_EQ(encode(f, "</s>hi"), (Ids{2, v.sp_hi}));
}

// Non-legacy (Mistral v0.3, legacy: false): Metaspace prepend_scheme "first" prepends only where
// the text starts; "always" after every special token too; "never" nowhere.
TEST(HfTokenizerFamiliesTest, MetaspacePrependSchemes) {
  HiVocab v;
  v.b.pre = metaspace("first", false);
  json f = v.b.build();
  EXPECT_EQ(encode(f, "hi</s>hi"), (Ids{v.sp_hi, 2, v.h, v.i}));
  EXPECT_EQ(encode(f, "</s>hi"), (Ids{2, v.h, v.i}));
  EXPECT_EQ(encode(f, " hi"), (Ids{v.sp_hi}));  // already starts with the replacement
  EXPECT_EQ(encode(f, "hi hi"), (Ids{v.sp_h, v.i_sp, v.h, v.i}));
  v.b.pre = metaspace("always", false);
  f = v.b.build();
  EXPECT_EQ(encode(f, "hi</s>hi"), (Ids{v.sp_hi, 2, v.sp_hi}));
  v.b.pre = metaspace("never", false);
  f = v.b.build();
  EXPECT_EQ(encode(f, "hi</s>hi"), (Ids{v.h, v.i, 2, v.h, v.i}));
  // split: each "▁" starts a word, so "i▁" cannot merge.
  v.b.pre = metaspace("first", true);
  f = v.b.build();
  EXPECT_EQ(encode(f, "hi hi"), (Ids{v.sp_hi, v.sp_hi}));
  EXPECT_EQ(encode(f, "hi  hi"), (Ids{v.sp_hi, v.sp, v.sp_hi}));
  // Files from before prepend_scheme: add_prefix_space true is "always".
  v.b.pre = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", true}};
  f = v.b.build();
  EXPECT_EQ(encode(f, "hi</s>hi"), (Ids{v.sp_hi, 2, v.sp_hi}));
}

// "first" means where `tokenizers` aligns the piece with the start of the original text: both
// halves of what the normalizer made of the first character count, as in `tokenizers`.
TEST(HfTokenizerFamiliesTest, MetaspaceFirstFollowsOriginalOffsets) {
  SpBuilder b(false);
  b.model["byte_fallback"] = false;
  const int bb = b.piece("b"), c = b.piece("c"), x = b.piece("x");
  const int sp_b = b.merge("▁", "b"), sp_c = b.merge("▁", "c"), sp_x = b.merge("▁", "x");
  b.normalizer = replace("a", "bc");
  b.pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"String", "c"}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             metaspace("first", false)}}};
  const json f = b.build();
  EXPECT_EQ(encode(f, "a"), (Ids{sp_b, sp_c}));
  EXPECT_EQ(encode(f, "ax"), (Ids{sp_b, sp_c, x}));
  EXPECT_EQ(encode(f, "xa"), (Ids{sp_x, bb, c}));
}

// Gemma: spaces become "▁" in the normalizer; the Split(" ") after it has nothing to split.
// A character missing from the vocabulary becomes its UTF-8 bytes' <0xXX> tokens.
TEST(HfTokenizerFamiliesTest, GemmaReplaceAndByteFallback) {
  SpBuilder b;
  const int a = b.piece("a"), sp = b.piece("▁"), sp_a = b.merge("▁", "a");
  b.normalizer = replace(" ", "▁");
  b.pre = {{"type", "Split"},
           {"pattern", {{"String", " "}}},
           {"behavior", "MergedWithPrevious"},
           {"invert", false}};
  b.bos_template();
  const json f = b.build();
  // 日 is E6 97 A5; <0xXX> is 3 + XX.
  EXPECT_EQ(encode(f, "a 日 a"), (Ids{a, sp, 3 + 0xE6, 3 + 0x97, 3 + 0xA5, sp_a}));
  EXPECT_EQ(encode(f, "a  a"), (Ids{a, sp, sp_a}));
}

// fuse_unk joins a run of characters without a token (and without all their <0xXX> tokens) into
// one <unk>. As `tokenizers` does, an unk still pending when a character falls back to bytes comes
// after those bytes.
TEST(HfTokenizerFamiliesTest, UnkFuseUnkAndPendingUnkAfterByteFallback) {
  SpBuilder b;
  const int a = b.piece("a");
  b.vocab.erase("<0xC3>");  // ÿ (C3 BF) has no fallback; 日 (E6 97 A5) has
  json f = b.build();
  EXPECT_EQ(encode(f, "aÿÿa"), (Ids{a, 0, a}));
  EXPECT_EQ(encode(f, "ÿ日a"), (Ids{3 + 0xE6, 3 + 0x97, 3 + 0xA5, 0, a}));
  b.model["fuse_unk"] = false;
  f = b.build();
  EXPECT_EQ(encode(f, "aÿÿa"), (Ids{a, 0, 0, a}));
  b.model["byte_fallback"] = false;
  f = b.build();
  EXPECT_EQ(encode(f, "a日a"), (Ids{a, 0, a}));
  b.model["unk_token"] = nullptr;  // nothing for them at all
  f = b.build();
  EXPECT_EQ(encode(f, "a日ÿa"), (Ids{a, a}));
}

// Qwen2: NFC composes e + U+0301 into é and Hangul jamo into syllables before anything else.
TEST(HfTokenizerFamiliesTest, NfcComposesDecomposedInput) {
  SpBuilder b(false);
  const int e_acute = b.piece("é"), e = b.piece("e"), ga = b.piece("가");
  b.model["byte_fallback"] = false;
  json f = b.build();
  EXPECT_EQ(encode(f, "e\u0301"), (Ids{e, 0}));
  b.normalizer = {{"type", "NFC"}};
  f = b.build();
  EXPECT_EQ(encode(f, "e\u0301e"), (Ids{e_acute, e}));
  EXPECT_EQ(encode(f, "\u1100\u1161"), (Ids{ga}));
  // NFD takes é apart; NFKC folds the ligature ﬁ into "fi".
  const int f_ = b.piece("f"), i = b.piece("i"), acute = b.piece("\u0301");
  b.normalizer = {{"type", "NFD"}};
  EXPECT_EQ(encode(b.build(), "é"), (Ids{e, acute}));
  b.normalizer = {{"type", "NFKC"}};
  EXPECT_EQ(encode(b.build(), "\ufb01"), (Ids{f_, i}));
}

// A Qwen2-style byte-level tokenizer: NFC, then the Split regex and ByteLevel(use_regex=false).
TEST(HfTokenizerFamiliesTest, Qwen2NfcThenByteLevel) {
  test_util::Builder b;
  b.pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|\s+)"}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const int e_acute = b.merge(test_util::byte_char(0xC3), test_util::byte_char(0xA9));
  json f = b.build();
  f["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(encode(f, "e\u0301"), (Ids{e_acute}));
  EXPECT_EQ(encode(f, "12"), (Ids{'1', '2'}));
}

// Normalizer steps in order, Replace by a Regex (Oniguruma's ^ matches at every line start).
TEST(HfTokenizerFamiliesTest, ReplaceRegexAndSequenceOrder) {
  SpBuilder b(false);
  const int x = b.piece("X"), a = b.piece("a"), sp = b.piece("▁"), nl = b.piece("\n");
  b.model["byte_fallback"] = false;
  b.normalizer = {{"type", "Replace"}, {"pattern", {{"Regex", "^"}}}, {"content", "X"}};
  EXPECT_EQ(encode(b.build(), "a\na"), (Ids{x, a, nl, x, a}));
  b.normalizer = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "▁"}};
  EXPECT_EQ(encode(b.build(), "a   a a"), (Ids{a, sp, a, sp, a}));
  // Prepend then Replace replaces the prepended text too; the other order does not.
  b.normalizer = {{"type", "Sequence"},
                  {"normalizers", {{{"type", "Prepend"}, {"prepend", "a"}}, replace("a", "X")}}};
  EXPECT_EQ(encode(b.build(), "a"), (Ids{x, x}));
  b.normalizer = {{"type", "Sequence"},
                  {"normalizers", {replace("a", "X"), {{"type", "Prepend"}, {"prepend", "a"}}}}};
  EXPECT_EQ(encode(b.build(), "a"), (Ids{a, x}));
}

// Split with a String pattern under every behavior, and inverted.
TEST(HfTokenizerFamiliesTest, SplitBehaviors) {
  SpBuilder b(false);
  b.model["byte_fallback"] = false;
  const int a = b.piece("a"), d = b.piece("-"), bb = b.piece("b"), c = b.piece("c");
  const int a_d = b.merge("a", "-"), d_b = b.merge("-", "b"), d_d = b.merge("-", "-");
  const int b_d = b.merge("b", "-"), d_c = b.merge("-", "c");
  auto split = [&](const std::string& behavior, bool invert) {
    b.pre = {{"type", "Split"},
             {"pattern", {{"String", "-"}}},
             {"behavior", behavior},
             {"invert", invert}};
    return encode(b.build(), "a-b--c");
  };
  EXPECT_EQ(split("Removed", false), (Ids{a, bb, c}));
  EXPECT_EQ(split("Isolated", false), (Ids{a, d, bb, d, d, c}));
  EXPECT_EQ(split("MergedWithPrevious", false), (Ids{a_d, b_d, d, c}));
  EXPECT_EQ(split("MergedWithNext", false), (Ids{a, d_b, d, d_c}));
  EXPECT_EQ(split("Contiguous", false), (Ids{a, d, bb, d_d, c}));
  EXPECT_EQ(split("Removed", true), (Ids{d, d, d}));
  EXPECT_EQ(split("MergedWithPrevious", true), (Ids{a, d_b, d, d_c}));
  EXPECT_EQ(split("MergedWithNext", true), (Ids{a_d, b_d, d, c}));
}

// SmolLM2: Digits(individual_digits) before ByteLevel(use_regex=true); GPT-2's " ?\p{N}+" alone
// would keep " 12" together.
TEST(HfTokenizerFamiliesTest, SmolLmDigitsThenByteLevelRegex) {
  test_util::Builder b;
  const int sp_1 = b.merge("Ġ", "1");
  const int d12 = b.merge("1", "2");
  EXPECT_EQ(encode(b.build(), "x 12"), (Ids{'x', sp_1, '2'}));
  auto with_digits = [&](bool individual) {
    json f = b.build();
    f["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Digits"}, {"individual_digits", individual}},
                            {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}}}}};
    return f;
  };
  EXPECT_EQ(encode(with_digits(true), "x 12"), (Ids{'x', ' ', '1', '2'}));
  EXPECT_EQ(encode(with_digits(false), "x 12"), (Ids{'x', ' ', d12}));
}

// An added token with normalized: true matches by its normalized content in normalized text:
// with Prepend("▁") "ab" is "▁ab", found only where a piece starts.
TEST(HfTokenizerFamiliesTest, NormalizedAddedTokensMatchTheirNormalizedForm) {
  SpBuilder b(false);
  b.model["byte_fallback"] = false;
  const int sp = b.piece("▁"), a = b.piece("a"), bb = b.piece("b"), x = b.piece("x");
  b.normalizer = {{"type", "Prepend"}, {"prepend", "▁"}};
  b.added.push_back({{"id", 7},
                     {"content", "ab"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", true},
                     {"special", false}});
  const json f = b.build();
  EXPECT_EQ(encode(f, "ab"), (Ids{7}));
  EXPECT_EQ(encode(f, "xab"), (Ids{sp, x, a, bb}));
}

TEST(HfTokenizerFamiliesTest, IgnoreMergesOnCharacters) {
  SpBuilder b(false);
  b.model["byte_fallback"] = false;
  b.merge("a", "b");
  const int abc = b.piece("abc");  // reachable by no merge
  b.model["ignore_merges"] = true;
  EXPECT_EQ(encode(b.build(), "abc"), (Ids{abc}));
}

// Without a pre-tokenizer a whole document is one word: the merge loop must not be quadratic in
// its length (a 1 MB word would then take hours).
TEST(HfTokenizerFamiliesTest, OneMegabyteWordMergesInNLogN) {
  SpBuilder b(false);
  b.model["byte_fallback"] = false;
  const int ab = b.merge("a", "b");
  const int abab = b.merge("ab", "ab");
  std::string text;
  for (int i = 0; i < 1 << 18; ++i) text += "abab";
  const Ids ids = encode(b.build(), text + "ab");
  ASSERT_EQ(ids.size(), size_t(1 << 18) + 1);
  EXPECT_EQ(ids.front(), abab);
  EXPECT_EQ(ids.back(), ab);
}

// ---- hostile files of the new kinds: an InputError naming the key path and the fix ----

void expect_refused(const json& j, std::initializer_list<std::string> parts) {
  expect_input_error([&] { HfTokenizer::parse(j.dump(), "bad.json"); }, parts);
}

json gemma_like() {
  SpBuilder b;
  b.piece("a");
  b.normalizer = {{"type", "Sequence"},
                  {"normalizers", {{{"type", "Prepend"}, {"prepend", "▁"}}, replace(" ", "▁")}}};
  b.pre = metaspace("first", false);
  b.bos_template();
  return b.build();
}

TEST(HfTokenizerFamiliesTest, RefusesTruncatedFilesOfEachKind) {
  json qwen = test_util::Builder().build();
  qwen["normalizer"] = {{"type", "NFC"}};
  for (const json& j : {gemma_like(), qwen}) {
    const std::string full = j.dump();
    for (size_t n : {full.size() / 3, full.size() / 2, full.size() - 1})
      expect_input_error([&] { HfTokenizer::parse(full.substr(0, n), "bad.json"); },
                         {"bad.json", "not valid JSON"});
  }
}

TEST(HfTokenizerFamiliesTest, RefusesBadNormalizers) {
  json j = gemma_like();
  j["normalizer"]["normalizers"][1].erase("content");
  expect_refused(j, {"normalizer.normalizers[1].content", "missing", "string"});
  j = gemma_like();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Glob", "*"}};
  expect_refused(j, {"normalizer.normalizers[1].pattern", "{\"String\": ...} or {\"Regex\": ...}"});
  j = gemma_like();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", "(unclosed"}};
  expect_refused(j, {"normalizer.normalizers[1].pattern", "does not compile in PCRE2"});
  j = gemma_like();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"String", ""}};
  expect_refused(j, {"normalizer.normalizers[1].pattern", "is empty"});
  j = gemma_like();
  j["normalizer"]["normalizers"][0] = {{"type", "Prepend"}, {"prepend", 7}};
  expect_refused(j, {"normalizer.normalizers[0].prepend", "must be a string"});
  j = gemma_like();
  j["normalizer"]["normalizers"][0] = {{"type", "Lowercase"}};
  expect_refused(j, {"normalizer.normalizers[0].type", "\"Lowercase\"", "NFC, NFD"});
  j = gemma_like();
  j["normalizer"]["normalizers"] = {{"type", "NFC"}};
  expect_refused(j, {"normalizer.normalizers", "must be an array"});
  j = gemma_like();
  j["normalizer"] = "NFC";
  expect_refused(j, {"normalizer", "must be an object or null"});
  j = gemma_like();
  j["normalizer"] = {{"kind", "NFC"}};
  expect_refused(j, {"normalizer.type", "missing"});
}

TEST(HfTokenizerFamiliesTest, RefusesBadPreTokenizers) {
  json j = gemma_like();
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  expect_refused(
      j, {"pre_tokenizer.prepend_scheme", "\"sometimes\"", "\"always\", \"first\" or \"never\""});
  j = gemma_like();
  j["pre_tokenizer"]["replacement"] = "▁▁";
  expect_refused(j, {"pre_tokenizer.replacement", "one character"});
  j = gemma_like();
  j["pre_tokenizer"].erase("replacement");
  expect_refused(j, {"pre_tokenizer.replacement", "missing"});
  j = gemma_like();
  j["pre_tokenizer"]["split"] = "no";
  expect_refused(j, {"pre_tokenizer.split", "true or false"});
  j = gemma_like();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  expect_refused(j, {"pre_tokenizer.add_prefix_space", "prepend_scheme to \"never\""});
  j = gemma_like();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Digits"}, {"individual", true}}}}};
  expect_refused(j, {"pre_tokenizer.pretokenizers[0].individual_digits", "missing"});
  j = gemma_like();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"invert", false}};
  expect_refused(j, {"pre_tokenizer.behavior", "missing"});
  j = gemma_like();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "ByteLevel"}, {"use_regex", false}}, metaspace("first", true)}}};
  expect_refused(j, {"pre_tokenizer", "ByteLevel step before other steps"});
  j = gemma_like();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expect_refused(j, {"pre_tokenizer.type", "\"BertPreTokenizer\"", "Metaspace"});
}

TEST(HfTokenizerFamiliesTest, RefusesBadModelFlagsAndAddedTokens) {
  json j = gemma_like();
  j["model"]["byte_fallback"] = "true";
  expect_refused(j, {"model.byte_fallback", "true or false"});
  j = gemma_like();
  j["model"]["fuse_unk"] = 1;
  expect_refused(j, {"model.fuse_unk", "true or false"});
  j = gemma_like();
  j["model"]["unk_token"] = "<nope>";
  expect_refused(j, {"model.unk_token", "not in model.vocab"});
  // tokenizers numbers added tokens outside the vocabulary itself, after the vocabulary.
  j = gemma_like();
  const int next = int(j["model"]["vocab"].size());
  j["added_tokens"].push_back({{"id", next + 1}, {"content", "<x>"}});
  expect_refused(j, {"added_tokens[3].id", "is " + std::to_string(next + 1),
                     "gives this one " + std::to_string(next)});
  // Two normalized added tokens that normalize alike cannot both be matched.
  j = gemma_like();
  j["normalizer"] = {{"type", "NFC"}};
  for (const char* content : {"e\u0301x", "\u00e9x"})
    j["added_tokens"].push_back({{"id", next + int(j["added_tokens"].size()) - 3},
                                 {"content", content},
                                 {"normalized", true}});
  expect_refused(j, {"added_tokens[4].content", "normalizes to", "added_tokens[3]"});
}

}  // namespace
}  // namespace strata::data
