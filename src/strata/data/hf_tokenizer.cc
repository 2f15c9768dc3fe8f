#include "strata/data/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "strata/core/check.h"
#include "strata/data/hf_bpe.h"
#include "strata/data/hf_normalizer.h"
#include "strata/data/hf_pre_tokenizer.h"
#include "strata/data/hf_support.h"

namespace strata::data {

namespace fs = std::filesystem;
using hf::json;
using hf::Reader;
using hf::shorten;

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

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  hf::RegexSet regexes;  // of the normalizer and the pre-tokenizer
  hf::Normalizer normalizer;
  hf::PreTokenizer pre;
  hf::Bpe bpe;
  std::vector<AddedToken> added;
  hf::StringMap added_ids;  // by content
  // normalized=false tokens match first, on the raw text; normalized=true ones by their normalized
  // content, on the normalized text between those.
  TokenTrie trie_raw, trie_normalized;
  std::unique_ptr<hf::Regex> word_char, space_char;  // Rust's \w and \s, for single_word/strip
  std::vector<int32_t> prefix, suffix;
  int64_t vocab_size = 0;
};

namespace {

void read_added_tokens(HfTokenizer::Impl& t, const Reader& r, const json& root,
                       std::unordered_map<int32_t, std::string_view>& owner) {
  const json* list = r.find(root, "added_tokens");
  if (!list) return;
  if (!list->is_array()) r.fail("added_tokens", "must be an array, not " + shorten(list->dump()));
  int64_t beyond_vocab = 0;  // added tokens not in model.vocab so far
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
    if (!t.added_ids.emplace(a.content, a.id).second)
      r.fail(path, "repeats the token \"" + shorten(a.content) + "\"");
    const auto in_vocab = t.bpe.vocab.find(a.content);
    if (in_vocab != t.bpe.vocab.end() && in_vocab->second != a.id)
      r.fail(path + ".id", "is " + std::to_string(a.id) + " but model.vocab gives \"" +
                               shorten(a.content) + "\" id " + std::to_string(in_vocab->second));
    if (in_vocab == t.bpe.vocab.end()) {
      const auto [it, fresh] = owner.emplace(a.id, std::string_view());
      if (!fresh)
        r.fail(path + ".id", "is " + std::to_string(a.id) + ", already the id of \"" +
                                 shorten(it->second) + "\"; every id must name one token");
      it->second = t.added_ids.find(a.content)->first;
      // `tokenizers` ignores the id written for a token outside model.vocab and gives the next
      // one after the vocabulary's entries, in file order (with a warning).
      const int64_t given = int64_t(t.bpe.vocab.size()) + beyond_vocab++;
      if (a.id != given)
        r.fail(path + ".id",
               "is " + std::to_string(a.id) + ", but `tokenizers` numbers the added " +
                   "tokens outside model.vocab after its " + std::to_string(t.bpe.vocab.size()) +
                   " entries, in file order, and gives this one " + std::to_string(given) +
                   "; write that id");
    }
    t.vocab_size = std::max<int64_t>(t.vocab_size, int64_t(a.id) + 1);
    t.added.push_back(std::move(a));
  }
  // `tokenizers` matches a normalized=true token by its content normalized, in normalized text
  // (with Prepend("▁"), "ab" matches only where a piece starts).
  hf::Matcher matcher(t.regexes, t.source);
  std::array<std::string, 2> bufs;
  hf::StringMap normalized_seen;
  bool need_classes = false;
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    need_classes |= a.single_word || a.lstrip || a.rstrip;
    if (!a.normalized) {
      t.trie_raw.add(a.content, int32_t(i));
      continue;
    }
    size_t origin = 0;
    const std::string n(t.normalizer.apply(a.content, origin, matcher, bufs));
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (n.empty()) r.fail(path + ".content", "is empty once normalized; set normalized to false");
    const auto [it, fresh] = normalized_seen.emplace(n, int32_t(i));
    if (!fresh)
      r.fail(path + ".content",
             "normalizes to \"" + shorten(n) + "\" as added_tokens[" + std::to_string(it->second) +
                 "] does; `tokenizers` cannot match both (set normalized to false on one)");
    t.trie_normalized.add(n, int32_t(i));
  }
  if (need_classes) {
    t.word_char = hf::compile_regex(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", false,
                                    "built-in \\w");
    t.space_char = hf::compile_regex(R"(\p{White_Space})", false, "built-in \\s");
  }
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
  t->normalizer.read(r, root, t->regexes);
  t->pre.read(r, root, t->regexes);
  std::unordered_map<int32_t, std::string_view> owner;  // while loading: who holds an id
  t->bpe.read(r, root, t->pre.byte_level(), owner);
  t->vocab_size = t->bpe.vocab_size;
  read_added_tokens(*t, r, root, owner);
  read_post_processor(*t, r, root);
  STRATA_INPUT_CHECK(t->vocab_size > 0, source, ": the vocabulary is empty");
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
  if (const auto it = impl_->added_ids.find(content); it != impl_->added_ids.end())
    return it->second;
  if (const auto it = impl_->bpe.vocab.find(content); it != impl_->bpe.vocab.end())
    return it->second;
  return std::nullopt;
}

// ---- encoding ----------------------------------------------------------------------------------

struct HfTokenizer::Session::State {
  const Impl& t;
  hf::Matcher matcher;
  hf::PreTokenizerRun pre;
  hf::BpeRun bpe;
  std::array<std::string, 2> normalized;  // the normalizer's output

  explicit State(const Impl& tok)
      : t(tok), matcher(tok.regexes, tok.source), pre(tok.pre), bpe(tok.bpe) {}

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
      // Matches do not overlap one another, but the next may start in the spaces rstrip took.
      i = stop;
      if (a.single_word) {
        const bool word_before =
            start > 0 && matcher.char_in(*t.word_char, s, hf::char_start_before(s, start));
        const bool word_after = stop < s.size() && matcher.char_in(*t.word_char, s, stop);
        if (word_before || word_after) continue;
      }
      if (a.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          const size_t p = hf::char_start_before(s, ns);
          if (!matcher.char_in(*t.space_char, s, p)) break;
          ns = p;
        }
        start = std::max(ns, done);
      }
      if (a.rstrip) {
        while (stop < s.size() && matcher.char_in(*t.space_char, s, stop)) {
          size_t k = stop;
          hf::next_code_point(s, k);
          stop = k;
        }
      }
      if (done < start) on_gap(s.substr(done, start - done));
      out.push_back(a.id);
      done = stop;
    }
    if (done < s.size()) on_gap(s.substr(done));
  }
};

HfTokenizer::Session::Session(const HfTokenizer& tok) : s_(std::make_unique<State>(*tok.impl_)) {}
HfTokenizer::Session::~Session() = default;

void HfTokenizer::Session::encode_append(std::string_view text, std::vector<int32_t>& out) {
  State& s = *s_;
  const hf::PreTokenizerRun::OnWord on_word = [&](std::string_view w) { s.bpe.encode(w, out); };
  // Each piece between the raw-matched added tokens is normalized on its own, as `tokenizers`
  // does: Prepend adds its prefix to every one. Metaspace's "first" scheme prepends only to the
  // piece that `tokenizers` aligns with the start of the text (`origin`, PreTokenizerRun::run).
  s.split_added(text, s.t.trie_raw, out, [&](std::string_view gap) {
    size_t origin = 0;
    if (gap.data() == text.data()) hf::next_code_point(gap, origin);
    const std::string_view norm = s.t.normalizer.apply(gap, origin, s.matcher, s.normalized);
    s.split_added(norm, s.t.trie_normalized, out, [&](std::string_view piece) {
      const size_t b = size_t(piece.data() - norm.data());
      s.pre.run(piece, b < origin ? std::min(origin, b + piece.size()) - b : 0, s.matcher, on_word);
    });
  });
}

}  // namespace strata::data
