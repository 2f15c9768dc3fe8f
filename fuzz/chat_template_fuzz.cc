// clang-format off
// fuzz-sources: src/strata/data/jinja*.cc src/strata/data/hf_tokenizer.cc src/strata/data/hf_support.cc src/strata/data/hf_normalizer.cc src/strata/data/hf_pre_tokenizer.cc src/strata/data/hf_bpe.cc src/strata/core/check.cc
// fuzz-flags: -lpcre2-8 -licuuc
// clang-format on
//
// The chat-template engine (data/jinja.h) on arbitrary template text, rendered with a fixed
// conversation with and without the generation prompt, as `data prepare --jsonl` renders it. An
// InputError (a syntax error, anything unsupported, raise_exception, a run-time error) is the
// expected answer to garbage; a finding is a crash, a hang, a sanitizer report or any other
// exception, or generation spans outside the output. Seeds in fuzz/corpus/chat_template/ are the
// real templates of tests/data/chat_templates/.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi \"there\"\n"},
                 {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
                 {"role": "user", "content": "2+2?"}],
    "bos_token": "<s>", "eos_token": "</s>", "tools": null, "documents": null})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const strata::data::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size),
                                       "fuzz");
    for (bool prompt : {false, true}) {
      nlohmann::ordered_json c = context();
      c["add_generation_prompt"] = prompt;
      std::vector<std::pair<size_t, size_t>> spans;
      const std::string out = t.render(c, &spans);
      for (const auto& [b, e] : spans) {
        if (b > e || e > out.size()) std::abort();  // a span outside the output
      }
    }
  } catch (const strata::InputError&) {
  }
  return 0;
}
