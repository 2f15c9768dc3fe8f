#include "strata/data/hf_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/stringpiece.h>

#include <algorithm>
#include <climits>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"

namespace strata::data::hf {

namespace {

const icu::Normalizer2* unicode_form(const std::string& type) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(st)
                              : type == "NFD"  ? icu::Normalizer2::getNFDInstance(st)
                              : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(st)
                                               : icu::Normalizer2::getNFKDInstance(st);
  STRATA_CHECK(U_SUCCESS(st) && n != nullptr, "ICU has no ", type, " data: ", u_errorName(st));
  return n;
}

}  // namespace

void Normalizer::read(const Reader& r, const json& root, RegexSet& regexes) {
  if (const json* n = r.find(root, "normalizer")) read_one(r, *n, "normalizer", regexes);
}

void Normalizer::read_one(const Reader& r, const json& n, const std::string& path,
                          RegexSet& regexes) {
  if (!n.is_object()) r.fail(path, "must be an object or null, not " + shorten(n.dump()));
  const std::string type = r.get_string(n, "type", path);
  NormalizerStep s{};
  if (type == "Sequence") {
    const json& list = r.get_array(n, "normalizers", path);
    for (size_t i = 0; i < list.size(); ++i)
      read_one(r, list[i], path + ".normalizers[" + std::to_string(i) + "]", regexes);
    return;
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    s.kind = NormalizerStep::kUnicode;
    s.unicode = unicode_form(type);
  } else if (type == "Replace") {
    s.kind = NormalizerStep::kReplace;
    const json& pat = r.get_object(n, "pattern", path);
    const bool regex = r.find(pat, "Regex") != nullptr;
    if (pat.size() != 1 || (!regex && !r.find(pat, "String")))
      r.fail(path + ".pattern",
             "must be {\"String\": ...} or {\"Regex\": ...}, not " + shorten(pat.dump()));
    const std::string text = r.get_string(pat, regex ? "Regex" : "String", path + ".pattern");
    if (text.empty())
      r.fail(path + ".pattern", "is empty; it would insert the content between every character");
    if (first_invalid_utf8(text)) r.fail(path + ".pattern", "is not valid UTF-8");
    s.content = r.get_string(n, "content", path);
    if (first_invalid_utf8(s.content)) r.fail(path + ".content", "is not valid UTF-8");
    if (regex) {
      s.regex = add_regex(regexes, text, false, path + ".pattern");
    } else {
      s.pattern = text;
    }
  } else if (type == "Prepend") {
    s.kind = NormalizerStep::kPrepend;
    s.content = r.get_string(n, "prepend", path);
    if (first_invalid_utf8(s.content)) r.fail(path + ".prepend", "is not valid UTF-8");
  } else {
    r.fail(path + ".type", "is \"" + shorten(type) +
                               "\"; strata implements the NFC, NFD, NFKC, NFKD, Replace, Prepend "
                               "and Sequence normalizers");
  }
  steps_.push_back(std::move(s));
}

std::string_view Normalizer::apply(std::string_view in, size_t& origin, Matcher& m,
                                   std::array<std::string, 2>& bufs) const {
  std::string_view cur = in;
  size_t next = 0;  // the buffer that `cur` is not in
  for (const NormalizerStep& s : steps_) {
    std::string& out = bufs[next];
    if (!apply_step(s, cur, origin, m, out)) continue;
    cur = out;
    next ^= 1;
  }
  return cur;
}

namespace {

std::string normalized(const icu::Normalizer2& n, std::string_view in) {
  UErrorCode st = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, int32_t(in.size()));
  n.normalizeUTF8(0, icu::StringPiece(in.data(), int32_t(in.size())), sink, nullptr, st);
  STRATA_CHECK(U_SUCCESS(st), "ICU normalization failed: ", u_errorName(st));
  return out;
}

// `tokenizers` aligns what a Unicode normalization makes of the first characters with them (a
// composed character with its first part). Exact where a normalization boundary follows the first
// `origin` bytes of `in`; otherwise the characters of `out` as far as they agree with those bytes
// normalized alone, and the one they compose into.
size_t unicode_origin(const icu::Normalizer2& n, std::string_view in, size_t origin,
                      std::string_view out) {
  if (origin == 0) return 0;
  if (origin >= in.size()) return out.size();
  const std::string head = normalized(n, in.substr(0, origin));
  size_t i = origin;
  if (n.hasBoundaryBefore(UChar32(next_code_point(in, i)))) return head.size();
  size_t same = 0;
  while (same < head.size() && same < out.size() && head[same] == out[same]) ++same;
  while (same > 0 && same < out.size() && (uint8_t(out[same]) & 0xC0) == 0x80) --same;
  if (same < head.size() && same < out.size()) next_code_point(out, same);
  return same;
}

}  // namespace

bool Normalizer::apply_step(const NormalizerStep& s, std::string_view in, size_t& origin,
                            Matcher& m, std::string& out) const {
  out.clear();
  switch (s.kind) {
    case NormalizerStep::kUnicode:
      if (is_ascii(in)) return false;  // ASCII is in every normalization form
      STRATA_INPUT_CHECK(in.size() <= size_t(INT32_MAX), "a document of ", in.size(),
                         " bytes is more than ICU normalizes at once (2^31 - 1); split it");
      out = normalized(*s.unicode, in);
      origin = unicode_origin(*s.unicode, in, origin, out);
      return true;
    case NormalizerStep::kReplace: {
      // `tokenizers` aligns a replacement with the last byte of what it replaces (an empty match
      // with the byte before it, or with the start): the output's bytes aligned with the first
      // character run while the kept text and the replacements come from the first `origin`.
      size_t done = 0, out_origin = 0;
      bool in_origin = origin > 0;
      auto keep = [&](size_t b, size_t e) {
        if (in_origin) {
          out_origin += std::min(e, std::max(origin, b)) - b;
          in_origin = e <= origin;
        }
        out.append(in.substr(b, e - b));
      };
      auto replace = [&](size_t b, size_t e) {
        keep(done, b);
        if (in_origin) {
          in_origin = e == 0 || e - 1 < origin;
          if (in_origin) out_origin += s.content.size();
        }
        out.append(s.content);
        done = e;
      };
      if (s.regex >= 0) {
        m.for_each_match(s.regex, in, replace);
      } else {
        for (size_t b = in.find(s.pattern); b != std::string_view::npos;
             b = in.find(s.pattern, done))
          replace(b, b + s.pattern.size());
      }
      if (done == 0 && out.empty()) return false;
      keep(done, in.size());
      origin = out_origin;
      return true;
    }
    case NormalizerStep::kPrepend:
      if (in.empty()) return false;
      out.reserve(s.content.size() + in.size());
      out.append(s.content);
      out.append(in);
      if (origin > 0) origin += s.content.size();  // aligned with the first character
      return true;
  }
  return false;
}

}  // namespace strata::data::hf
