// `strata schedule` through the CLI: the printed bubble, the trace file, and exit 2 naming the
// problem for bad arguments.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace strata {
namespace {

class ScheduleCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_schedule_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Runs strata with args in dir_; returns the exit status and fills stdout and stderr.
  int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
    const std::string cmd =
        "cd '" + dir_ + "' && '" + STRATA_BINARY + "' " + args + " >stdout.txt 2>stderr.txt";
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status)) << cmd;
    if (out) *out = read(dir_ + "/stdout.txt");
    if (err) *err = read(dir_ + "/stderr.txt");
    return WEXITSTATUS(status);
  }
  static size_t compute_events(const std::string& trace_path) {
    const nlohmann::json j = nlohmann::json::parse(read(trace_path));
    size_t n = 0;
    for (const auto& e : j["traceEvents"]) n += e["ph"] == "X";
    return n;
  }
  std::string dir_;
};

TEST_F(ScheduleCliTest, PrintsTheScheduleAndBubbleAndWritesTheTrace) {
  std::string out, err;
  ASSERT_EQ(
      run("schedule --pp 4 --micro 8 --schedule 1f1b --trace " + dir_ + "/t.json", &out, &err), 0)
      << err;
  // (p-1)/(m+p-1) = 3/11.
  EXPECT_NE(out.find("bubble fraction: 0.272727 simulated, 0.272727 closed form"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("stage 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("makespan: 33\n"), std::string::npos) << out;
  EXPECT_NE(out.find("peak in flight per stage: 4 3 2 1\n"), std::string::npos) << out;
  EXPECT_EQ(compute_events(dir_ + "/t.json"), 4u * 8u * 2u);
}

TEST_F(ScheduleCliTest, TraceWithoutAPathUsesTheDefaultName) {
  std::string out, err;
  ASSERT_EQ(
      run("schedule --pp 2 --micro 4 --schedule zero_bubble --costs 1,1,1 --trace", &out, &err), 0)
      << err;
  // ZB-H1 with equal costs: (p-1)/(3m+p-1) = 1/13.
  EXPECT_NE(out.find("bubble fraction: 0.076923 simulated, 0.076923 closed form"),
            std::string::npos)
      << out;
  EXPECT_EQ(compute_events(dir_ + "/schedule_zero_bubble_p2_m4.json"), 2u * 4u * 3u);
}

TEST_F(ScheduleCliTest, BadArgumentsExitTwo) {
  std::string err;
  EXPECT_EQ(run("schedule --pp 4 --micro 8 --schedule zb", nullptr, &err), 2);
  EXPECT_NE(err.find("unknown pipeline schedule 'zb'; valid schedules: gpipe, 1f1b, "
                     "interleaved, zero_bubble"),
            std::string::npos)
      << err;
  EXPECT_EQ(run("schedule --pp 4 --micro 6 --schedule interleaved --virtual 2", nullptr, &err), 2);
  EXPECT_NE(err.find("multiple of parallelism.pipeline"), std::string::npos) << err;
  EXPECT_EQ(run("schedule --pp 4 --micro 8 --schedule 1f1b --costs 1,2", nullptr, &err), 2);
  EXPECT_NE(err.find("--costs takes F,B,W"), std::string::npos) << err;
  EXPECT_EQ(run("schedule --pp 4 --schedule 1f1b", nullptr, &err), 2);
  EXPECT_NE(err.find("--micro"), std::string::npos) << err;
}

}  // namespace
}  // namespace strata
