#include "strata/data/hf_bpe.h"

#include <algorithm>
#include <cstdio>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"

namespace strata::data::hf {

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100.. in byte order. Byte-level vocabulary entries are written in these characters.
const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> c;
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      append_utf8(c[b], printable ? b : extra++);
    }
    return c;
  }();
  return chars;
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

// Words of this many bytes or more are not cached (`tokenizers`' MAX_LENGTH).
constexpr size_t kCacheWordLimit = 256;
// The cache starts over past this many ids.
constexpr size_t kArenaLimit = size_t(1) << 23;

}  // namespace

// ---- MergeTable --------------------------------------------------------------------------------

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, {});
}

void MergeTable::insert(int32_t a, int32_t b, Value v) {
  const uint64_t key = pack(a, b);
  size_t i = slot(key);
  while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & (keys_.size() - 1);
  keys_[i] = key;
  values_[i] = v;
}

// ---- reading -----------------------------------------------------------------------------------

void Bpe::read(const Reader& r, const json& root, bool byte_level_words,
               std::unordered_map<int32_t, std::string_view>& owner) {
  const json& model = r.get_object(root, "model", "tokenizer");
  const std::string type = r.find(model, "type") ? r.get_string(model, "type", "model") : "";
  if (type != "BPE") {
    r.fail("model.type", "is \"" + shorten(type) +
                             "\"; strata encodes BPE tokenizers only, not WordPiece, Unigram or "
                             "WordLevel models");
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
             "is set; strata implements BPE without word prefixes or suffixes");
  }
  fuse_unk = r.get_bool(model, "fuse_unk", "model", false);
  ignore_merges = r.get_bool(model, "ignore_merges", "model", false);
  byte_fallback = r.get_bool(model, "byte_fallback", "model", false);
  byte_level = byte_level_words;

  const json& entries = r.get_object(model, "vocab", "model");
  owner.reserve(entries.size());
  vocab.reserve(entries.size());
  for (const auto& [token, idj] : entries.items()) {
    const int32_t id = r.get_id(idj, "model.vocab[\"" + shorten(token) + "\"]");
    const auto [it, fresh] = owner.emplace(id, std::string_view());
    if (!fresh)
      r.fail("model.vocab", "gives id " + std::to_string(id) + " to both \"" + shorten(it->second) +
                                "\" and \"" + shorten(token) + "\"; every id must name one token");
    it->second = vocab.emplace(token, id).first->first;
    vocab_size = std::max<int64_t>(vocab_size, int64_t(id) + 1);
  }

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", unsigned(b));
    const auto it = vocab.find(std::string_view(name));
    byte_token[size_t(b)] = byte_fallback && it != vocab.end() ? it->second : -1;
  }
  if (byte_level) {
    std::array<int16_t, 324> cp_to_byte;
    cp_to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      size_t i = 0;
      cp_to_byte[next_code_point(byte_chars()[size_t(b)], i)] = int16_t(b);
      const auto it = vocab.find(byte_chars()[size_t(b)]);
      byte_id[size_t(b)] = it == vocab.end() ? -1 : it->second;
    }
    if (ignore_merges) {
      vocab_bytes.reserve(vocab.size());
      for (const auto& [token, id] : vocab) {
        if (auto raw = byte_level_decode(token, cp_to_byte))
          vocab_bytes.emplace(std::move(*raw), id);
      }
    }
  } else {
    ascii_id.fill(-1);
    for (const auto& [token, id] : vocab) {
      if (token.empty() || first_invalid_utf8(token)) continue;
      size_t i = 0;
      const uint32_t cp = next_code_point(token, i);
      if (i != token.size()) continue;
      if (cp < 128) {
        ascii_id[cp] = id;
      } else {
        char_id.emplace(cp, id);
      }
    }
  }

  if (r.find(model, "unk_token")) {
    const std::string unk = r.get_string(model, "unk_token", "model");
    const auto it = vocab.find(unk);
    if (it == vocab.end())
      r.fail("model.unk_token", "\"" + shorten(unk) + "\" is not in model.vocab");
    unk_id = it->second;
  }

  const json& list = r.get_array(model, "merges", "model");
  merges.reserve(list.size());
  auto id_of = [&](const std::string& s, size_t rank) {
    const auto it = vocab.find(s);
    if (it == vocab.end())
      r.fail("model.merges[" + std::to_string(rank) + "]",
             "names \"" + shorten(s) + "\", which is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const json& m = list[rank];
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
    merges.insert(ia, ib, {int32_t(rank), inew});
  }
}

// ---- encoding ----------------------------------------------------------------------------------

void BpeRun::encode(std::string_view word, std::vector<int32_t>& out) {
  if (bpe_.ignore_merges) {
    const StringMap& whole = bpe_.byte_level ? bpe_.vocab_bytes : bpe_.vocab;
    const auto it = whole.find(word);
    if (it != whole.end()) return out.push_back(it->second);
  }
  if (word.size() >= kCacheWordLimit) return merge_word(word, out);
  if (const auto it = cache_.find(word); it != cache_.end()) {
    const auto [off, len] = it->second;
    out.insert(out.end(), arena_.begin() + off, arena_.begin() + off + len);
    return;
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (arena_.size() > kArenaLimit) arena_.clear(), cache_.clear();
  cache_.emplace(std::string(word), std::pair<uint32_t, uint32_t>(uint32_t(arena_.size()),
                                                                  uint32_t(out.size() - first)));
  arena_.insert(arena_.end(), out.begin() + int64_t(first), out.end());
}

void BpeRun::push_symbol(int32_t id) {
  const int32_t n = int32_t(symbols_.size());
  symbols_.push_back({id, n - 1, -1});
  if (n > 0) symbols_[size_t(n - 1)].next = n;
}

void BpeRun::add_symbol(int32_t id, std::string_view bytes) {
  if (id >= 0) {
    if (unk_pending_) push_symbol(bpe_.unk_id), unk_pending_ = false;
    return push_symbol(id);
  }
  // As `tokenizers`: <0xXX> tokens when all of the character's bytes have one (a pending unk
  // stays pending across them), else unk, else the character is dropped.
  if (bpe_.byte_fallback && std::all_of(bytes.begin(), bytes.end(),
                                        [&](char c) { return bpe_.byte_token[uint8_t(c)] >= 0; })) {
    for (char c : bytes) push_symbol(bpe_.byte_token[uint8_t(c)]);
    return;
  }
  if (bpe_.unk_id < 0) return;
  if (unk_pending_ && !bpe_.fuse_unk) push_symbol(bpe_.unk_id);
  unk_pending_ = true;
}

void BpeRun::merge_word(std::string_view word, std::vector<int32_t>& out) {
  symbols_.clear();
  unk_pending_ = false;
  if (bpe_.byte_level) {
    for (char ch : word) {
      const uint8_t c = uint8_t(ch);
      add_symbol(bpe_.byte_id[c], byte_chars()[c]);
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      const size_t start = i;
      const uint32_t cp = next_code_point(word, i);
      int32_t id;
      if (cp < 128) {
        id = bpe_.ascii_id[cp];
      } else {
        const auto it = bpe_.char_id.find(cp);
        id = it == bpe_.char_id.end() ? -1 : it->second;
      }
      add_symbol(id, word.substr(start, i - start));
    }
  }
  if (unk_pending_) push_symbol(bpe_.unk_id);

  heap_.clear();
  for (size_t i = 0; i + 1 < symbols_.size(); ++i) {
    if (const auto* m = bpe_.merges.find(symbols_[i].id, symbols_[i + 1].id))
      heap_.push_back({m->rank, int32_t(i), m->new_id});
  }
  std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const Candidate top = heap_.back();
    heap_.pop_back();
    Symbol& cur = symbols_[size_t(top.pos)];
    if (cur.id < 0 || cur.next < 0) continue;
    const Symbol& right = symbols_[size_t(cur.next)];
    const auto* m = bpe_.merges.find(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // a stale candidate
    const int32_t gone = cur.next;
    cur.id = top.new_id;
    cur.next = right.next;
    symbols_[size_t(gone)].id = -1;
    if (cur.next >= 0) symbols_[size_t(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const auto* p = bpe_.merges.find(symbols_[size_t(cur.prev)].id, cur.id)) {
        heap_.push_back({p->rank, cur.prev, p->new_id});
        std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
      }
    }
    if (cur.next >= 0) {
      if (const auto* p = bpe_.merges.find(cur.id, symbols_[size_t(cur.next)].id)) {
        heap_.push_back({p->rank, top.pos, p->new_id});
        std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
      }
    }
  }
  for (int32_t i = symbols_.empty() ? -1 : 0; i >= 0; i = symbols_[size_t(i)].next)
    out.push_back(symbols_[size_t(i)].id);
}

}  // namespace strata::data::hf
