// Every file in tests/config/bad_configs is refused with an InputError whose message contains the
// text of its .expect file (the key path, the value given, what is allowed).
#include "tests/config/bad_configs.h"

#include <gtest/gtest.h>

#include "strata/config/config.h"
#include "strata/core/check.h"

namespace strata {
namespace {

using testing::BadConfig;

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, RefusedWithMessageNamingTheKey) {
  const BadConfig& b = GetParam();
  ASSERT_FALSE(b.expect.empty()) << b.name << ".expect is missing or empty";
  try {
    Config c = load_config(b.path);
    resolve_batch(c, 1);  // what the CLI does at one process
    FAIL() << b.name << " was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(b.expect), std::string::npos)
        << b.name << "\n  message: " << e.what() << "\n  expected: " << b.expect;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BadConfigTest, ::testing::ValuesIn(testing::bad_configs()),
                         testing::bad_config_name);

TEST(BadConfigs, AtLeastTwentyFiveEachWithItsExpectation) {
  const std::vector<BadConfig> all = testing::bad_configs();
  EXPECT_GE(all.size(), 25u);
  for (const BadConfig& b : all) EXPECT_FALSE(b.expect.empty()) << b.name;
}

}  // namespace
}  // namespace strata
