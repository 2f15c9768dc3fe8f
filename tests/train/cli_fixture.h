// What the CLI tests that train share: a fresh temporary directory holding the small token shard
// they train on (4000 tokens of a fixed pattern over 64 ids, as `good.bin`).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/data/llmc_shard.h"

namespace strata {

// mkdtemp("/tmp/<prefix>_XXXXXX") with good.bin written in it; "" (and a test failure) if it
// cannot be made.
inline std::string make_cli_dir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << tmpl;
    return "";
  }
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + i / 13) % 64);
  data::write_llmc_shard(tmpl + "/good.bin", tokens, false);
  return tmpl;
}

}  // namespace strata
