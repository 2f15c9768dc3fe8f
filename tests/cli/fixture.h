// What the CLI tests that train share: a fresh temporary directory holding the small token shard
// they train on (4000 tokens of a fixed pattern over 64 ids, as `good.bin`), and running the
// binary with its output kept there.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
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

// Runs `'binary' args` with stdout to dir/stdout.txt and stderr to dir/stderr.txt; returns the
// exit status (-1, and a test failure, when a signal ended it) and fills *err with stderr.
inline int run_binary(const std::string& binary, const std::string& dir, const std::string& args,
                      std::string* err = nullptr) {
  const std::string errf = dir + "/stderr.txt";
  const std::string cmd =
      "'" + binary + "' " + args + " >'" + dir + "/stdout.txt' 2>'" + errf + "'";
  const int status = std::system(cmd.c_str());
  if (err != nullptr) {
    std::ifstream in(errf);
    std::stringstream text;
    text << in.rdbuf();
    *err = text.str();
  }
  if (!WIFEXITED(status)) {
    ADD_FAILURE() << cmd << " did not exit";
    return -1;
  }
  return WEXITSTATUS(status);
}

}  // namespace strata
