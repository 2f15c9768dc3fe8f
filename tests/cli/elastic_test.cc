// `strata elastic`: prints the elasticity plan of a config (DeepSpeed's basic 10k example, see
// elasticity_test.cc) and exits 2 on a block DeepSpeed rejects or a world size off the list.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace strata {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class CliElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_cli_elastic_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes a config whose elasticity block is `block` and runs `strata elastic` on it.
  int run(const std::string& block, const std::string& extra = "") {
    const std::string cfg = dir_ + "/cfg.json";
    std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 1, "elasticity": )" << block << "}";
    const std::string cmd = std::string("'") + STRATA_BINARY + "' elastic --config '" + cfg + "' " +
                            extra + " >'" + dir_ + "/out' 2>'" + dir_ + "/err'";
    const int status = std::system(cmd.c_str());
    out_ = read_text(dir_ + "/out");
    err_ = read_text(dir_ + "/err");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string dir_, out_, err_;
};

constexpr const char* kBasic10k =
    R"({"enabled": true, "max_train_batch_size": 10000, "micro_batch_sizes": [8, 12, 16, 17],
        "min_gpus": 32, "max_gpus": 1500, "version": 0.1})";

TEST_F(CliElasticTest, PrintsBatchWorldSizesAndStep) {
  ASSERT_EQ(run(kBasic10k, "-n 64"), 0) << err_;
  EXPECT_TRUE(contains(out_, "train_batch_size 9792\n")) << out_;
  EXPECT_TRUE(contains(out_, "valid world sizes (23): 32 34 36 48 51 64 ")) << out_;
  EXPECT_TRUE(contains(out_, "micro batch 17 x accumulation 9 x dp 64 = 9792")) << out_;
}

TEST_F(CliElasticTest, BadBlockOrWorldSizeExitsTwo) {
  EXPECT_EQ(run(kBasic10k, "-n 128"), 2);
  EXPECT_TRUE(contains(err_, "world size 128 is not valid")) << err_;
  EXPECT_EQ(run(R"({"enabled": true, "max_train_batch_size": 10000, "micro_batch_sizes": [8],
                    "num_gpus_per_node": 8, "model_parallel_size": 16})"),
            2);
  EXPECT_TRUE(contains(err_, "elasticity.num_gpus_per_node=8 is not divisible")) << err_;
  EXPECT_FALSE(contains(err_, ".cc:")) << err_;
  EXPECT_EQ(run(R"({"enabled": false})"), 2);
  EXPECT_TRUE(contains(err_, "elasticity.enabled is false")) << err_;
}

}  // namespace
}  // namespace strata
