// The malformed configs of tests/config/bad_configs: NN_name.json, each with NN_name.expect holding
// the text its error message must contain. Shared by the parser test and the CLI test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace strata::testing {

struct BadConfig {
  std::string name;    // file stem, e.g. "02_misspelt_zero_stage"
  std::string path;    // the .json
  std::string expect;  // substring of the error message
};

inline std::string bad_configs_dir() {
  return std::string(STRATA_SOURCE_DIR) + "/tests/config/bad_configs";
}

inline std::vector<BadConfig> bad_configs() {
  std::vector<BadConfig> out;
  for (const auto& entry : std::filesystem::directory_iterator(bad_configs_dir())) {
    if (entry.path().extension() != ".json") continue;
    BadConfig b;
    b.name = entry.path().stem().string();
    b.path = entry.path().string();
    std::filesystem::path expect = entry.path();
    expect.replace_extension(".expect");
    std::ifstream in(expect);
    std::getline(in, b.expect);  // empty when missing: the test reports it
    out.push_back(b);
  }
  std::sort(out.begin(), out.end(),
            [](const BadConfig& a, const BadConfig& b) { return a.name < b.name; });
  return out;
}

inline std::string bad_config_name(const ::testing::TestParamInfo<BadConfig>& info) {
  return info.param.name;
}

}  // namespace strata::testing
