// `strata data prepare` through the CLI: the output named as a prefix or as a directory, and the
// line it prints naming the files it actually wrote; conversations (--jsonl) and their misuse.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/data/hf_test_tokenizer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class CliDataPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_cli_prepare_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/texts");
    std::ofstream(dir_ + "/texts/a.txt") << std::string(2000, 'a') << "\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Runs `strata data prepare` with `args`; returns the exit status, fills stdout and stderr.
  int prepare(const std::string& args, std::string& out, std::string& err) const {
    const std::string cmd = std::string("'") + STRATA_BINARY + "' data prepare --input '" + dir_ +
                            "/texts' " + args + " >'" + dir_ + "/out.txt' 2>'" + dir_ + "/err.txt'";
    const int status = std::system(cmd.c_str());
    out = read(dir_ + "/out.txt");
    err = read(dir_ + "/err.txt");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Runs `strata ARGS`; returns the exit status, fills stdout and stderr.
  int strata(const std::string& args, std::string& out, std::string& err) const {
    const std::string cmd = std::string("'") + STRATA_BINARY + "' " + args + " >'" + dir_ +
                            "/out.txt' 2>'" + dir_ + "/err.txt'";
    const int status = std::system(cmd.c_str());
    out = read(dir_ + "/out.txt");
    err = read(dir_ + "/err.txt");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(CliDataPrepareTest, AnExistingDirectoryGetsTheFilesInsideIt) {
  fs::create_directories(dir_ + "/data");
  std::string out, err;
  ASSERT_EQ(prepare("--output '" + dir_ + "/data' --val-fraction 0.1", out, err), 0) << err;
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/data/train.bin"));
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/data/val.bin"));
  EXPECT_FALSE(fs::exists(dir_ + "/data_train.bin"));
  EXPECT_NE(out.find("-> " + dir_ + "/data/train.bin, " + dir_ + "/data/val.bin"),
            std::string::npos)
      << out;
}

TEST_F(CliDataPrepareTest, APrefixGetsFilesBesideIt) {
  std::string out, err;
  ASSERT_EQ(prepare("--output '" + dir_ + "/corpus' --format megatron", out, err), 0) << err;
  EXPECT_NE(out.find("-> " + dir_ + "/corpus_train.bin, " + dir_ + "/corpus_train.idx\n"),
            std::string::npos)
      << out;
}

TEST_F(CliDataPrepareTest, AnOutputUnderAFileExitsTwoWithoutASourceLocation) {
  std::ofstream(dir_ + "/plain") << "x";
  std::string out, err;
  EXPECT_EQ(prepare("--output '" + dir_ + "/plain/corpus'", out, err), 2) << err;
  EXPECT_NE(err.find("cannot create output directory " + dir_ + "/plain"), std::string::npos)
      << err;
  EXPECT_EQ(err.find(".cc:"), std::string::npos) << err;
}

TEST_F(CliDataPrepareTest, ConversationsWithTheirTemplateAndMisuseExitingTwo) {
  data::test_util::Builder b;
  b.add("<|im_start|>");
  b.add("<|im_end|>");
  fs::create_directories(dir_ + "/tok");
  std::ofstream(dir_ + "/tok/tokenizer.json") << b.build().dump();
  std::ofstream(dir_ + "/tok/chat_template.jinja")
      << "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + "
         "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<|im_start|>assistant\n' }}{% endif %}";
  std::ofstream(dir_ + "/c.jsonl")
      << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      << "\n"
      << R"({"prompt": "2+2?", "completion": "4"})"
      << "\n";
  const std::string jsonl = "data prepare --jsonl '" + dir_ + "/c.jsonl' ";
  const std::string tok = "--tokenizer '" + dir_ + "/tok' ";
  std::string out, err;
  ASSERT_EQ(strata(jsonl + tok + "--output '" + dir_ + "/sft/' --seq-len 64", out, err), 0) << err;
  EXPECT_NE(out.find("2 conversations, 51 train tokens (7 trained"), std::string::npos) << out;
  EXPECT_NE(out.find("chat template from " + dir_ + "/tok/chat_template.jinja"), std::string::npos)
      << out;
  EXPECT_NE(out.find("packed first-fit into 1 windows of 64"), std::string::npos) << out;
  for (const char* f : {"train.bin", "train.idx", "train.lossmask"}) {
    EXPECT_TRUE(fs::is_regular_file(dir_ + "/sft/" + f)) << f;
  }
  ASSERT_EQ(strata("data inspect '" + dir_ + "/sft/train'", out, err), 0) << err;
  EXPECT_NE(out.find("loss mask: 7 of the 51 tokens trained"), std::string::npos) << out;

  const std::pair<std::string, std::string> misuse[] = {
      {jsonl + "--output x", "needs --tokenizer"},
      {jsonl + tok + "--format llmc --output x", "drop --format llmc"},
      {jsonl + tok + "--input '" + dir_ + "/texts' --output x", "not both"},
      {"data prepare --output x", "needs --input (text files) or --jsonl"},
      {jsonl + tok + "--train-on prompts --output x", "--train-on"},
  };
  for (const auto& [args, says] : misuse) {
    EXPECT_EQ(strata(args, out, err), 2) << args;
    EXPECT_NE(err.find(says), std::string::npos) << args << ": " << err;
  }
  EXPECT_FALSE(fs::exists("x_train.bin"));
}

}  // namespace
}  // namespace strata
