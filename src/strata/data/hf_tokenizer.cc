#include "strata/data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "strata/core/check.h"

namespace strata::data {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time: the common case.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::nullopt;
}

namespace {

// GPT-2's pre-tokenizer pattern, which `tokenizers`' ByteLevel(use_regex=true) applies; it is part
// of that pre-tokenizer's definition, not of the file.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100.. in byte order. Vocabulary entries are written in these characters.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> cp{};
  uint32_t extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[b] = printable ? b : extra++;
  }
  return cp;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else if (cp < 0x800) {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xE0 | (cp >> 12)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Decodes one code point of well-formed UTF-8 at s[i]; advances i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const uint8_t c = uint8_t(s[i]);
  if (c < 0x80) return ++i, c;
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  i += size_t(len);
  return cp;
}

// A vocabulary entry in byte-level characters back to the bytes it stands for; nullopt when it
// holds a character outside that alphabet (such an entry is never produced by byte-level BPE).
std::optional<std::string> byte_level_decode(std::string_view token,
                                             const std::array<int16_t, 324>& cp_to_byte) {
  if (first_invalid_utf8(token)) return std::nullopt;
  std::string raw;
  raw.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const uint32_t cp = next_code_point(token, i);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return std::nullopt;
    raw.push_back(char(uint8_t(cp_to_byte[cp])));
  }
  return raw;
}

std::string shorten(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 37)) + "...";
}

// ---- PCRE2 --------------------------------------------------------------------------------

struct Pcre2Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern;
  ~Pcre2Code() {
    if (code) pcre2_code_free(code);
  }
};

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

std::unique_ptr<Pcre2Code> compile_regex(std::string_view pattern, bool literal,
                                         const std::string& where) {
  auto r = std::make_unique<Pcre2Code>();
  r->pattern = std::string(pattern);
  const std::string compiled = literal ? std::string(pattern) : onig_spaces(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP, which a literal does not need.
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
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

// ---- JSON access with messages naming the key -----------------------------------------------

struct Reader {
  const std::string& source;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    STRATA_INPUT_FAIL(source, ": ", key, " ", what);
  }
  const json* find(const json& obj, const std::string& key) const {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  bool get_bool(const json& obj, const std::string& key, const std::string& path, bool def) const {
    const json* v = find(obj, key);
    if (!v) return def;
    if (!v->is_boolean()) fail(path + "." + key, "must be true or false, not " + v->dump());
    return v->get<bool>();
  }
  std::string get_string(const json& obj, const std::string& key, const std::string& path) const {
    const json* v = find(obj, key);
    if (!v) fail(path + "." + key, "is missing; it must be a string");
    if (!v->is_string()) fail(path + "." + key, "must be a string, not " + shorten(v->dump()));
    return v->get<std::string>();
  }
  const json& get_object(const json& obj, const std::string& key, const std::string& path) const {
    const json* v = find(obj, key);
    if (!v) fail(path + "." + key, "is missing; it must be an object");
    if (!v->is_object()) fail(path + "." + key, "must be an object, not " + shorten(v->dump()));
    return *v;
  }
  const json& get_array(const json& obj, const std::string& key, const std::string& path) const {
    const json* v = find(obj, key);
    if (!v) fail(path + "." + key, "is missing; it must be an array");
    if (!v->is_array()) fail(path + "." + key, "must be an array, not " + shorten(v->dump()));
    return *v;
  }
  int32_t get_id(const json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, "must be an integer token id, not " + shorten(v.dump()));
    const bool neg = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
    if (neg || v.get<uint64_t>() >= uint64_t(kMaxTokenizerVocab))
      fail(path, "is " + v.dump() + ", outside [0, " + std::to_string(kMaxTokenizerVocab) +
                     "); strata reads vocabularies of at most 2^24 ids");
    return int32_t(v.get<int64_t>());
  }
};

// ---- added tokens: leftmost-longest matching over a byte trie ---------------------------------

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, single_word, lstrip, rstrip, normalized;
};

class TokenTrie {
 public:
  TokenTrie() : nodes_(1) {}
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t token_index) {
    int32_t node = 0;
    for (char ch : s) {
      const uint8_t c = uint8_t(ch);
      int32_t next = child(node, c);
      if (next < 0) {
        next = int32_t(nodes_.size());
        nodes_[size_t(node)].kids.emplace_back(c, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[size_t(node)].token = token_index;
    first_[uint8_t(s[0])] = true;
  }
  // The longest token starting at s[i]: (token index, length), or token index -1.
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t i) const {
    if (!first_[uint8_t(s[i])]) return {-1, 0};
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t k = i; k < s.size(); ++k) {
      node = child(node, uint8_t(s[k]));
      if (node < 0) break;
      if (nodes_[size_t(node)].token >= 0) best = nodes_[size_t(node)].token, best_len = k + 1 - i;
    }
    return {best, best_len};
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    int32_t token = -1;
  };
  int32_t child(int32_t node, uint8_t c) const {
    for (const auto& [k, n] : nodes_[size_t(node)].kids)
      if (k == c) return n;
    return -1;
  }
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

// ---- BPE merges: open addressing on the pair of ids ---------------------------------------------

class MergeTable {
 public:
  struct Value {
    int32_t rank, new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, {});
  }
  // A later merge of the same pair replaces the earlier, as in `tokenizers`' map.
  void insert(int32_t a, int32_t b, Value v) {
    const uint64_t key = pack(a, b);
    size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & (keys_.size() - 1);
    keys_[i] = key;
    values_[i] = v;
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & (keys_.size() - 1);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
};

struct PreStep {
  enum Kind { kSplit, kByteLevel } kind;
  int regex = -1;        // index into Impl::regexes; -1: ByteLevel without a regex
  bool removed = false;  // Split behavior Removed (else Isolated)
  bool add_prefix_space = false;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  std::vector<std::unique_ptr<Pcre2Code>> regexes;
  std::vector<PreStep> steps;
  std::vector<AddedToken> added;
  TokenTrie trie_raw, trie_normalized;  // normalized=false tokens match first, on the raw text
  std::unique_ptr<Pcre2Code> word_char, space_char;  // Rust's \w and \s, for single_word/strip
  StringMap vocab;                                   // as written in the file
  StringMap vocab_bytes;  // byte-level entries by the bytes they stand for (ignore_merges)
  std::array<int32_t, 256> byte_id{};                  // the one-byte tokens; -1 when absent
  std::array<std::array<int32_t, 2>, 256> fallback{};  // byte_fallback ids of a byte's character
  std::array<int, 256> fallback_len{};                 // 0: no fallback for this byte
  MergeTable merges;
  int32_t unk_id = -1;
  bool fuse_unk = false, ignore_merges = false;
  std::vector<int32_t> prefix, suffix;
  int64_t vocab_size = 0;
  std::unordered_map<int32_t, std::string_view> id_owner;  // while loading: who holds an id
};

namespace {

void read_model(HfTokenizer::Impl& t, const Reader& r, const json& root) {
  const json& model = r.get_object(root, "model", "tokenizer");
  const std::string type = r.find(model, "type") ? r.get_string(model, "type", "model") : "";
  if (type != "BPE") {
    r.fail("model.type", "is \"" + type +
                             "\"; strata encodes BPE tokenizers only (GPT-2 and Llama-3 style), "
                             "not WordPiece, Unigram or WordLevel models");
  }
  if (const json* d = r.find(model, "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0)
      r.fail("model.dropout",
             "is " + shorten(d->dump()) +
                 "; BPE dropout is for training-time augmentation, set it to null");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (r.find(model, key) && !r.get_string(model, key, "model").empty())
      r.fail(std::string("model.") + key,
             "is set; strata implements byte-level BPE without word prefixes or suffixes");
  }
  t.fuse_unk = r.get_bool(model, "fuse_unk", "model", false);
  t.ignore_merges = r.get_bool(model, "ignore_merges", "model", false);
  const bool byte_fallback = r.get_bool(model, "byte_fallback", "model", false);

  const json& vocab = r.get_object(model, "vocab", "model");
  t.id_owner.reserve(vocab.size());
  t.vocab.reserve(vocab.size());
  for (const auto& [token, idj] : vocab.items()) {
    const int32_t id = r.get_id(idj, "model.vocab[\"" + shorten(token) + "\"]");
    const auto [it, fresh] = t.id_owner.emplace(id, std::string_view());
    if (!fresh)
      r.fail("model.vocab", "gives id " + std::to_string(id) + " to both \"" + shorten(it->second) +
                                "\" and \"" + shorten(token) + "\"; every id must name one token");
    it->second = t.vocab.emplace(token, id).first->first;
    t.vocab_size = std::max<int64_t>(t.vocab_size, int64_t(id) + 1);
  }

  std::array<int16_t, 324> cp_to_byte;
  cp_to_byte.fill(-1);
  const std::array<uint32_t, 256> b2cp = byte_to_code_point();
  for (int b = 0; b < 256; ++b) cp_to_byte[b2cp[size_t(b)]] = int16_t(b);
  t.vocab_bytes.reserve(t.vocab.size());
  for (const auto& [token, id] : t.vocab) {
    if (auto raw = byte_level_decode(token, cp_to_byte)) t.vocab_bytes.emplace(std::move(*raw), id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, b2cp[size_t(b)]);
    const auto it = t.vocab.find(ch);
    t.byte_id[size_t(b)] = it == t.vocab.end() ? -1 : it->second;
    t.fallback_len[size_t(b)] = 0;
    if (!byte_fallback) continue;
    int k = 0;
    for (char c : ch) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", unsigned(uint8_t(c)));
      const auto f = t.vocab.find(std::string_view(name));
      if (f == t.vocab.end()) break;
      t.fallback[size_t(b)][size_t(k++)] = f->second;
    }
    if (k == int(ch.size())) t.fallback_len[size_t(b)] = k;
  }
  if (r.find(model, "unk_token")) {
    const std::string unk = r.get_string(model, "unk_token", "model");
    const auto it = t.vocab.find(unk);
    if (it == t.vocab.end())
      r.fail("model.unk_token", "\"" + shorten(unk) + "\" is not in model.vocab");
    t.unk_id = it->second;
  }

  const json& merges = r.get_array(model, "merges", "model");
  t.merges.reserve(merges.size());
  auto id_of = [&](const std::string& s, size_t rank) {
    const auto it = t.vocab.find(s);
    if (it == t.vocab.end())
      r.fail("model.merges[" + std::to_string(rank) + "]",
             "names \"" + shorten(s) + "\", which is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        r.fail("model.merges[" + std::to_string(rank) + "]",
               "is \"" + shorten(s) + "\"; a merge is two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      r.fail("model.merges[" + std::to_string(rank) + "]",
             "is " + shorten(m.dump()) + "; a merge is \"a b\" or [\"a\", \"b\"]");
    }
    const int32_t ia = id_of(a, rank), ib = id_of(b, rank), inew = id_of(a + b, rank);
    t.merges.insert(ia, ib, {int32_t(rank), inew});
  }
}

void read_added_tokens(HfTokenizer::Impl& t, const Reader& r, const json& root) {
  const json* list = r.find(root, "added_tokens");
  if (!list) return;
  if (!list->is_array()) r.fail("added_tokens", "must be an array, not " + shorten(list->dump()));
  StringMap seen;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) r.fail(path, "must be an object, not " + shorten(e.dump()));
    if (!r.find(e, "id")) r.fail(path + ".id", "is missing");
    AddedToken a;
    a.id = r.get_id(e["id"], path + ".id");
    a.content = r.get_string(e, "content", path);
    if (a.content.empty()) r.fail(path + ".content", "is empty");
    if (first_invalid_utf8(a.content)) r.fail(path + ".content", "is not valid UTF-8");
    a.special = r.get_bool(e, "special", path, false);
    a.single_word = r.get_bool(e, "single_word", path, false);
    a.lstrip = r.get_bool(e, "lstrip", path, false);
    a.rstrip = r.get_bool(e, "rstrip", path, false);
    a.normalized = r.get_bool(e, "normalized", path, true);
    if (!seen.emplace(a.content, a.id).second)
      r.fail(path, "repeats the token \"" + shorten(a.content) + "\"");
    const auto in_vocab = t.vocab.find(a.content);
    if (in_vocab != t.vocab.end() && in_vocab->second != a.id)
      r.fail(path + ".id", "is " + std::to_string(a.id) + " but model.vocab gives \"" +
                               shorten(a.content) + "\" id " + std::to_string(in_vocab->second));
    if (in_vocab == t.vocab.end()) {
      const auto [it, fresh] = t.id_owner.emplace(a.id, std::string_view());
      if (!fresh)
        r.fail(path + ".id", "is " + std::to_string(a.id) + ", already the id of \"" +
                                 shorten(it->second) + "\"; every id must name one token");
      it->second = t.vocab.emplace(a.content, a.id).first->first;
    }
    t.vocab_size = std::max<int64_t>(t.vocab_size, int64_t(a.id) + 1);
    t.added.push_back(std::move(a));
  }
  // `tokenizers` lists special tokens before the others in its tries; a content appears once, so
  // the order only decides nothing here, and each trie holds each content once.
  bool need_classes = false;
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    (a.normalized ? t.trie_normalized : t.trie_raw).add(a.content, int32_t(i));
    need_classes |= a.single_word || a.lstrip || a.rstrip;
  }
  if (need_classes) {
    t.word_char = compile_regex(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", false,
                                "built-in \\w");
    t.space_char = compile_regex(R"(\p{White_Space})", false, "built-in \\s");
  }
}

void read_pre_tokenizer(HfTokenizer::Impl& t, const Reader& r, const json& root) {
  if (const json* n = r.find(root, "normalizer"))
    r.fail("normalizer", "is " + shorten(n->dump()) +
                             "; strata implements tokenizers without a normalizer (GPT-2, "
                             "Llama-3), set it to null only if the model was trained that way");
  const json* pre = r.find(root, "pre_tokenizer");
  if (!pre)
    r.fail("pre_tokenizer",
           "is null; strata encodes byte-level BPE, whose pre_tokenizer has a "
           "ByteLevel step");
  std::vector<std::pair<const json*, std::string>> list;
  if (!pre->is_object()) r.fail("pre_tokenizer", "must be an object");
  if (r.find(*pre, "type") && r.get_string(*pre, "type", "pre_tokenizer") == "Sequence") {
    const json& steps = r.get_array(*pre, "pretokenizers", "pre_tokenizer");
    for (size_t i = 0; i < steps.size(); ++i)
      list.emplace_back(&steps[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
  } else {
    list.emplace_back(pre, "pre_tokenizer");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& [step, path] = list[i];
    if (!step->is_object()) r.fail(path, "must be an object");
    const std::string type = r.get_string(*step, "type", path);
    PreStep s{};
    if (type == "ByteLevel") {
      if (i + 1 != list.size())
        r.fail(path,
               "is a ByteLevel step before other steps; strata implements ByteLevel as the "
               "last pre-tokenizer step (as GPT-2 and Llama-3 have it)");
      s.kind = PreStep::kByteLevel;
      s.add_prefix_space = r.get_bool(*step, "add_prefix_space", path, true);
      if (r.get_bool(*step, "use_regex", path, true)) {
        t.regexes.push_back(compile_regex(kGpt2Pattern, false, path));
        s.regex = int(t.regexes.size()) - 1;
      }
    } else if (type == "Split") {
      s.kind = PreStep::kSplit;
      const json& pat = r.get_object(*step, "pattern", path);
      const bool regex = r.find(pat, "Regex") != nullptr;
      if (!regex && !r.find(pat, "String"))
        r.fail(path + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
      const std::string text = r.get_string(pat, regex ? "Regex" : "String", path + ".pattern");
      if (text.empty()) r.fail(path + ".pattern", "is empty");
      if (first_invalid_utf8(text)) r.fail(path + ".pattern", "is not valid UTF-8");
      t.regexes.push_back(compile_regex(text, !regex, path + ".pattern"));
      s.regex = int(t.regexes.size()) - 1;
      const std::string behavior = r.get_string(*step, "behavior", path);
      if (behavior != "Isolated" && behavior != "Removed")
        r.fail(path + ".behavior",
               "is \"" + shorten(behavior) + "\"; strata implements Isolated and Removed");
      s.removed = behavior == "Removed";
      if (r.get_bool(*step, "invert", path, false))
        r.fail(path + ".invert", "is true; strata implements Split with invert false");
    } else {
      r.fail(path + ".type", "is \"" + shorten(type) +
                                 "\"; strata implements the ByteLevel and Split pre-tokenizers "
                                 "(GPT-2, Llama-3)");
    }
    t.steps.push_back(s);
  }
  if (t.steps.empty() || t.steps.back().kind != PreStep::kByteLevel)
    r.fail("pre_tokenizer", "has no ByteLevel step; strata encodes byte-level BPE only");
}

void read_template(HfTokenizer::Impl& t, const Reader& r, const json& tp, const std::string& path) {
  const json& single = r.get_array(tp, "single", path);
  const json* specials = r.find(tp, "special_tokens");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const std::string ppath = path + ".single[" + std::to_string(i) + "]";
    if (!piece.is_object() || piece.size() != 1)
      r.fail(ppath, "must be one SpecialToken or Sequence");
    if (r.find(piece, "Sequence")) {
      const json& seq = r.get_object(piece, "Sequence", ppath);
      if (r.get_string(seq, "id", ppath + ".Sequence") != "A" || seen_a)
        r.fail(ppath, "must be the one sequence \"A\" of a single template");
      seen_a = true;
      continue;
    }
    const json& st = r.get_object(piece, "SpecialToken", ppath);
    const std::string name = r.get_string(st, "id", ppath + ".SpecialToken");
    const json* entry = specials && specials->is_object() ? r.find(*specials, name) : nullptr;
    if (!entry || !entry->is_object())
      r.fail(path + ".special_tokens", "has no entry \"" + shorten(name) + "\" used by " + ppath);
    const json& ids =
        r.get_array(*entry, "ids", path + ".special_tokens[\"" + shorten(name) + "\"]");
    for (size_t k = 0; k < ids.size(); ++k) {
      const int32_t id = r.get_id(ids[k], path + ".special_tokens[\"" + shorten(name) + "\"].ids[" +
                                              std::to_string(k) + "]");
      (seen_a ? t.suffix : t.prefix).push_back(id);
    }
  }
  if (!seen_a) r.fail(path + ".single", "has no Sequence \"A\"");
}

void read_post_processor(HfTokenizer::Impl& t, const Reader& r, const json& root) {
  const json* pp = r.find(root, "post_processor");
  if (!pp) return;
  if (!pp->is_object()) r.fail("post_processor", "must be an object");
  std::vector<std::pair<const json*, std::string>> list;
  if (r.get_string(*pp, "type", "post_processor") == "Sequence") {
    const json& ps = r.get_array(*pp, "processors", "post_processor");
    for (size_t i = 0; i < ps.size(); ++i)
      list.emplace_back(&ps[i], "post_processor.processors[" + std::to_string(i) + "]");
  } else {
    list.emplace_back(pp, "post_processor");
  }
  bool have_template = false;
  for (const auto& [p, path] : list) {
    if (!p->is_object()) r.fail(path, "must be an object");
    const std::string type = r.get_string(*p, "type", path);
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing")
      r.fail(path + ".type", "is \"" + shorten(type) +
                                 "\"; strata implements the ByteLevel and TemplateProcessing "
                                 "post-processors");
    if (have_template) r.fail(path, "is a second TemplateProcessing");
    have_template = true;
    read_template(t, r, *p, path);
  }
  for (int32_t id : t.prefix) t.vocab_size = std::max<int64_t>(t.vocab_size, int64_t(id) + 1);
  for (int32_t id : t.suffix) t.vocab_size = std::max<int64_t>(t.vocab_size, int64_t(id) + 1);
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::shared_ptr<const HfTokenizer> HfTokenizer::parse(std::string_view json_text,
                                                      const std::string& source) {
  auto t = std::make_unique<Impl>();
  t->source = source;
  const Reader r{t->source};
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    STRATA_INPUT_FAIL(source, ": not valid JSON (", e.what(),
                      "); give a Hugging Face tokenizer.json, complete and unmodified");
  }
  if (!root.is_object()) r.fail("the top level", "must be an object, as in tokenizer.json");
  for (const char* key : {"truncation", "padding"}) {
    if (r.find(root, key))
      r.fail(key, "is set; strata encodes whole documents: set it to null in the file");
  }
  read_model(*t, r, root);
  read_added_tokens(*t, r, root);
  read_pre_tokenizer(*t, r, root);
  read_post_processor(*t, r, root);
  STRATA_INPUT_CHECK(t->vocab_size > 0, source, ": the vocabulary is empty");
  t->id_owner = {};
  return std::shared_ptr<const HfTokenizer>(new HfTokenizer(std::move(t)));
}

std::shared_ptr<const HfTokenizer> HfTokenizer::load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  STRATA_INPUT_CHECK(fs::is_regular_file(file, ec), "tokenizer ", file,
                     " does not exist; give a Hugging Face tokenizer.json or the directory that "
                     "holds it");
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  STRATA_INPUT_CHECK(in.good() || in.eof(), "cannot read tokenizer ", file);
  return parse(text.str(), file);
}

const std::vector<int32_t>& HfTokenizer::template_prefix() const {
  return impl_->prefix;
}
const std::vector<int32_t>& HfTokenizer::template_suffix() const {
  return impl_->suffix;
}
int64_t HfTokenizer::vocab_size() const {
  return impl_->vocab_size;
}
const std::string& HfTokenizer::source() const {
  return impl_->source;
}

std::optional<int32_t> HfTokenizer::token_id(std::string_view content) const {
  const auto it = impl_->vocab.find(content);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

// ---- encoding ----------------------------------------------------------------------------------

struct HfTokenizer::Session::State {
  const Impl& t;
  std::vector<pcre2_match_data*> match;
  pcre2_match_data* class_match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  // Pre-token cache: bytes -> a span of `arena`.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> arena;
  static constexpr size_t kArenaLimit = size_t(1) << 23;

  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;

  explicit State(const Impl& tok) : t(tok) {
    context = pcre2_match_context_create(nullptr);
    STRATA_CHECK(context != nullptr, "out of memory for a PCRE2 match context");
    // Hostile patterns from a file stay bounded in time and stack.
    pcre2_set_match_limit(context, 10'000'000);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    for (const auto& re : t.regexes)
      match.push_back(pcre2_match_data_create_from_pattern(re->code, nullptr));
    class_match = pcre2_match_data_create(1, nullptr);
  }
  ~State() {
    for (auto* m : match) pcre2_match_data_free(m);
    pcre2_match_data_free(class_match);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
  }

  // Finds the next match of regex `ri` in s from `start`: true and [b, e), or false.
  bool find(int ri, std::string_view s, size_t start, size_t& b, size_t& e) {
    const Pcre2Code& re = *t.regexes[size_t(ri)];
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    const int rc = re.jit ? pcre2_jit_match(re.code, subj, s.size(), start, PCRE2_NO_UTF_CHECK,
                                            match[size_t(ri)], context)
                          : pcre2_match(re.code, subj, s.size(), start, PCRE2_NO_UTF_CHECK,
                                        match[size_t(ri)], context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      STRATA_INPUT_FAIL(t.source, ": the regex \"", shorten(re.pattern),
                        "\" failed on the text: ", reinterpret_cast<const char*>(msg),
                        "; simplify the pattern");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match[size_t(ri)]);
    b = ov[0], e = ov[1];
    return true;
  }

  // Whether the character at s[i] is in a built-in class (word or space).
  bool char_in(const Pcre2Code& cls, std::string_view s, size_t i) {
    const int rc = pcre2_match(cls.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), i,
                               PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, class_match, context);
    return rc > 0;
  }
  static size_t char_start_before(std::string_view s, size_t i) {
    do --i;
    while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80);
    return i;
  }

  // Added tokens of one trie in `s` (as `tokenizers`' find_matches); tokens go to `out`, the text
  // between them to on_gap.
  template <typename OnGap>
  void split_added(std::string_view s, const TokenTrie& trie, std::vector<int32_t>& out,
                   OnGap&& on_gap) {
    if (s.empty()) return;
    if (trie.empty()) return on_gap(s);
    size_t done = 0;  // start_offset: the text before it is emitted
    size_t i = 0;
    while (i < s.size()) {
      const auto [index, len] = trie.longest_at(s, i);
      if (index < 0) {
        ++i;
        continue;
      }
      const AddedToken& a = t.added[size_t(index)];
      size_t start = i, stop = i + len;
      i = stop;  // matches do not overlap
      if (a.single_word) {
        const bool word_before = start > 0 && char_in(*t.word_char, s, char_start_before(s, start));
        const bool word_after = stop < s.size() && char_in(*t.word_char, s, stop);
        if (word_before || word_after) continue;
      }
      if (a.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          const size_t p = char_start_before(s, ns);
          if (!char_in(*t.space_char, s, p)) break;
          ns = p;
        }
        start = std::max(ns, done);
      }
      if (a.rstrip) {
        while (stop < s.size() && char_in(*t.space_char, s, stop)) {
          size_t k = stop;
          next_code_point(s, k);
          stop = k;
        }
      }
      if (done < start) on_gap(s.substr(done, start - done));
      out.push_back(a.id);
      done = stop;
      i = std::max(i, stop);
    }
    if (done < s.size()) on_gap(s.substr(done));
  }

  // Pre-tokenizer step `k` on a non-empty piece, then BPE on each final piece.
  void pre_tokenize(std::string_view piece, size_t k, std::vector<int32_t>& out) {
    if (k == t.steps.size()) return bpe(piece, out);
    const PreStep& step = t.steps[k];
    std::string prefixed;
    if (step.kind == PreStep::kByteLevel && step.add_prefix_space && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    if (step.regex < 0) return pre_tokenize(piece, k + 1, out);
    size_t pos = 0, last = 0, b, e;
    while (pos < piece.size() && find(step.regex, piece, pos, b, e)) {
      if (b == e) {  // an empty match splits nothing
        pos = e;
        if (pos < piece.size()) next_code_point(piece, pos);
        continue;
      }
      if (b > last) pre_tokenize(piece.substr(last, b - last), k + 1, out);
      if (!step.removed) pre_tokenize(piece.substr(b, e - b), k + 1, out);
      last = pos = e;
    }
    if (last < piece.size()) pre_tokenize(piece.substr(last), k + 1, out);
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) {
    if (t.ignore_merges) {
      const auto it = t.vocab_bytes.find(word);
      if (it != t.vocab_bytes.end()) return out.push_back(it->second);
    }
    if (const auto it = cache.find(word); it != cache.end()) {
      const auto [off, len] = it->second;
      out.insert(out.end(), arena.begin() + off, arena.begin() + off + len);
      return;
    }
    const size_t first = out.size();
    merge_word(word, out);
    if (arena.size() > kArenaLimit) arena.clear(), cache.clear();
    cache.emplace(std::string(word), std::pair<uint32_t, uint32_t>(uint32_t(arena.size()),
                                                                   uint32_t(out.size() - first)));
    arena.insert(arena.end(), out.begin() + int64_t(first), out.end());
  }

  void push_symbol(int32_t id) {
    const int32_t n = int32_t(symbols.size());
    symbols.push_back({id, n - 1, -1});
    if (n > 0) symbols[size_t(n - 1)].next = n;
  }

  // `tokenizers`' BPE::merge_word and Word::merge_all, on bytes.
  void merge_word(std::string_view word, std::vector<int32_t>& out) {
    symbols.clear();
    bool unk_pending = false;
    for (char ch : word) {
      const uint8_t c = uint8_t(ch);
      if (t.byte_id[c] >= 0) {
        if (unk_pending) push_symbol(t.unk_id), unk_pending = false;
        push_symbol(t.byte_id[c]);
        continue;
      }
      if (t.fallback_len[c] > 0) {
        for (int k = 0; k < t.fallback_len[c]; ++k) push_symbol(t.fallback[c][size_t(k)]);
        continue;
      }
      if (t.unk_id >= 0) {
        if (unk_pending && !t.fuse_unk) push_symbol(t.unk_id);
        unk_pending = true;
      }
    }
    if (unk_pending) push_symbol(t.unk_id);

    heap.clear();
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      if (const auto* m = t.merges.find(symbols[i].id, symbols[i + 1].id))
        heap.push_back({m->rank, int32_t(i), m->new_id});
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Candidate top = heap.back();
      heap.pop_back();
      Symbol& cur = symbols[size_t(top.pos)];
      if (cur.id < 0 || cur.next < 0) continue;
      const Symbol& right = symbols[size_t(cur.next)];
      const auto* m = t.merges.find(cur.id, right.id);
      if (!m || m->new_id != top.new_id) continue;
      const int32_t gone = cur.next;
      cur.id = top.new_id;
      cur.next = right.next;
      symbols[size_t(gone)].id = -1;
      if (cur.next >= 0) symbols[size_t(cur.next)].prev = top.pos;
      if (cur.prev >= 0) {
        if (const auto* p = t.merges.find(symbols[size_t(cur.prev)].id, cur.id)) {
          heap.push_back({p->rank, cur.prev, p->new_id});
          std::push_heap(heap.begin(), heap.end(), std::greater<>());
        }
      }
      if (cur.next >= 0) {
        if (const auto* p = t.merges.find(cur.id, symbols[size_t(cur.next)].id)) {
          heap.push_back({p->rank, top.pos, p->new_id});
          std::push_heap(heap.begin(), heap.end(), std::greater<>());
        }
      }
    }
    for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next)
      out.push_back(symbols[size_t(i)].id);
  }
};

HfTokenizer::Session::Session(const HfTokenizer& tok) : s_(std::make_unique<State>(*tok.impl_)) {}
HfTokenizer::Session::~Session() = default;

void HfTokenizer::Session::encode_append(std::string_view text, std::vector<int32_t>& out) {
  State& s = *s_;
  s.split_added(text, s.t.trie_raw, out, [&](std::string_view gap) {
    s.split_added(gap, s.t.trie_normalized, out,
                  [&](std::string_view piece) { s.pre_tokenize(piece, 0, out); });
  });
}

}  // namespace strata::data
