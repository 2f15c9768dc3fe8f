// Dynamic loss scaling with DeepSpeed's rules (fp16/loss_scaler.py::DynamicLossScaler).
#include "strata/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <string>

#include "strata/core/check.h"

namespace strata {
namespace {

TEST(LossScaler, StartsAtTwoToTheInitialPower) {
  Fp16Config c;
  c.enabled = true;
  EXPECT_FLOAT_EQ(LossScaler(c).scale(), 65536.0f);
}

TEST(LossScaler, HysteresisDelaysTheFirstHalving) {
  Fp16Config c;
  c.initial_scale_power = 10, c.hysteresis = 2;
  LossScaler s(c);
  s.update(true);  // tolerated: hysteresis 2 -> 1
  EXPECT_FLOAT_EQ(s.scale(), 1024.0f);
  s.update(true);
  EXPECT_FLOAT_EQ(s.scale(), 512.0f);
  s.update(true);
  EXPECT_FLOAT_EQ(s.scale(), 256.0f);
}

TEST(LossScaler, DoublesAfterAWindowWithoutOverflow) {
  Fp16Config c;
  c.initial_scale_power = 4, c.loss_scale_window = 3, c.hysteresis = 1;
  LossScaler s(c);
  s.update(true);  // iter 0 overflows: 8, last_overflow = 0
  EXPECT_FLOAT_EQ(s.scale(), 8.0f);
  s.update(false);  // iter 1: (1-0)%3
  s.update(false);  // iter 2
  EXPECT_FLOAT_EQ(s.scale(), 8.0f);
  s.update(false);  // iter 3: (3-0)%3 == 0 -> double
  EXPECT_FLOAT_EQ(s.scale(), 16.0f);
}

TEST(LossScaler, NeverBelowMinimum) {
  Fp16Config c;
  c.initial_scale_power = 3, c.hysteresis = 1, c.min_loss_scale = 3.0f;
  LossScaler s(c);
  s.update(true);  // 8 -> 4
  s.update(true);  // 4 -> max(2, 3)
  EXPECT_FLOAT_EQ(s.scale(), 3.0f);
}

TEST(LossScaler, AnOverflowAtTheMinimumIsARuntimeError) {
  Fp16Config c;
  c.initial_scale_power = 1, c.hysteresis = 1, c.min_loss_scale = 1.0f;
  LossScaler s(c);
  s.update(true);  // 2 -> 1, the minimum
  EXPECT_FLOAT_EQ(s.scale(), 1.0f);
  try {
    s.update(true);
    FAIL() << "an overflow at the minimum scale must stop the run";
  } catch (const InputError&) {
    FAIL() << "an overflow is not bad input";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp16.min_loss_scale=1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 skipped steps in a row"), std::string::npos)
        << e.what();
  }
}

TEST(LossScaler, HysteresisAtTheMinimumIsSpentBeforeTheError) {
  // As DeepSpeed: the error comes where a halving would, once the hysteresis is used up.
  Fp16Config c;
  c.initial_scale_power = 0, c.hysteresis = 2, c.min_loss_scale = 1.0f;
  LossScaler s(c);
  s.update(true);  // tolerated: hysteresis 2 -> 1
  EXPECT_THROW(s.update(true), Error);
}

TEST(LossScaler, AGoodStepAtTheMinimumKeepsTraining) {
  Fp16Config c;
  c.initial_scale_power = 1, c.hysteresis = 1, c.min_loss_scale = 1.0f, c.loss_scale_window = 100;
  LossScaler s(c);
  s.update(true);   // 2 -> 1
  s.update(false);  // fits at the minimum
  EXPECT_FLOAT_EQ(s.scale(), 1.0f);
}

TEST(LossScaler, StaticScaleNeverChanges) {
  Fp16Config c;
  c.loss_scale = 128.0f;
  LossScaler s(c);
  s.update(true);
  for (int i = 0; i < 2000; ++i) s.update(false);
  EXPECT_FLOAT_EQ(s.scale(), 128.0f);
}

}  // namespace
}  // namespace strata
