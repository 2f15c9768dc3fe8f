// clang-format off
// fuzz-sources: src/strata/ckpt/hf_config.cc src/strata/model/model_config.cc src/strata/core/check.cc
// clang-format on
//
// A Hugging Face config.json reader (ckpt/hf.h: model_config_from_hf) on arbitrary text. An
// InputError is the expected answer to garbage; a finding is a crash, a sanitizer report, any
// other exception, or an accepted config whose export (hf_config_json) does not read back as the
// same model. Seeds in fuzz/corpus/hf_config/ are config.json files of each family as
// transformers saves them.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/ckpt/hf.h"
#include "strata/core/check.h"

namespace {

std::string temp_path() {
  static const std::string path =
      "/tmp/strata_hf_config_fuzz_" + std::to_string(getpid()) + ".json";
  return path;
}

void write(const std::string& text) {
  std::ofstream out(temp_path(), std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write(std::string(reinterpret_cast<const char*>(data), size));
  strata::ModelConfig m;
  try {
    m = strata::ckpt::model_config_from_hf(temp_path());
  } catch (const strata::InputError&) {
    return 0;
  }
  // What was accepted exports to a config.json that reads back as the same model.
  write(strata::ckpt::hf_config_json(m, strata::DType::F32).dump());
  strata::ModelConfig back;
  try {
    back = strata::ckpt::model_config_from_hf(temp_path());
  } catch (const strata::InputError& e) {
    std::fprintf(stderr, "an accepted config's export is refused: %s\n", e.what());
    std::abort();
  }
  if (strata::model_block_json(back) != strata::model_block_json(m) || back.seq_len != m.seq_len ||
      back.init_std != m.init_std) {
    std::fprintf(stderr, "an accepted config's export reads back as another model:\n%s\n%s\n",
                 strata::model_block_json(m).dump().c_str(),
                 strata::model_block_json(back).dump().c_str());
    std::abort();
  }
  return 0;
}
