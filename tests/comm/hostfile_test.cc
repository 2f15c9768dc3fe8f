#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "strata/comm/topology.h"
#include "strata/core/check.h"

namespace strata::comm {
namespace {

class Hostfile : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ =
        (std::filesystem::temp_directory_path() / ("strata_hostfile_" + std::to_string(::getpid())))
            .string();
    std::ofstream(path_) << text;
    return path_;
  }
  // The InputError message of parsing text.
  std::string error_of(const std::string& text) {
    try {
      parse_hostfile(write(text));
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  std::string path_;
};

TEST_F(Hostfile, ParsesOpenMpiSyntax) {
  const auto hosts = parse_hostfile(
      write("# cluster\n\nnode1 slots=4\n  node2   slots=4 max_slots=8  # trailing comment\n"
            "node3 count=2\nnode1 slots=2\n"));
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0], (std::pair<std::string, int>{"node1", 6}));  // named twice: slots add up
  EXPECT_EQ(hosts[1], (std::pair<std::string, int>{"node2", 4}));
  EXPECT_EQ(hosts[2], (std::pair<std::string, int>{"node3", 2}));
}

TEST_F(Hostfile, ErrorsNameTheFileAndLine) {
  std::string m = error_of("a slots=4\nb slots=x\n");
  EXPECT_NE(m.find(path_ + ":2: slots must be a positive integer, got \"x\""), std::string::npos)
      << m;
  m = error_of("a slots=4\n\nb\n");
  EXPECT_NE(m.find(path_ + ":3: host \"b\" has no slots=N"), std::string::npos) << m;
  m = error_of("a slots=4 gpus=8\n");
  EXPECT_NE(m.find(path_ + ":1: unknown hostfile entry \"gpus=8\""), std::string::npos) << m;
  m = error_of("a slots=0\n");
  EXPECT_NE(m.find(":1: slots must be a positive integer"), std::string::npos) << m;
  m = error_of("slots=4\n");
  EXPECT_NE(m.find(":1: expected a host name first"), std::string::npos) << m;
  m = error_of("# nothing\n\n");
  EXPECT_NE(m.find("lists no hosts"), std::string::npos) << m;
  try {
    parse_hostfile("/nonexistent/strata_hostfile");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open hostfile /nonexistent/strata_hostfile"),
              std::string::npos);
  }
}

TEST_F(Hostfile, FeedsTheTpPlacementCheck) {
  const auto hosts = parse_hostfile(write("a slots=2\nb slots=2\n"));
  EXPECT_NO_THROW(check_tp_within_hosts(RankGrid(4, 2, 1), hosts));
  EXPECT_THROW(check_tp_within_hosts(RankGrid(4, 4, 1), hosts), InputError);
}

}  // namespace
}  // namespace strata::comm
