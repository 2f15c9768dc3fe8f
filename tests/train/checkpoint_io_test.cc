// Checkpoint I/O failures against damage: a failed write, fsync, rename or read (a full disk, a
// failing one, a file where a directory should be) is a runtime Error (exit 1, which the elastic
// supervisor retries from the previous checkpoint) and leaves that previous checkpoint loadable;
// what the files hold stays an InputError (exit 2). `ckpt verify` checks each data file's
// safetensors header against the manifest.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "strata/ckpt/store.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// What a call threw: "input: ...", "runtime: ..." or "none".
template <typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return std::string("input: ") + e.what();
  } catch (const Error& e) {
    return std::string("runtime: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "none";
}

bool starts(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

// Sets STRATA_CKPT_FAIL_IO for one scope.
struct FailIo {
  explicit FailIo(const char* call) { ::setenv("STRATA_CKPT_FAIL_IO", call, 1); }
  ~FailIo() { ::unsetenv("STRATA_CKPT_FAIL_IO"); }
};

class CheckpointIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_checkpoint_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::vector<int32_t> tokens(10000);
    const uint64_t key = rng_key(5, "checkpoint_io_test");
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng_uniform(key, i) * 64) % 64;
    data::write_llmc_shard((dir_ / "train.bin").string(), tokens, false);
    dataset_ = data::open_dataset((dir_ / "train.bin").string(), "auto");
    Config cfg = parse_config({{"train_batch_size", 4},
                               {"train_micro_batch_size_per_gpu", 4},
                               {"steps_per_print", 0},
                               {"model", {{"preset", "gpt2-tiny"}}}});
    resolve_batch(cfg, 1);
    engine_ = std::make_unique<Engine>(cfg, dataset_.get());
  }
  void TearDown() override {
    engine_.reset();
    dataset_.reset();
    fs::remove_all(dir_);
  }
  // A checkpoint of step 1 under root.
  std::string saved_step1(const std::string& name) {
    const std::string root = (dir_ / name).string();
    engine_->train_batch();
    engine_->save_checkpoint(root);
    return root;
  }

  fs::path dir_;
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(CheckpointIo, AFailedWriteFsyncOrRenameIsARuntimeErrorAndKeepsThePreviousCheckpoint) {
  const std::string root = saved_step1("ckpt");
  engine_->train_batch();
  for (const char* call : {"write", "fsync", "rename"}) {
    FailIo fail(call);
    const std::string e = thrown([&] { engine_->save_checkpoint(root); });
    EXPECT_TRUE(starts(e, "runtime: ")) << call << ": " << e;
    EXPECT_NE(e.find("Input/output error"), std::string::npos) << call << ": " << e;
  }
  EXPECT_EQ(engine_->load_checkpoint(root).step, 1);
}

TEST_F(CheckpointIo, AFullDiskIsARuntimeError) {
  std::vector<ckpt::PendingChunk> chunks(1);
  const std::vector<float> data(1024, 1.0f);
  chunks[0].meta.kind = "master", chunks[0].meta.tensor = "w", chunks[0].meta.numel = 1024;
  chunks[0].data = data.data();
  const std::string e = thrown([&] { ckpt::write_rank_file("/dev/full", chunks); });
  EXPECT_TRUE(starts(e, "runtime: ")) << e;
  EXPECT_NE(e.find("/dev/full"), std::string::npos) << e;
  EXPECT_NE(e.find("free space"), std::string::npos) << e;
}

TEST_F(CheckpointIo, AFileWhereTheDirectoryShouldBeIsARuntimeError) {
  std::ofstream(dir_ / "taken") << "x";
  engine_->train_batch();
  const std::string e = thrown([&] { engine_->save_checkpoint((dir_ / "taken").string()); });
  EXPECT_TRUE(starts(e, "runtime: ")) << e;
}

TEST_F(CheckpointIo, AFailedReadIsARuntimeErrorAndDamageStaysAnInputError) {
  const std::string root = saved_step1("ckpt");
  {
    FailIo fail("read");
    const std::string e = thrown([&] { engine_->load_checkpoint(root); });
    EXPECT_TRUE(starts(e, "runtime: ")) << e;
  }
  const fs::path data = fs::path(ckpt::latest_checkpoint(root)) / ckpt::rank_file_name(0);
  fs::resize_file(data, fs::file_size(data) - 4);
  const std::string e = thrown([&] { engine_->load_checkpoint(root); });
  EXPECT_TRUE(starts(e, "input: ")) << e;
}

// The header's bytes, in place: a chunk renamed (same length, so the JSON stays valid and every
// CRC still matches) is a header the manifest does not describe.
TEST_F(CheckpointIo, VerifyChecksEachDataFilesSafetensorsHeader) {
  const std::string root = saved_step1("ckpt");
  const std::string step = ckpt::latest_checkpoint(root);
  const fs::path data = fs::path(step) / ckpt::rank_file_name(0);
  EXPECT_EQ(thrown([&] { ckpt::Reader(step).verify_all(); }), "none");
  std::string bytes;
  {
    std::ifstream in(data, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    bytes = s.str();
  }
  const size_t at = bytes.find("\"master/");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 8, "\"mastex/");
  std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
  const std::string e = thrown([&] { ckpt::Reader(step).verify_all(); });
  EXPECT_TRUE(starts(e, "input: ")) << e;
  EXPECT_NE(e.find(data.string()), std::string::npos) << e;
  EXPECT_NE(e.find("safetensors header"), std::string::npos) << e;

  // The command says so and exits 2.
  const std::string out = (dir_ / "verify.txt").string();
  const int status = std::system(
      ("'" + std::string(STRATA_BINARY) + "' ckpt verify '" + step + "' >'" + out + "' 2>&1")
          .c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(ckpt::rank_file_name(0)), std::string::npos) << text.str();
}

TEST_F(CheckpointIo, VerifyRefusesAHeaderThatDoesNotParse) {
  const std::string root = saved_step1("ckpt");
  const std::string step = ckpt::latest_checkpoint(root);
  const fs::path data = fs::path(step) / ckpt::rank_file_name(0);
  std::fstream f(data, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(8);
  f.write("[", 1);  // the header's opening brace
  f.close();
  const std::string e = thrown([&] { ckpt::Reader(step).verify_all(); });
  EXPECT_TRUE(starts(e, "input: ")) << e;
  EXPECT_NE(e.find(data.string()), std::string::npos) << e;
}

}  // namespace
}  // namespace strata
