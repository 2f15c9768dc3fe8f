#include "strata/data/hf_pre_tokenizer.h"

#include <algorithm>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"

namespace strata::data::hf {

namespace {

// GPT-2's pre-tokenizer pattern, which `tokenizers`' ByteLevel(use_regex=true) applies; it is part
// of that pre-tokenizer's definition, not of the file.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior read_behavior(const Reader& r, const json& p, const std::string& path) {
  const std::string b = r.get_choice(
      p, "behavior", path,
      {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}, true);
  return b == "Removed"              ? SplitBehavior::kRemoved
         : b == "Isolated"           ? SplitBehavior::kIsolated
         : b == "MergedWithPrevious" ? SplitBehavior::kMergedWithPrevious
         : b == "MergedWithNext"     ? SplitBehavior::kMergedWithNext
                                     : SplitBehavior::kContiguous;
}

}  // namespace

void PreTokenizer::read(const Reader& r, const json& root, RegexSet& regexes) {
  if (const json* p = r.find(root, "pre_tokenizer")) read_one(r, *p, "pre_tokenizer", regexes);
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    if (steps_[i].kind == PreStep::kByteLevel)
      r.fail("pre_tokenizer",
             "has a ByteLevel step before other steps; strata implements ByteLevel as the last "
             "pre-tokenizer step (as GPT-2, Llama-3, Qwen2 and SmolLM2 have it)");
  }
}

void PreTokenizer::read_one(const Reader& r, const json& p, const std::string& path,
                            RegexSet& regexes) {
  if (!p.is_object()) r.fail(path, "must be an object or null, not " + shorten(p.dump()));
  const std::string type = r.get_string(p, "type", path);
  PreStep s{};
  if (type == "Sequence") {
    const json& list = r.get_array(p, "pretokenizers", path);
    for (size_t i = 0; i < list.size(); ++i)
      read_one(r, list[i], path + ".pretokenizers[" + std::to_string(i) + "]", regexes);
    return;
  }
  if (type == "ByteLevel") {
    s.kind = PreStep::kByteLevel;
    s.add_prefix_space = r.get_bool(p, "add_prefix_space", path, true);
    if (r.get_bool(p, "use_regex", path, true))
      s.regex = add_regex(regexes, kGpt2Pattern, false, path);
  } else if (type == "Split") {
    s.kind = PreStep::kSplit;
    const json& pat = r.get_object(p, "pattern", path);
    const bool regex = r.find(pat, "Regex") != nullptr;
    if (pat.size() != 1 || (!regex && !r.find(pat, "String")))
      r.fail(path + ".pattern",
             "must be {\"String\": ...} or {\"Regex\": ...}, not " + shorten(pat.dump()));
    const std::string text = r.get_string(pat, regex ? "Regex" : "String", path + ".pattern");
    if (text.empty()) r.fail(path + ".pattern", "is empty");
    if (first_invalid_utf8(text)) r.fail(path + ".pattern", "is not valid UTF-8");
    s.regex = add_regex(regexes, text, !regex, path + ".pattern");
    s.behavior = read_behavior(r, p, path);
    s.invert = r.get_bool(p, "invert", path, false);
  } else if (type == "Digits") {
    // `tokenizers` splits on char::is_numeric (\p{N}), one match per digit: Isolated keeps each
    // apart, Contiguous joins runs, as \p{N}+ does.
    if (!r.find(p, "individual_digits"))
      r.fail(path + ".individual_digits",
             "is missing; it must be true (each digit a word) or false (runs of digits)");
    const bool individual = r.get_bool(p, "individual_digits", path, false);
    s.kind = PreStep::kSplit;
    s.regex = add_regex(regexes, individual ? "\\p{N}" : "\\p{N}+", false, path);
  } else if (type == "Metaspace") {
    s.kind = PreStep::kMetaspace;
    s.replacement = r.get_string(p, "replacement", path);
    size_t one = 0;  // the length of its first character
    if (!s.replacement.empty() && !first_invalid_utf8(s.replacement))
      next_code_point(s.replacement, one);
    if (s.replacement.empty() || one != s.replacement.size())
      r.fail(path + ".replacement",
             "is \"" + shorten(s.replacement) + "\"; it must be one character, e.g. \"▁\"");
    const std::string scheme =
        r.get_choice(p, "prepend_scheme", path, {"always", "first", "never"}, false);
    s.prepend = scheme == "always"  ? PreStep::kAlways
                : scheme == "first" ? PreStep::kFirst
                                    : PreStep::kNever;
    // Files from before prepend_scheme (tokenizers < 0.15) have add_prefix_space; false means
    // "never", and `tokenizers` refuses it beside another scheme.
    if (!r.get_bool(p, "add_prefix_space", path, true)) {
      if (s.prepend != PreStep::kNever)
        r.fail(path + ".add_prefix_space",
               "is false but prepend_scheme is \"" + scheme +
                   "\"; set prepend_scheme to \"never\" (or add_prefix_space to true)");
    }
    s.split = r.get_bool(p, "split", path, true);
  } else {
    r.fail(path + ".type", "is \"" + shorten(type) +
                               "\"; strata implements the ByteLevel, Split, Digits, Metaspace and "
                               "Sequence pre-tokenizers");
  }
  steps_.push_back(std::move(s));
}

PreTokenizerRun::PreTokenizerRun(const PreTokenizer& pre)
    : pre_(pre), spans_(pre.steps().size()), text_(pre.steps().size()) {}

void PreTokenizerRun::step(std::string_view piece, size_t origin, size_t k, Matcher& m,
                           const OnWord& on_word) {
  if (k == pre_.steps().size()) return on_word(piece);
  const PreStep& s = pre_.steps()[k];
  std::vector<Span>& spans = spans_[k];
  spans.clear();
  if (s.kind == PreStep::kMetaspace) {
    // Spaces become the replacement, each aligned with its space; a prepended replacement is
    // aligned with the first character.
    std::string& t = text_[k];
    t.clear();
    const bool prepend =
        (s.prepend == PreStep::kAlways || (s.prepend == PreStep::kFirst && origin > 0)) &&
        !(piece[0] == ' ' || piece.substr(0, s.replacement.size()) == s.replacement);
    if (prepend) t = s.replacement;
    size_t t_origin = 0;
    for (size_t i = 0; i < piece.size(); ++i) {
      if (i == origin && origin > 0) t_origin = t.size();
      if (piece[i] == ' ') {
        t += s.replacement;
      } else {
        t.push_back(piece[i]);
      }
    }
    if (origin == piece.size()) t_origin = t.size();
    if (!s.split) return step(t, t_origin, k + 1, m, on_word);
    // Each replacement character is a match, merged with what follows it.
    size_t last = 0;
    for (size_t b = t.find(s.replacement); b != std::string::npos;
         b = t.find(s.replacement, last)) {
      if (b > last) spans.push_back({last, b, false});
      last = b + s.replacement.size();
      spans.push_back({b, last, true});
    }
    if (last < t.size()) spans.push_back({last, t.size(), false});
    return split(t, t_origin, k, SplitBehavior::kMergedWithNext, m, on_word);
  }
  if (s.kind == PreStep::kByteLevel && s.add_prefix_space && piece[0] != ' ') {
    std::string& t = text_[k];
    t.assign(1, ' ');
    t.append(piece);
    piece = t;
    if (origin > 0) ++origin;
  }
  if (s.regex < 0) return step(piece, origin, k + 1, m, on_word);
  // `tokenizers`' Pattern::find_matches: the matches and the text between them, in order.
  size_t last = 0;
  m.for_each_match(s.regex, piece, [&](size_t b, size_t e) {
    if (b > last) spans.push_back({last, b, s.invert});
    spans.push_back({b, e, !s.invert});
    last = e;
  });
  if (last < piece.size()) spans.push_back({last, piece.size(), s.invert});
  split(piece, origin, k, s.behavior, m, on_word);
}

void PreTokenizerRun::split(std::string_view piece, size_t origin, size_t k, SplitBehavior behavior,
                            Matcher& m, const OnWord& on_word) {
  std::vector<Span>& spans = spans_[k];
  // Folded in place as `tokenizers`' NormalizedString::split folds them; `prev_match` is the
  // flag of the previous span before folding.
  size_t n = 0;
  bool prev_match = false;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span sp = spans[i];
    bool join = false;  // extend the last kept span
    switch (behavior) {
      case SplitBehavior::kRemoved:
        if (sp.match) continue;
        break;
      case SplitBehavior::kIsolated:
        break;
      case SplitBehavior::kContiguous:
        join = n > 0 && sp.match == prev_match;
        break;
      case SplitBehavior::kMergedWithPrevious:
        join = n > 0 && sp.match && !prev_match;
        break;
      case SplitBehavior::kMergedWithNext:
        // A match joins the span after it when that one is not a match.
        if (sp.match && i + 1 < spans.size() && !spans[i + 1].match) {
          spans[n++] = {sp.b, spans[i + 1].e, false};
          ++i;
          prev_match = false;
          continue;
        }
        break;
    }
    prev_match = sp.match;
    if (join) {
      spans[n - 1].e = sp.e;
    } else {
      spans[n++] = sp;
    }
  }
  spans.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Span sp = spans_[k][i];  // spans_[k] is not touched by the deeper steps
    if (sp.e > sp.b)
      step(piece.substr(sp.b, sp.e - sp.b), sp.b < origin ? std::min(origin, sp.e) - sp.b : 0,
           k + 1, m, on_word);
  }
}

}  // namespace strata::data::hf
