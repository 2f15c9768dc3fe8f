// Which parameters weight decay applies to: Megatron's default (matrices and embeddings decay,
// biases and norm gains do not), chosen by optimizer.weight_decay_exclude, printed at start-up,
// and taken by the optimizer's step in the unpartitioned and the ZeRO-partitioned paths.
#include "strata/config/weight_decay.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/device_host.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(WeightDecay, MegatronsDefaultMatricesAndEmbeddingsDecayBiasesAndNormsDoNot) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    ModelSpec spec = build_model_spec(model_preset(preset));
    set_weight_decay(OptimizerConfig{}, spec);
    int biases = 0, norms = 0;
    for (const ParamSpec& p : spec.params) {
      const std::string g = weight_decay_group(p.role);
      // Megatron's rule: 1-D parameters (biases, norm gains) do not decay.
      EXPECT_EQ(p.decay, p.global_shape.size() >= 2) << preset << " " << p.name;
      EXPECT_EQ(g == "bias" || g == "norm", p.global_shape.size() == 1) << p.name;
      biases += g == "bias", norms += g == "norm";
    }
    EXPECT_GT(norms, 0) << preset;
    if (std::string(preset) == "gpt2-tiny") {
      EXPECT_GT(biases, 0);
    }
  }
}

TEST(WeightDecay, TheExcludeListChoosesTheGroups) {
  ModelSpec spec = build_model_spec(model_preset("gpt2-tiny"));
  OptimizerConfig o;
  o.weight_decay_exclude = {};
  set_weight_decay(o, spec);
  for (const ParamSpec& p : spec.params) EXPECT_TRUE(p.decay) << p.name;
  o.weight_decay_exclude = {"embedding", "bias"};
  set_weight_decay(o, spec);
  for (const ParamSpec& p : spec.params) {
    const std::string g = weight_decay_group(p.role);
    EXPECT_EQ(p.decay, g == "weight" || g == "norm") << p.name;
  }
}

TEST(WeightDecay, TheStartUpLineCountsBothSides) {
  const ModelSpec spec = build_model_spec(model_preset("gpt2-tiny"));
  int64_t on = 0, off = 0;
  for (const ParamSpec& p : spec.params) {
    int64_t n = 1;
    for (int64_t d : p.global_shape) n *= d;
    (p.global_shape.size() >= 2 ? on : off) += n;
  }
  OptimizerConfig o;
  o.weight_decay = 0.01f;
  const std::string line = weight_decay_summary(o, spec);
  ASSERT_LT(off, 1000);  // printed as is
  EXPECT_EQ(line.rfind("weight decay 0.01 on ", 0), 0u) << line;
  EXPECT_NE(line.find("not on " + std::to_string(off) + " (biases and norm gains)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("the attention, MLP and output matrices and the embeddings"),
            std::string::npos)
      << line;
  o.weight_decay_exclude = {};
  EXPECT_NE(weight_decay_summary(o, spec).find("on every parameter"), std::string::npos);
  o.weight_decay = 0.0f;
  EXPECT_EQ(weight_decay_summary(o, spec), "");
}

TEST(WeightDecay, TheConfigKeyIsCheckedAndParsed) {
  const nlohmann::json opt = {{"type", "AdamW"}, {"params", {{"weight_decay", 0.1}}}};
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1}, {"optimizer", opt}};
  EXPECT_EQ(parse_config(j).optimizer.weight_decay_exclude,
            (std::vector<std::string>{"bias", "norm"}));
  j["optimizer"]["weight_decay_exclude"] = nlohmann::json::array({"embedding"});
  EXPECT_EQ(parse_config(j).optimizer.weight_decay_exclude,
            (std::vector<std::string>{"embedding"}));
  j["optimizer"]["weight_decay_exclude"] = nlohmann::json::array({"biases"});
  try {
    parse_config(j);
    FAIL() << "\"biases\" is not a group";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.weight_decay_exclude must be a list of"),
              std::string::npos)
        << e.what();
  }
}

// One step with and without weight decay from the same initial weights: the gradient part of the
// update is the same, so a parameter that decays differs and one that does not is bit-identical.
class WeightDecayStep : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_weight_decay_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::vector<int32_t> tokens(10000);
    const uint64_t key = rng_key(9, "weight_decay_test");
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng_uniform(key, i) * 64) % 64;
    data::write_llmc_shard((dir_ / "train.bin").string(), tokens, false);
    dataset_ = data::open_dataset((dir_ / "train.bin").string(), "auto");
  }
  void TearDown() override {
    dataset_.reset();
    fs::remove_all(dir_);
  }
  // The parameters (fp32, by name) after one AdamW step.
  std::vector<std::vector<float>> step(double wd, const nlohmann::json& exclude, int zero_stage) {
    nlohmann::json opt = {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", wd}}}};
    if (!exclude.is_null()) opt["weight_decay_exclude"] = exclude;
    Config cfg = parse_config({{"train_batch_size", 4},
                               {"train_micro_batch_size_per_gpu", 4},
                               {"steps_per_print", 0},
                               {"optimizer", opt},
                               {"zero_optimization", {{"stage", zero_stage}}},
                               {"model", {{"preset", "gpt2-tiny"}}}});
    resolve_batch(cfg, 1);
    Engine e(cfg, dataset_.get());
    e.train_batch();
    std::vector<std::vector<float>> out;
    const std::vector<float> all = test::device_f32(e.params(), DType::F32, e.spec().numel);
    for (const ParamSpec& p : e.spec().params) {
      out.emplace_back(all.begin() + p.offset, all.begin() + p.offset + p.numel());
      names_.push_back(p.name), groups_.push_back(weight_decay_group(p.role));
    }
    return out;
  }
  // Per parameter: whether the two runs' values differ.
  std::vector<bool> differs(const nlohmann::json& exclude, int zero_stage) {
    const auto a = step(0.0, exclude, zero_stage);
    names_.clear(), groups_.clear();
    const auto b = step(0.5, exclude, zero_stage);
    std::vector<bool> d;
    for (size_t i = 0; i < a.size(); ++i) d.push_back(a[i] != b[i]);
    return d;
  }

  fs::path dir_;
  std::unique_ptr<data::TokenDataset> dataset_;
  std::vector<std::string> names_, groups_;
};

TEST_F(WeightDecayStep, AWeightDecaysANormGainDoesNotInEveryOptimizerPath) {
  for (int stage : {0, 1, 3}) {
    const std::vector<bool> d = differs(nullptr, stage);
    bool saw_weight = false, saw_norm = false;
    for (size_t i = 0; i < d.size(); ++i) {
      if (groups_[i] == "weight" || groups_[i] == "embedding") {
        EXPECT_TRUE(d[i]) << "stage " << stage << ": " << names_[i] << " should decay";
        saw_weight = true;
      } else {
        // Biases start at 0 (where decay has nothing to take); norm gains at 1.
        EXPECT_FALSE(d[i]) << "stage " << stage << ": " << names_[i] << " should not decay";
        saw_norm |= groups_[i] == "norm";
      }
    }
    EXPECT_TRUE(saw_weight && saw_norm);
  }
}

TEST_F(WeightDecayStep, ExcludingOnlyBiasesDecaysTheNormGains) {
  const std::vector<bool> d = differs(nlohmann::json::array({"bias"}), 0);
  for (size_t i = 0; i < d.size(); ++i) {
    if (names_[i].find("ln_") != std::string::npos &&
        names_[i].find(".weight") != std::string::npos) {
      EXPECT_TRUE(d[i]) << names_[i] << " should decay";
    }
  }
}

}  // namespace
}  // namespace strata
