// `strata data prepare` through the CLI: the output named as a prefix or as a directory, and the
// line it prints naming the files it actually wrote.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace
}  // namespace strata
