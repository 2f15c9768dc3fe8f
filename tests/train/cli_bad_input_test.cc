// `strata train` on each malformed config of tests/train/bad_configs exits with status 2 (bad
// input) and prints the same message the parser test expects on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/train/bad_configs.h"

namespace strata {
namespace {

using testing::BadConfig;

class CliBadInputTest : public ::testing::TestWithParam<BadConfig> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_cli_bad_input_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_P(CliBadInputTest, ExitsTwoWithTheMessageOnStderr) {
  const BadConfig& b = GetParam();
  const std::string err = dir_ + "/stderr.txt";
  const std::string cmd = std::string("'") + STRATA_BINARY + "' train --config '" + b.path +
                          "' --steps 1 --run-dir '" + dir_ + "/run' >/dev/null 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  std::ifstream in(err);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(WEXITSTATUS(status), 2) << cmd << "\nstderr: " << text.str();
  EXPECT_NE(text.str().find(b.expect), std::string::npos)
      << b.name << "\n  stderr: " << text.str() << "\n  expected: " << b.expect;
}

INSTANTIATE_TEST_SUITE_P(Files, CliBadInputTest, ::testing::ValuesIn(testing::bad_configs()),
                         testing::bad_config_name);

}  // namespace
}  // namespace strata
