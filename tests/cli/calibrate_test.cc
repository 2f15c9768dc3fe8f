// strata bench --calibrate through the CLI: the profile it writes reads back with the figures the
// planner divides by, on one rank (links estimated, saying so) and on two (links measured); an
// output it cannot write is an input error naming the path, leaving no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/cost/device_profile.h"
#include "tests/cli/fixture.h"
#include "tests/temp_dir_test.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class Calibrate : public test::TempDirTest {
 protected:
  // Exit status of `strata <args>`, its stderr in *err.
  int strata(const std::string& args, std::string* err = nullptr) {
    return run_binary(STRATA_BINARY, dir_.string(), args, err);
  }
  // The files under the test's directory but the binary's own output captures.
  std::vector<std::string> written() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name != "stdout.txt" && name != "stderr.txt" && name != "file") {
        out.push_back(e.path().string());
      }
    }
    return out;
  }
};

// What every calibration must hold for the planner to use it.
void expect_usable(const cost::DeviceProfile& p) {
  EXPECT_FALSE(p.gpu);
  EXPECT_EQ(p.name.rfind("cpu: ", 0), 0u) << p.name;
  EXPECT_EQ(p.devices_per_node, 0);
  EXPECT_GE(p.cores, 1);
  EXPECT_GE(p.threads_per_rank, 1);
  EXPECT_GT(p.memory_bytes, uint64_t(1) << 28);
  EXPECT_EQ(p.host_memory_bytes, p.memory_bytes);
  EXPECT_GT(p.fp32_flops, 1e8);
  EXPECT_GE(p.bf16_flops, 0.0);
  ASSERT_GE(p.gemm_efficiency.size(), 4u);
  for (size_t i = 0; i < p.gemm_efficiency.size(); ++i) {
    const auto& [flops, fraction] = p.gemm_efficiency[i];
    EXPECT_GT(fraction, 0.0) << flops;
    EXPECT_LE(fraction, 1.5) << flops;
    if (i > 0) {
      EXPECT_LT(p.gemm_efficiency[i - 1].first, flops);  // sorted, one point per size
    }
  }
  EXPECT_GT(p.memory_bytes_per_s, 1e8);
  EXPECT_GT(p.op_overhead_s, 0.0);
  EXPECT_FALSE(p.elementwise_bytes_per_s.empty());
  for (const auto& [family, rate] : p.elementwise_bytes_per_s) EXPECT_GT(rate, 1e7) << family;
  EXPECT_FALSE(p.attention_flops.empty());
  for (const auto& [T, rate] : p.attention_flops) EXPECT_GT(rate, 1e8) << T;
  EXPECT_GT(p.intra_node.bytes_per_s, 0.0);
  EXPECT_GE(p.intra_node.alpha_s, 0.0);
  EXPECT_GT(p.inter_node.bytes_per_s, 0.0);
  EXPECT_NE(p.source.find("measured by strata bench --calibrate on "), std::string::npos)
      << p.source;
  // The planner's time model takes it: a GEMM's time is finite and positive.
  EXPECT_GT(p.gemm_seconds(1e9, DType::BF16), 0.0);
  EXPECT_TRUE(std::isfinite(p.gemm_seconds(1e9, DType::F32)));
}

// The families whose block kernels were timed, and the sequence lengths attention was.
void expect_kernels(const cost::DeviceProfile& p, const std::vector<std::string>& families,
                    const std::vector<double>& seq_lens) {
  std::vector<std::string> f;
  for (const auto& [family, rate] : p.elementwise_bytes_per_s) f.push_back(family);
  EXPECT_EQ(f, families);
  std::vector<double> t;
  for (const auto& [T, rate] : p.attention_flops) t.push_back(T);
  EXPECT_EQ(t, seq_lens);
}

TEST_F(Calibrate, OneRankWritesAProfileThatReadsBack) {
  const std::string out = path("cache/strata/p.json");  // its directories are made
  std::string err;
  ASSERT_EQ(strata("bench --calibrate --output '" + out + "'", &err), 0) << err;
  const cost::DeviceProfile p = cost::read_profile(out);
  expect_usable(p);
  EXPECT_NE(p.source.find("1 rank x "), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("links not measured (one rank): run under strata launch -n 2"),
            std::string::npos)
      << p.source;
  EXPECT_DOUBLE_EQ(p.intra_node.alpha_s, 5e-6);
  EXPECT_EQ(p.inter_node.bytes_per_s, p.intra_node.bytes_per_s);
  // The generic shapes: M ∈ {64, 128, 256, 512, 1024, 4096} rows of C = 512's MLP products,
  // whose up and down share a FLOP count (one point a row count, keyed by rows too); a too long
  // call may be left out, never a short one.
  EXPECT_DOUBLE_EQ(p.gemm_efficiency.front().first, 2.0 * 64 * 2048 * 512);
  EXPECT_LE(p.gemm_efficiency.size(), 6u);
  EXPECT_GE(p.gemm_efficiency.size(), 5u);
  ASSERT_EQ(p.gemm_efficiency_rows.size(), p.gemm_efficiency.size());
  EXPECT_DOUBLE_EQ(p.gemm_efficiency_rows.front().first, 64);
  EXPECT_DOUBLE_EQ(p.gemm_efficiency_rows[1].first, 128);
  // Both families' block kernels, and attention at three lengths.
  expect_kernels(p, {"gpt2", "llama"}, {128, 512, 2048});
  // And `strata plan --device FILE` reads it.
  EXPECT_EQ(cost::load_profile(out, "/nonexistent").fp32_flops, p.fp32_flops);
}

TEST_F(Calibrate, TwoRanksMeasureTheirLinks) {
  const std::string out = path("p.json");
  std::string err;
  ASSERT_EQ(strata("launch -n 2 -- bench --calibrate --output '" + out + "'", &err), 0) << err;
  const cost::DeviceProfile p = cost::read_profile(out);
  expect_usable(p);
  EXPECT_NE(p.source.find("2 ranks x "), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("links measured: intra_node strata's all-reduce over 2 ranks"),
            std::string::npos)
      << p.source;
  EXPECT_NE(p.source.find("inter_node = intra_node (every rank on one host)"), std::string::npos)
      << p.source;
  EXPECT_GT(p.intra_node.bytes_per_s, 0.0);
  EXPECT_GT(p.intra_node.alpha_s, 0.0);
  EXPECT_EQ(p.inter_node.alpha_s, p.intra_node.alpha_s);
  EXPECT_EQ(p.inter_node.bytes_per_s, p.intra_node.bytes_per_s);
  EXPECT_EQ(written(), std::vector<std::string>{out});  // rank 0 alone writes
}

TEST_F(Calibrate, AModelsShapesMakeTheCurve) {
  // llama-tiny: C 32, 4 heads of 8, 2 key/value heads, ffn 64 (gate|up fused: 128 wide). QKV
  // (M, 64, 32) and MLP down (M, 32, 64) share 2·M·64·32 FLOPs; MLP up makes 2·M·128·32.
  const std::string out = path("p.json");
  std::string err;
  ASSERT_EQ(strata("bench --calibrate --model llama-tiny --output '" + out + "'", &err), 0) << err;
  std::vector<double> flops;
  for (const auto& [f, e] : cost::read_profile(out).gemm_efficiency) flops.push_back(f);
  std::vector<double> want;
  for (double M : {64, 128, 256, 512, 1024, 4096}) want.insert(want.end(), {4096 * M, 8192 * M});
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());  // M = 128's QKV is M = 64's up
  EXPECT_EQ(flops, want);
  EXPECT_EQ(strata("bench --calibrate --model no-such-model --output '" + out + "x'", &err), 2);
  EXPECT_NE(err.find("no-such-model"), std::string::npos) << err;
}

// A --config's model gives the shapes: its GEMMs, its family's elementwise kernels at its widths
// (and the other family's at the same C), attention at T/4 and T.
TEST_F(Calibrate, AConfigsModelGivesTheShapes) {
  {
    std::ofstream f(path("c.json"));
    f << R"({"train_micro_batch_size_per_gpu": 1, "model": {"family": "gpt2", "layers": 1,
             "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 64}})";
  }
  const std::string out = path("p.json");
  std::string err;
  ASSERT_EQ(
      strata("bench --calibrate --config '" + path("c.json") + "' --output '" + out + "'", &err), 0)
      << err;
  const cost::DeviceProfile p = cost::read_profile(out);
  expect_usable(p);
  std::vector<double> flops, want;
  for (const auto& [f, e] : p.gemm_efficiency) flops.push_back(f);
  // QKV (M, 192, 64); MLP up (M, 256, 64) and down (M, 64, 256) share a count; by rows, one
  // point a row count.
  for (double M : {64, 128, 256, 512, 1024, 4096}) {
    want.insert(want.end(), {24576 * M, 32768 * M});
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(flops, want);
  EXPECT_EQ(p.gemm_efficiency_rows.size(), 6u);
  expect_kernels(p, {"gpt2", "llama"}, {16, 64});
  EXPECT_EQ(strata("bench --calibrate --config '" + path("none.json") + "' --output '" + out + "x'",
                   &err),
            2);
  EXPECT_NE(err.find("none.json"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out + "x"));
}

TEST_F(Calibrate, AnOutputThatCannotBeWrittenIsAnInputErrorLeavingNoFile) {
  {
    std::ofstream f(path("file"));
    f << "a regular file\n";
  }
  const std::string under_file = path("file/p.json");
  std::string err;
  EXPECT_EQ(strata("bench --calibrate --output '" + under_file + "'", &err), 2);
  EXPECT_NE(err.find(under_file), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(under_file));
  // A directory is no profile's name; nothing appears in it.
  fs::create_directories(path("dir"));
  EXPECT_EQ(strata("bench --calibrate --output '" + path("dir") + "'", &err), 2);
  EXPECT_NE(err.find(path("dir") + " is a directory"), std::string::npos) << err;
  // Every rank of a job says so once, and exits 2.
  EXPECT_EQ(strata("launch -n 2 -- bench --calibrate --output '" + under_file + "'", &err), 2);
  EXPECT_NE(err.find(under_file), std::string::npos) << err;
  EXPECT_TRUE(written().empty());
}

TEST_F(Calibrate, AGpuIsNotCalibratedYet) {
  std::string err;
  EXPECT_EQ(strata("bench --calibrate --device cuda --output '" + path("p.json") + "'", &err), 2);
  EXPECT_NE(err.find("--calibrate --device cuda is not supported yet"), std::string::npos) << err;
  EXPECT_TRUE(written().empty());
}

}  // namespace
}  // namespace strata
