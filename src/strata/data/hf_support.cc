#include "strata/data/hf_support.h"

#include <cstring>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"

namespace strata::data::hf {

std::string shorten(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 37)) + "...";
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else if (cp < 0x800) {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(char(0xE0 | (cp >> 12)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xF0 | (cp >> 18)));
    s.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const uint8_t c = uint8_t(s[i]);
  if (c < 0x80) return ++i, c;
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  i += size_t(len);
  return cp;
}

size_t char_start_before(std::string_view s, size_t i) {
  do --i;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80);
  return i;
}

bool is_ascii(std::string_view s) {
  size_t i = 0;
  uint64_t any = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    any |= w;
  }
  for (; i < s.size(); ++i) any |= uint8_t(s[i]);
  return (any & 0x8080808080808080ull) == 0;
}

// ---- Reader ------------------------------------------------------------------------------------

void Reader::fail(const std::string& key, const std::string& what) const {
  STRATA_INPUT_FAIL(source, ": ", key, " ", what);
}

const json* Reader::find(const json& obj, const std::string& key) const {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool Reader::get_bool(const json& obj, const std::string& key, const std::string& path,
                      bool def) const {
  const json* v = find(obj, key);
  if (!v) return def;
  if (!v->is_boolean()) fail(path + "." + key, "must be true or false, not " + shorten(v->dump()));
  return v->get<bool>();
}

std::string Reader::get_string(const json& obj, const std::string& key,
                               const std::string& path) const {
  const json* v = find(obj, key);
  if (!v) fail(path + "." + key, "is missing; it must be a string");
  if (!v->is_string()) fail(path + "." + key, "must be a string, not " + shorten(v->dump()));
  return v->get<std::string>();
}

const json& Reader::get_object(const json& obj, const std::string& key,
                               const std::string& path) const {
  const json* v = find(obj, key);
  if (!v) fail(path + "." + key, "is missing; it must be an object");
  if (!v->is_object()) fail(path + "." + key, "must be an object, not " + shorten(v->dump()));
  return *v;
}

const json& Reader::get_array(const json& obj, const std::string& key,
                              const std::string& path) const {
  const json* v = find(obj, key);
  if (!v) fail(path + "." + key, "is missing; it must be an array");
  if (!v->is_array()) fail(path + "." + key, "must be an array, not " + shorten(v->dump()));
  return *v;
}

int32_t Reader::get_id(const json& v, const std::string& path) const {
  if (!v.is_number_integer()) fail(path, "must be an integer token id, not " + shorten(v.dump()));
  const bool neg = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
  if (neg || v.get<uint64_t>() >= uint64_t(kMaxTokenizerVocab))
    fail(path, "is " + v.dump() + ", outside [0, " + std::to_string(kMaxTokenizerVocab) +
                   "); strata reads vocabularies of at most 2^24 ids");
  return int32_t(v.get<int64_t>());
}

std::string Reader::get_choice(const json& obj, const std::string& key, const std::string& path,
                               const std::vector<std::string>& allowed, bool required) const {
  if (!required && !find(obj, key)) return allowed.front();
  const std::string v = get_string(obj, key, path);
  for (const std::string& a : allowed)
    if (v == a) return v;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i)
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + ("\"" + allowed[i] + "\"");
  fail(path + "." + key, "is \"" + shorten(v) + "\"; it must be " + list);
}

// ---- PCRE2 -------------------------------------------------------------------------------------

Regex::~Regex() {
  if (code) pcre2_code_free(code);
}

namespace {

// Oniguruma's \s (what `tokenizers` runs) is Unicode's White_Space; PCRE2's, with UCP, also takes
// U+180E (MONGOLIAN VOWEL SEPARATOR, no longer a space since Unicode 6.3), which would split
// "\u0328\u180e" where `tokenizers` does not. \s and \S become White_Space, inside classes too;
// \Q...\E stays literal.
std::string onig_spaces(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 == p.size()) {
      out.push_back(p[i]);
      continue;
    }
    const char c = p[++i];
    if (c == 's' || c == 'S') {
      out += c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
    } else if (c == 'Q') {
      const size_t end = p.find("\\E", i + 1);
      const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
      out.append(p.substr(i - 1, stop - (i - 1)));
      i = stop - 1;
    } else {
      out.push_back('\\');
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<Regex> compile_regex(std::string_view pattern, bool literal,
                                     const std::string& where) {
  auto r = std::make_unique<Regex>();
  r->pattern = std::string(pattern);
  const std::string compiled = literal ? std::string(pattern) : onig_spaces(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP, which a literal does not need. Ruby syntax, which
  // `tokenizers` compiles its patterns in, has ^ and $ match at every line: PCRE2_MULTILINE.
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts,
                          &err, &offset, nullptr);
  if (!r->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    STRATA_INPUT_FAIL(where, ": the regex \"", shorten(pattern),
                      "\" does not compile in PCRE2: ", reinterpret_cast<const char*>(msg),
                      " at offset ", offset, "; strata reads Oniguruma patterns PCRE2 also reads");
  }
  r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

int add_regex(RegexSet& set, std::string_view pattern, bool literal, const std::string& where) {
  set.push_back(compile_regex(pattern, literal, where));
  return int(set.size()) - 1;
}

// ---- Matcher -----------------------------------------------------------------------------------

Matcher::Matcher(const RegexSet& set, const std::string& source) : set_(set), source_(source) {
  context_ = pcre2_match_context_create(nullptr);
  STRATA_CHECK(context_ != nullptr, "out of memory for a PCRE2 match context");
  // Hostile patterns from a file stay bounded in time and stack.
  pcre2_set_match_limit(context_, 10'000'000);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (jit_stack_) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  for (const auto& re : set_)
    match_.push_back(pcre2_match_data_create_from_pattern(re->code, nullptr));
  class_match_ = pcre2_match_data_create(1, nullptr);
}

Matcher::~Matcher() {
  for (auto* m : match_) pcre2_match_data_free(m);
  pcre2_match_data_free(class_match_);
  if (jit_stack_) pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
}

bool Matcher::find(int ri, std::string_view s, size_t start, size_t& b, size_t& e) {
  const Regex& re = *set_[size_t(ri)];
  pcre2_match_data* md = match_[size_t(ri)];
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  const int rc =
      re.jit ? pcre2_jit_match(re.code, subj, s.size(), start, PCRE2_NO_UTF_CHECK, md, context_)
             : pcre2_match(re.code, subj, s.size(), start, PCRE2_NO_UTF_CHECK, md, context_);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    STRATA_INPUT_FAIL(source_, ": the regex \"", shorten(re.pattern),
                      "\" failed on the text: ", reinterpret_cast<const char*>(msg),
                      "; simplify the pattern");
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  // \K can end a match before its start; no `tokenizers` pattern does that.
  if (ov[1] < ov[0])
    STRATA_INPUT_FAIL(source_, ": the regex \"", shorten(re.pattern),
                      "\" ends a match before its start (\\K); remove the \\K");
  b = ov[0], e = ov[1];
  return true;
}

bool Matcher::char_in(const Regex& cls, std::string_view s, size_t i) {
  const int rc = pcre2_match(cls.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), i,
                             PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, class_match_, context_);
  return rc > 0;
}

}  // namespace strata::data::hf
