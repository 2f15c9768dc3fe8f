// `strata data prepare --tokenizer` and `strata data inspect` through the CLI: exit codes and
// messages a user sees.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "tests/data/data_test_util.h"
#include "tests/data/hf_test_tokenizer.h"

namespace strata::data {
namespace {

using nlohmann::json;
using test_util::Builder;
using test_util::write_text;

class DataCliTest : public test_util::TempDirTest {
 protected:
  // Runs `strata ARGS`; returns the exit code, stdout+stderr in *out.
  int run(const std::string& args, std::string* out) {
    const std::string cmd = std::string(STRATA_BINARY) + " " + args + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr);
    out->clear();
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
    const int status = ::pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  void SetUp() override {
    test_util::TempDirTest::SetUp();
    std::filesystem::create_directories(path("texts"));
    write_text(path("texts/a.txt"), "the cat");
    write_text(path("texts/b.txt"), "über");
    Builder b;
    b.add("<|endoftext|>");
    write_text(path("tok.json"), b.build().dump());
  }
};

TEST_F(DataCliTest, PrepareWithTokenizerThenInspect) {
  std::string out;
  ASSERT_EQ(run("data prepare -i " + path("texts") + " -o " + path("d") + " --tokenizer " +
                    path("tok.json"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("2 documents"), std::string::npos) << out;
  EXPECT_NE(out.find("vocabulary 257 ids, uint16 tokens; each document: [256] text [none]"),
            std::string::npos)
      << out;
  ASSERT_EQ(run("data inspect " + path("d_train.bin") + " --tokenizer " + path("tok.json"), &out),
            0)
      << out;
  EXPECT_NE(out.find("format llmc, dtype uint16"), std::string::npos) << out;
  EXPECT_NE(out.find("documents 2 (occurrences of id 256"), std::string::npos) << out;
  EXPECT_NE(out.find("vocabulary 257: every id fits"), std::string::npos) << out;
  // A vocabulary too small for the ids: exit 2, naming the id.
  EXPECT_EQ(run("data inspect " + path("d_train.bin") + " --vocab 200", &out), 2) << out;
  EXPECT_NE(out.find("token id 256 is not below the vocabulary 200"), std::string::npos) << out;
}

TEST_F(DataCliTest, BadInputExitsTwoWithoutSourceLocation) {
  write_text(path("texts/c.txt"), "ok\xff");
  std::string out;
  EXPECT_EQ(run("data prepare -i " + path("texts") + " -o " + path("d") + " --tokenizer " +
                    path("tok.json"),
                &out),
            2);
  EXPECT_NE(out.find(path("texts/c.txt") + ": not valid UTF-8 at byte offset 2"), std::string::npos)
      << out;
  EXPECT_EQ(out.find(".cc:"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(path("d_train.bin")));
  write_text(path("bad.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}");
  EXPECT_EQ(run("data prepare -i " + path("texts") + " -o " + path("d") + " --tokenizer " +
                    path("bad.json"),
                &out),
            2);
  EXPECT_NE(out.find("model.vocab must be an object"), std::string::npos) << out;
  EXPECT_EQ(run("data prepare -i " + path("texts") + " -o " + path("d") + " --append-eod", &out),
            2);
  EXPECT_NE(out.find("--append-eod needs --tokenizer"), std::string::npos) << out;
}

// A tokenizer of the newer kinds with a bad value: exit 2, the key path named, nothing written.
TEST_F(DataCliTest, BadNormalizerOrMetaspaceExitsTwoAndWritesNothing) {
  Builder b;
  b.add("<|endoftext|>");
  json j = b.build();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "Replace"}, {"pattern", {{"String", " "}}}}}}};
  write_text(path("bad_norm.json"), j.dump());
  j = b.build();
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "sometimes"}};
  write_text(path("bad_meta.json"), j.dump());
  const std::pair<const char*, const char*> cases[] = {
      {"bad_norm.json", "normalizer.normalizers[0].content is missing"},
      {"bad_meta.json", "pre_tokenizer.prepend_scheme is \"sometimes\""}};
  for (const auto& [file, message] : cases) {
    std::string out;
    EXPECT_EQ(
        run("data prepare -i " + path("texts") + " -o " + path("d") + " --tokenizer " + path(file),
            &out),
        2)
        << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(path("d_train.bin")));
  }
}

}  // namespace
}  // namespace strata::data
