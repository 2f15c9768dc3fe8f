// `strata` on bad input through the CLI: each malformed config of tests/config/bad_configs exits
// with status 2 (bad input) and prints the message the parser test expects on stderr; a config
// nested 100000 levels deep, an unreadable config and a missing data file exit 2 too, and a model
// too large for memory exits 1. None of these messages shows a source location (".cc:"): those
// are for broken invariants, not for what a user can fix.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/data/llmc_shard.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "tests/config/bad_configs.h"

namespace strata {
namespace {

using testing::BadConfig;

std::string temp_dir() {
  char tmpl[] = "/tmp/strata_cli_bad_input_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Result {
  int code = -1;  // the exit status; -1 when a signal ended the process
  std::string err;
};

// Runs `strata <args>` with stdout discarded.
Result run_strata(const std::string& dir, const std::string& args) {
  const std::string err = dir + "/stderr.txt";
  const std::string cmd =
      std::string("'") + STRATA_BINARY + "' " + args + " >/dev/null 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  Result r;
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  r.err = read_text(err);
  return r;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class CliBadInputTest : public ::testing::TestWithParam<BadConfig> {
 protected:
  void SetUp() override { dir_ = temp_dir(); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_P(CliBadInputTest, ExitsTwoWithTheMessageOnStderr) {
  const BadConfig& b = GetParam();
  const Result r =
      run_strata(dir_, "train --config '" + b.path + "' --steps 1 --run-dir '" + dir_ + "/run'");
  EXPECT_EQ(r.code, 2) << b.name << "\nstderr: " << r.err;
  EXPECT_TRUE(contains(r.err, b.expect))
      << b.name << "\n  stderr: " << r.err << "\n  expected: " << b.expect;
  EXPECT_FALSE(contains(r.err, ".cc:")) << b.name << " shows a source location: " << r.err;
}

INSTANTIATE_TEST_SUITE_P(Files, CliBadInputTest, ::testing::ValuesIn(testing::bad_configs()),
                         testing::bad_config_name);

class CliInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    std::vector<int32_t> tokens(2000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 64);
    data::write_llmc_shard(dir_ + "/tokens.bin", tokens, false);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::permissions(dir_ + "/locked.json", std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << text;
  }
  // `strata train` on config `name` (in the temp directory) with `extra` arguments.
  Result train(const std::string& name, const std::string& extra = "") const {
    return run_strata(dir_, "train --config '" + dir_ + "/" + name + "' --steps 1 --run-dir '" +
                                dir_ + "/run' " + extra);
  }
  std::string dir_;
};

// 100000 levels of objects or arrays: the recursive parts of a JSON library (copying, printing,
// destroying a tree) would overflow the stack; the parser stops at the limit first.
TEST_F(CliInputTest, DeeplyNestedConfigExitsTwoNamingTheDepthLimit) {
  const int levels = 100000;
  std::string objects, arrays;
  for (int i = 0; i < levels; ++i) objects += "{\"a\":", arrays += "[";
  objects += "1", arrays += "1";
  objects += std::string(levels, '}'), arrays += std::string(levels, ']');
  write("objects.json", objects);
  write("arrays.json", arrays);
  write("model_arrays.json", "{\"train_micro_batch_size_per_gpu\": 1, \"model\": " + arrays + "}");
  const std::string limit = "nests deeper than " + std::to_string(kMaxConfigDepth) + " levels";
  for (const char* name : {"objects.json", "arrays.json", "model_arrays.json"}) {
    const Result r = train(name);
    EXPECT_EQ(r.code, 2) << name << " (-1: killed by a signal)\nstderr: " << r.err.substr(0, 500);
    EXPECT_TRUE(contains(r.err, limit)) << name << ": " << r.err.substr(0, 500);
    EXPECT_TRUE(contains(r.err, name)) << r.err.substr(0, 500);
    EXPECT_FALSE(contains(r.err, ".cc:")) << r.err.substr(0, 500);
  }
  // A --set value is JSON too (50000 levels: one argument stays under Linux's 128 KiB).
  write("ok.json", "{\"train_micro_batch_size_per_gpu\": 1}");
  const std::string deep_set = std::string(50000, '[') + std::string(50000, ']');
  const Result r = train("ok.json", "--set 'model=" + deep_set + "'");
  EXPECT_EQ(r.code, 2) << r.err.substr(0, 500);
  EXPECT_TRUE(contains(r.err, limit)) << r.err.substr(0, 500);
}

TEST_F(CliInputTest, FileErrorsExitTwoWithoutASourceLocation) {
  write("tiny.json", R"({"train_micro_batch_size_per_gpu": 1, "model": {"preset": "gpt2-tiny"}})");
  std::filesystem::create_directory(dir_ + "/a_directory.json");
  const Result dir_config = train("a_directory.json");
  EXPECT_EQ(dir_config.code, 2) << dir_config.err;
  EXPECT_TRUE(contains(dir_config.err, "a_directory.json is a directory")) << dir_config.err;
  EXPECT_FALSE(contains(dir_config.err, ".cc:")) << dir_config.err;

  const Result not_dir = train("tiny.json/inside.json");
  EXPECT_EQ(not_dir.code, 2) << not_dir.err;
  EXPECT_TRUE(contains(not_dir.err, "cannot read the config file")) << not_dir.err;
  EXPECT_TRUE(contains(not_dir.err, "Not a directory")) << not_dir.err;
  EXPECT_FALSE(contains(not_dir.err, ".cc:")) << not_dir.err;

  const Result missing = train("tiny.json", "--data '" + dir_ + "/missing.bin'");
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_TRUE(contains(missing.err, "missing.bin")) << missing.err;
  EXPECT_FALSE(contains(missing.err, ".cc:")) << missing.err;

  const Result dir_data = train("tiny.json", "--data '" + dir_ + "/a_directory.json'");
  EXPECT_EQ(dir_data.code, 2) << dir_data.err;
  EXPECT_FALSE(contains(dir_data.err, ".cc:")) << dir_data.err;

  if (::geteuid() == 0) return;  // root reads files without read permission
  write("locked.json", "{\"train_micro_batch_size_per_gpu\": 1}");
  std::filesystem::permissions(dir_ + "/locked.json", std::filesystem::perms::none);
  const Result locked = train("locked.json");
  EXPECT_EQ(locked.code, 2) << locked.err;
  EXPECT_TRUE(contains(locked.err, "cannot read the config file")) << locked.err;
  EXPECT_TRUE(contains(locked.err, "Permission denied")) << locked.err;
  EXPECT_FALSE(contains(locked.err, ".cc:")) << locked.err;
}

// STRATA_BF16_MATMUL names a path this build knows and this CPU has: anything else, and "native"
// on a CPU where oneDNN has no bf16 matmul (AVX2 only), exits 2 saying what to use instead.
TEST_F(CliInputTest, Bf16PathVariableExitsTwoUnlessThisCpuHasThePath) {
  write("tiny.json", R"({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 0,
      "model": {"preset": "gpt2-tiny"}})");
  ::setenv("STRATA_BF16_MATMUL", "fastest", 1);
  const Result bogus = train("tiny.json", "--data '" + dir_ + "/tokens.bin'");
  ::setenv("STRATA_BF16_MATMUL", "native", 1);
  const Result native = train("tiny.json", "--data '" + dir_ + "/tokens.bin'");
  ::unsetenv("STRATA_BF16_MATMUL");
  EXPECT_EQ(bogus.code, 2) << bogus.err;
  EXPECT_TRUE(contains(bogus.err, "STRATA_BF16_MATMUL=fastest is not a bf16 matmul path"))
      << bogus.err;
  EXPECT_FALSE(contains(bogus.err, ".cc:")) << bogus.err;
  if (kernels::cpu_features().onednn_bf16()) {
    EXPECT_EQ(native.code, 0) << native.err;
  } else {
    EXPECT_EQ(native.code, 2) << native.err;
    EXPECT_TRUE(contains(native.err, "oneDNN has no bf16 matmul on this CPU")) << native.err;
    EXPECT_TRUE(contains(native.err, "use widened")) << native.err;
    EXPECT_FALSE(contains(native.err, ".cc:")) << native.err;
  }
}

// 12·hidden² = 5·10^13 parameters: 192 TiB of fp32, more than any address space holds, so the
// allocation fails whatever the machine (no page is touched). A runtime failure: exit 1.
TEST_F(CliInputTest, ModelTooLargeForMemoryFailsWithWhatToChange) {
  write("huge.json", R"({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 0,
      "model": {"family": "gpt2", "layers": 1, "hidden": 2097152, "heads": 1, "vocab": 64,
                "seq_len": 16}})");
  const Result r = train("huge.json", "--data '" + dir_ + "/tokens.bin'");
  // Refused before anything is allocated: the predicted model states exceed the host's memory.
  EXPECT_EQ(r.code, 2) << "(-1: killed by a signal)\nstderr: " << r.err;
  EXPECT_TRUE(contains(r.err, "of memory")) << r.err;
  EXPECT_TRUE(contains(r.err, "zero_optimization.stage")) << r.err;
  EXPECT_FALSE(contains(r.err, ".cc:")) << r.err;
}

// A misspelt subcommand or flag names the word and the nearest valid one; a word nowhere near
// lists the choices instead. Each exits 2.
TEST(CliUsage, MisspeltCommandsAndFlagsGetASuggestion) {
  const std::string dir = temp_dir();
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {"trian --config x.json", "unknown command 'trian' of 'strata': did you mean 'train'?"},
      {"data prepar", "unknown command 'prepar' of 'strata data': did you mean 'prepare'?"},
      {"ckpt verfy /nonexistent",
       "unknown command 'verfy' of 'strata ckpt': did you mean 'verify'?"},
      {"train --config x.json --stpes 3",
       "unknown option --stpes of 'strata train': did you mean --steps?"},
      {"train --config x.json --resume=auto --run-dri d",
       "unknown option --run-dri of 'strata train': did you mean --run-dir?"},
      {"xyzzyqq", "unknown command 'xyzzyqq' of 'strata'; one of: train, launch"},
  };
  for (const Case& c : cases) {
    const Result r = run_strata(dir, c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.expect)) << c.args << "\n" << r.err;
  }
  // Known flags with values are not taken for misspellings.
  const Result ok = run_strata(dir, "train --config /nonexistent.json --steps 3 --run-dir d");
  EXPECT_EQ(ok.code, 2) << ok.err;
  EXPECT_FALSE(contains(ok.err, "unknown option")) << ok.err;
  std::filesystem::remove_all(dir);
}

TEST(CliUsage, VersionNamesTheReleaseAndTheBackends) {
  const std::string dir = temp_dir();
  const std::string out = dir + "/out.txt";
  const std::string cmd = std::string("'") + STRATA_BINARY + "' --version >'" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string text = read_text(out);
  EXPECT_TRUE(contains(text, "strata 0.")) << text;
  EXPECT_TRUE(contains(text, "backends: cpu (oneDNN ")) << text;
  // The CUDA backend as this build has it (the test is built with the same definitions).
#ifdef STRATA_HAVE_CUDA
  EXPECT_TRUE(contains(text, "cuda (CUDA ")) << text;
  EXPECT_TRUE(contains(text, " visible)")) << text;
  EXPECT_FALSE(contains(text, "not built")) << text;
#else
  EXPECT_TRUE(contains(text, "CUDA: not built into this binary")) << text;
#endif
  EXPECT_TRUE(contains(text, "MPI: ")) << text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
