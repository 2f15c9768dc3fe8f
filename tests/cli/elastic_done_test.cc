// `strata launch --elastic` counts a `done` that arrives after mpirun has exited, while it drains
// the ranks' last words: the job finished and is not retried. mpirun is a stand-in script here (a
// rank whose line outlives mpirun by a few milliseconds, as a remote rank's can), so the test is
// fast and needs no MPI.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/cli/fixture.h"

namespace strata {
namespace {

class CliElasticDoneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_cli_elastic_done");
    ASSERT_FALSE(dir_.empty());
    std::filesystem::create_directories(dir_ + "/bin");
    std::ofstream(dir_ + "/tiny.json")
        << R"({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
               "model": {"preset": "gpt2-tiny"}})";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes the stand-in mpirun: one rank says hello and its steps; `finish` runs after.
  void fake_mpirun(const std::string& finish) {
    const std::string path = dir_ + "/bin/mpirun";
    std::ofstream(path) << "#!/bin/bash\n"
                           "exec 3<>\"/dev/tcp/${STRATA_SUPERVISOR%:*}/${STRATA_SUPERVISOR##*:}\"\n"
                           "printf 'hello %s 0 1 %s fake\\nstep 0\\nstep 1\\n' "
                           "\"$STRATA_ATTEMPT\" $$ >&3\n"
                        << finish << "\n";
    ::chmod(path.c_str(), 0755);
  }
  int run(std::string* out) {
    const std::string outf = dir_ + "/out.txt";
    const std::string cmd = "PATH='" + dir_ + "/bin':\"$PATH\" timeout 60 '" +
                            std::string(STRATA_BINARY) +
                            "' launch --elastic -n 1 --max-restarts 0 -- train --config " + dir_ +
                            "/tiny.json --run-dir " + dir_ + "/run --set 'checkpoint.dir=\"" +
                            dir_ + "/ckpt\"' >'" + outf + "' 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(outf);
    std::stringstream text;
    text << in.rdbuf();
    *out = text.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  std::string dir_;
};

TEST_F(CliElasticDoneTest, ADoneThatArrivesAfterMpirunExitedCounts) {
  // The rank's `done` comes 300 ms after mpirun exited 0 (the supervisor used to stop listening
  // after 100 ms of quiet, and judged by the `done`s counted before).
  fake_mpirun("(sleep 0.3; printf 'done\\n' >&3) &\nexit 0");
  std::string out;
  EXPECT_EQ(run(&out), 0) << out;
  EXPECT_NE(out.find("elastic: done after 0 restart(s)"), std::string::npos) << out;
}

TEST_F(CliElasticDoneTest, ARankThatNeverSaidDoneIsAFailure) {
  fake_mpirun("exit 0");
  std::string out;
  EXPECT_NE(run(&out), 0) << out;
  EXPECT_NE(out.find("giving up after 0 restart(s)"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
