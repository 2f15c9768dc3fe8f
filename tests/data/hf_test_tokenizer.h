// A small byte-level BPE tokenizer.json built in a test (ids 0..255 are the bytes), for the
// tokenizer reader's and prepare's tests.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/data/hf_tokenizer.h"

namespace strata::data::test_util {

using nlohmann::json;

// GPT-2's bytes_to_unicode character of byte b, as UTF-8.
inline std::string byte_char(int b) {
  int extra = 256;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const int cp = printable ? x : extra++;
    if (x == b) {
      std::string s;
      if (cp < 0x80) {
        s.push_back(char(cp));
      } else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
      return s;
    }
  }
  return {};
}

// A byte-level BPE: ids 0..255 are the bytes, then the merges' results in order.
struct Builder {
  json vocab = json::object();
  json merges = json::array();
  json added = json::array();
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json post = nullptr;
  json extra_model = json::object();

  Builder() {
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  }
  // Merges a+b (written with Ġ for a space); returns the new id.
  int merge(const std::string& a, const std::string& b) {
    const int id = int(vocab.size());
    vocab[a + b] = id;
    merges.push_back(a + " " + b);
    return id;
  }
  int add(const std::string& content, bool special = true, json flags = json::object()) {
    const int id = int(vocab.size() + added.size());
    json e = {{"id", id},          {"content", content}, {"single_word", false},
              {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
              {"special", special}};
    for (const auto& [k, v] : flags.items()) e[k] = v;
    added.push_back(e);
    return id;
  }
  // Llama-3's post-processor: the single template "<bos> $A".
  void bos_template(int bos, const std::string& name) {
    post = {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", json::array()},
            {"special_tokens", {{name, {{"id", name}, {"ids", {bos}}, {"tokens", {name}}}}}}};
  }
  json build() const {
    json model = {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
                  {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                  {"merges", merges}};
    for (const auto& [k, v] : extra_model.items()) model[k] = v;
    return {{"version", "1.0"},       {"truncation", nullptr}, {"padding", nullptr},
            {"added_tokens", added},  {"normalizer", nullptr}, {"pre_tokenizer", pre},
            {"post_processor", post}, {"decoder", nullptr},    {"model", model}};
  }
  std::shared_ptr<const HfTokenizer> tokenizer() const {
    return HfTokenizer::parse(build().dump(), "test.json");
  }
};

}  // namespace strata::data::test_util
