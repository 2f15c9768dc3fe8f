// `strata data prepare --tokenizer`: document framing, token widths, the val split, determinism
// over thread counts, and bad input (non-UTF-8 text, bad tokenizer files) leaving no output.
#include <gtest/gtest.h>
#include <omp.h>

#include "data_test_util.h"
#include "hf_test_tokenizer.h"
#include "strata/data/inspect.h"
#include "strata/data/prepare.h"
#include "strata/data/token_dataset.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;
using test_util::Builder;
using test_util::expect_input_error;
using test_util::read_all;
using test_util::read_bytes;
using test_util::write_text;

class PrepareTokenizerTest : public test_util::TempDirTest {
 protected:
  void SetUp() override {
    test_util::TempDirTest::SetUp();
    fs::create_directories(path("corpus"));
    write_text(path("corpus/a.txt"), "the cat");
    write_text(path("corpus/b.txt"), "aaa<|endoftext|>the");
  }
  std::string save(const Builder& b, const std::string& name = "tok.json") {
    write_text(path(name), b.build().dump());
    return path(name);
  }
  PrepareResult prepare(const std::string& tok, const std::string& out, bool append_eod = false,
                        const std::string& format = "llmc", double val = 0.0) {
    PrepareOptions o;
    o.format = format;
    o.val_fraction = val;
    o.tokenizer = tok;
    o.append_eod = append_eod;
    return prepare_text_dataset({path("corpus")}, path(out), o);
  }
  // The files under the temp dir other than the inputs: what a failed prepare must not leave.
  std::vector<std::string> outputs() const {
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string p = e.path().string();
      if (e.is_regular_file() && p.find("/corpus/") == std::string::npos &&
          p.find(".json") == std::string::npos)
        found.push_back(p);
    }
    return found;
  }
};

TEST_F(PrepareTokenizerTest, Gpt2EndOfTextOpensEachDocument) {
  Builder b;
  b.merge("t", "h");
  const int the = b.merge("th", "e");
  const int eot = b.add("<|endoftext|>");
  const PrepareResult r = prepare(save(b), "g");
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.token_type, "uint16");
  EXPECT_EQ(r.vocab_size, eot + 1);
  const std::vector<int32_t> want = {eot, the, ' ', 'c', 'a', 't', eot, 'a', 'a', 'a', eot, the};
  EXPECT_EQ(read_all(*open_dataset(path("g_train.bin"))), want);
  EXPECT_EQ(r.train_tokens, int64_t(want.size()));

  // --append-eod: the token closes each document instead (Megatron's convention).
  prepare(save(b), "ge", true);
  const std::vector<int32_t> closed = {the, ' ', 'c', 'a', 't', eot, 'a', 'a', 'a', eot, the, eot};
  EXPECT_EQ(read_all(*open_dataset(path("ge_train.bin"))), closed);

  const DatasetSummary s = summarize_dataset(path("g_train.bin"), "auto", std::nullopt);
  EXPECT_EQ(s.format, "llmc");
  EXPECT_EQ(s.token_type, "uint16");
  // The first token opens every document; the "<|endoftext|>" text inside b.txt counts too.
  EXPECT_EQ(s.documents, 3);
  EXPECT_EQ(s.max_id, eot);
}

TEST_F(PrepareTokenizerTest, Llama3BosOpensAndAppendEodCloses) {
  Builder b;
  const int bos = b.add("<|begin_of_text|>");
  const int eos = b.add("<|end_of_text|>");
  b.bos_template(bos, "<|begin_of_text|>");
  prepare(save(b), "l", true, "megatron");
  const auto ds = open_dataset(path("l_train"));
  const std::vector<int32_t> a = {bos, 't', 'h', 'e', ' ', 'c', 'a', 't', eos};
  const std::vector<int32_t> all = read_all(*ds);
  ASSERT_GE(all.size(), a.size());
  EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + int64_t(a.size())), a);
  const DatasetSummary s = summarize_dataset(path("l_train"), "auto", std::nullopt);
  EXPECT_EQ(s.format, "megatron");
  EXPECT_EQ(s.documents, 2);
}

TEST_F(PrepareTokenizerTest, LargeVocabulariesWriteUint32AndInt32) {
  Builder b;
  for (int i = 0; i < 65600 - 256; ++i) b.add("<|pad_" + std::to_string(i) + "|>");
  const int eot = b.add("<|endoftext|>");
  const std::string tok = save(b);
  const PrepareResult r = prepare(tok, "big");
  EXPECT_EQ(r.token_type, "uint32");
  std::vector<uint8_t> bytes = read_bytes(path("big_train.bin"));
  int32_t magic;
  std::memcpy(&magic, bytes.data(), 4);
  EXPECT_EQ(magic, 20240801);
  EXPECT_EQ(read_all(*open_dataset(path("big_train.bin")))[0], eot);
  const PrepareResult m = prepare(tok, "bigm", false, "megatron");
  EXPECT_EQ(m.token_type, "int32");
  EXPECT_EQ(summarize_dataset(path("bigm_train"), "auto", std::nullopt).token_type, "int32");
  // Below 65,500 ids Megatron keeps uint16, as its preprocessor does.
  Builder small;
  small.add("<|endoftext|>");
  EXPECT_EQ(prepare(save(small, "small.json"), "sm", false, "megatron").token_type, "uint16");
}

TEST_F(PrepareTokenizerTest, ValSplitKeepsTheStream) {
  Builder b;
  b.add("<|endoftext|>");
  const PrepareResult whole = prepare(save(b), "w");
  const PrepareResult split = prepare(save(b), "s", false, "llmc", 0.25);
  EXPECT_EQ(split.train_tokens + split.val_tokens, whole.train_tokens);
  EXPECT_EQ(split.val_tokens, std::llround(0.25 * double(whole.train_tokens)));
  std::vector<int32_t> joined = read_all(*open_dataset(path("s_train.bin")));
  const std::vector<int32_t> val = read_all(*open_dataset(path("s_val.bin")));
  joined.insert(joined.end(), val.begin(), val.end());
  EXPECT_EQ(joined, read_all(*open_dataset(path("w_train.bin"))));
}

TEST_F(PrepareTokenizerTest, SameBytesWhateverTheThreadCount) {
  std::string text;
  for (int d = 0; d < 40; ++d) {
    text.clear();
    for (int i = 0; i < 200 + 37 * d; ++i)
      text += "word" + std::to_string(i * d % 97) + " ünï 日本 ";
    write_text(path("corpus/doc" + std::to_string(100 + d) + ".txt"), text);
  }
  Builder b;
  b.merge("w", "o");
  b.merge("wo", "r");
  b.add("<|endoftext|>");
  const std::string tok = save(b);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  prepare(tok, "t1", false, "megatron");
  omp_set_num_threads(4);
  prepare(tok, "t4", false, "megatron");
  omp_set_num_threads(saved);
  EXPECT_EQ(read_bytes(path("t1_train.bin")), read_bytes(path("t4_train.bin")));
  EXPECT_EQ(read_bytes(path("t1_train.idx")), read_bytes(path("t4_train.idx")));
}

TEST_F(PrepareTokenizerTest, NonUtf8TextNamesFileAndOffsetAndLeavesNothing) {
  write_text(path("corpus/c.txt"), "fine text\n\xc3\x28 broken");
  Builder b;
  b.add("<|endoftext|>");
  expect_input_error([&] { prepare(save(b), "out/x", false, "llmc", 0.1); },
                     {path("corpus/c.txt"), "not valid UTF-8 at byte offset 10"});
  EXPECT_EQ(outputs(), std::vector<std::string>{});
  // The byte tokenizer takes any bytes.
  EXPECT_EQ(prepare_text_dataset({path("corpus")}, path("bytes"), "llmc", 0.0).documents, 3);
}

TEST_F(PrepareTokenizerTest, BadTokenizersAndOptionsLeaveNothing) {
  write_text(path("trunc.json"), Builder().build().dump().substr(0, 100));
  expect_input_error([&] { prepare(path("trunc.json"), "x"); }, {"trunc.json", "not valid JSON"});
  expect_input_error([&] { prepare(path("none.json"), "x"); }, {"none.json", "does not exist"});
  // Neither an end-of-text token nor a template: nothing to separate documents with.
  expect_input_error([&] { prepare(save(Builder()), "x"); },
                     {"no end-of-text token", "<|endoftext|>"});
  PrepareOptions o;
  o.append_eod = true;
  expect_input_error([&] { prepare_text_dataset({path("corpus")}, path("x"), o); },
                     {"--append-eod needs --tokenizer"});
  EXPECT_EQ(outputs(), std::vector<std::string>{});
}

}  // namespace
}  // namespace strata::data
