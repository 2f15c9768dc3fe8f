// What the parts of the tokenizer.json reader share (hf_tokenizer.cc, hf_normalizer.cc,
// hf_pre_tokenizer.cc, hf_bpe.cc): reading JSON with messages that name the key path, PCRE2
// regexes that match as `tokenizers`' Oniguruma does, and UTF-8 steps. Internal to data/.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::data::hf {

using nlohmann::json;

// `s` cut to 40 characters for a message.
std::string shorten(std::string_view s);

void append_utf8(std::string& s, uint32_t cp);
// Decodes one code point of well-formed UTF-8 at s[i]; advances i.
uint32_t next_code_point(std::string_view s, size_t& i);
// The start of the character that ends at s[i] (i > 0).
size_t char_start_before(std::string_view s, size_t i);
bool is_ascii(std::string_view s);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// JSON access whose errors name the file and the key path (`pre_tokenizer.pretokenizers[1].type`)
// and say what the value must be.
struct Reader {
  const std::string& source;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // The value at obj[key]; nullptr when absent or null.
  const json* find(const json& obj, const std::string& key) const;
  bool get_bool(const json& obj, const std::string& key, const std::string& path, bool def) const;
  std::string get_string(const json& obj, const std::string& key, const std::string& path) const;
  const json& get_object(const json& obj, const std::string& key, const std::string& path) const;
  const json& get_array(const json& obj, const std::string& key, const std::string& path) const;
  // An integer id in [0, kMaxTokenizerVocab).
  int32_t get_id(const json& v, const std::string& path) const;
  // obj[key] must be one of `allowed` (default: the first) or it fails listing them.
  std::string get_choice(const json& obj, const std::string& key, const std::string& path,
                         const std::vector<std::string>& allowed, bool required) const;
};

// A compiled pattern. Patterns from a file are Oniguruma patterns (Ruby syntax) in `tokenizers`:
// \s is Unicode's White_Space and ^ $ match at line ends, which the compile options reproduce.
struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern;
  ~Regex();
};
using RegexSet = std::vector<std::unique_ptr<Regex>>;

// `literal`: a String pattern, matched as the text itself. `where` names the key in messages.
std::unique_ptr<Regex> compile_regex(std::string_view pattern, bool literal,
                                     const std::string& where);
// Compiles into `set`; returns the index.
int add_regex(RegexSet& set, std::string_view pattern, bool literal, const std::string& where);

// Per-thread match state for the regexes of one tokenizer.
class Matcher {
 public:
  Matcher(const RegexSet& set, const std::string& source);
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // The first match of regex `ri` in s at or after `start`: true and [b, e), or false.
  bool find(int ri, std::string_view s, size_t start, size_t& b, size_t& e);
  // Every match of regex `ri` in s, in order, as Oniguruma's find_iter yields them: an empty
  // match where the previous match ended is skipped. on_match(b, e).
  template <typename OnMatch>
  void for_each_match(int ri, std::string_view s, OnMatch&& on_match) {
    size_t pos = 0, last_end = std::string_view::npos, b, e;
    while (find(ri, s, pos, b, e)) {
      if (b == e && e == last_end) {
        if (e == s.size()) return;
        pos = e;
        next_code_point(s, pos);
        continue;
      }
      on_match(b, e);
      pos = last_end = e;
    }
  }
  // Whether the character at s[i] matches `cls` (a one-character class) there.
  bool char_in(const Regex& cls, std::string_view s, size_t i);

 private:
  const RegexSet& set_;
  const std::string& source_;
  std::vector<pcre2_match_data*> match_;
  pcre2_match_data* class_match_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

}  // namespace strata::data::hf
