// Validation through the engine (Engine::evaluate): the loss of the validation windows in order,
// averaged over every target token as a step's loss is; it moves neither the training (a run that
// evaluates between steps trains bit-identically to one that does not) nor the parameters, and
// allocates nothing after the first evaluation.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/data/sampler.h"
#include "strata/train/engine.h"
#include "tests/alloc_hooks.h"
#include "tests/data/data_test_util.h"

namespace strata {
namespace {

using data::test_util::VectorDataset;

std::vector<int32_t> pattern(size_t n, int a, int b) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * size_t(a) + i / size_t(b)) % 64);
  return t;
}

class EvalTest : public ::testing::Test {
 protected:
  EvalTest() : train_(pattern(6000, 7, 13)), val_(pattern(1500, 5, 11)) {}

  static Config config(const std::string& preset, int micro = 4) {
    Config cfg = parse_config({{"train_batch_size", 8},
                               {"train_micro_batch_size_per_gpu", micro},
                               {"steps_per_print", 0},
                               {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
                               {"model", {{"preset", preset}}}});
    resolve_batch(cfg, 1);
    return cfg;
  }

  VectorDataset train_, val_;
};

// A run that evaluates after every step trains exactly as one that never does.
TEST_F(EvalTest, EvaluatingLeavesTrainingBitIdentical) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const Config cfg = config(preset);
    Engine plain(cfg, &train_), evaluated(cfg, &train_);
    evaluated.set_validation(val_);
    for (int s = 0; s < 6; ++s) {
      const double val = evaluated.evaluate(3);
      EXPECT_TRUE(std::isfinite(val));
      EXPECT_EQ(evaluated.train_batch().loss, plain.train_batch().loss) << preset << " step " << s;
      EXPECT_EQ(evaluated.consumed_samples(), plain.consumed_samples());
    }
  }
}

// The loss of windows 0.., in order, over every target token; the same again (the parameters did
// not move); the same at another micro-batch split.
TEST_F(EvalTest, ValLossIsTheMeanOverTheWindowsInOrder) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Config cfg = config(preset, 8);
    Engine engine(cfg, &train_);
    engine.set_validation(val_);
    for (int s = 0; s < 3; ++s) engine.train_batch();
    const double got = engine.evaluate(2);
    EXPECT_EQ(engine.evaluate(2), got);
    const int T = cfg.model.seq_len;
    const data::Sampler windows(val_, T, cfg.train.seed);
    std::vector<int32_t> in(size_t(8 * T)), tg(size_t(8 * T));
    double sum = 0.0;
    for (int i = 0; i < 2; ++i) {
      for (int b = 0; b < 8; ++b) {
        windows.get_window(i * 8 + b, in.data() + b * T, tg.data() + b * T);
      }
      sum += engine.model().forward(in.data(), tg.data(), 0.0f, false);
    }
    EXPECT_NEAR(got, sum / (16.0 * T), 1e-6 * got) << preset;

    // A twin taking each batch as two micro-batches of 4, trained the same way.
    Engine split(config(preset, 4), &train_);
    split.set_validation(val_);
    for (int s = 0; s < 3; ++s) split.train_batch();
    EXPECT_NEAR(split.evaluate(2), got, 1e-6 * got) << preset;
  }
}

// More batches than the set holds: the windows repeat from the first.
TEST_F(EvalTest, WindowsWrapAroundASmallSet) {
  const Config cfg = config("gpt2-tiny", 8);
  // 16 windows exactly: 2 batches of 8.
  VectorDataset small(pattern(size_t(16 * cfg.model.seq_len + 1), 3, 7));
  Engine engine(cfg, &train_);
  engine.set_validation(small);
  EXPECT_EQ(engine.val_windows(), 16);
  EXPECT_NEAR(engine.evaluate(4), engine.evaluate(2), 1e-6);
}

TEST_F(EvalTest, ValidationOfAnotherVocabularyIsAnInputError) {
  const Config cfg = config("gpt2-tiny");
  std::vector<int32_t> ids = pattern(1000, 5, 11);
  ids[500] = cfg.model.vocab + 3;
  VectorDataset wide(ids);
  Engine engine(cfg, &train_);
  data::test_util::expect_input_error([&] { engine.set_validation(wide); },
                                      {"validation data", "model.vocab", "another vocabulary"});
  VectorDataset tiny(pattern(size_t(cfg.model.seq_len), 5, 11));  // not one window
  EXPECT_THROW(engine.set_validation(tiny), InputError);
}

// After the first evaluation (primitive creation), an evaluation allocates nothing.
TEST_F(EvalTest, EvaluationAllocatesNothing) {
#ifdef STRATA_NO_ALLOC_HOOKS
  GTEST_SKIP() << test::kNoAllocHooks;
#else
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Engine engine(config(preset), &train_);
    engine.set_validation(val_);
    engine.train_batch();
    engine.evaluate(2);
    test::start_counting();
    engine.evaluate(2);
    const test::AllocReport r = test::stop_counting();
    EXPECT_TRUE(test::allocates_nothing_of_its_own(r)) << preset << "\n" << r.describe();
  }
#endif
}

}  // namespace
}  // namespace strata
