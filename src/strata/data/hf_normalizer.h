// The `normalizer` of a tokenizer.json: NFC, NFD, NFKC, NFKD (through ICU), Replace (a String or
// Regex pattern and its `content`), Prepend, and Sequences of them. `tokenizers` runs it on each
// piece of text between the added tokens matched on the raw text, before the pre-tokenizer.
#pragma once

#include <unicode/normalizer2.h>

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "strata/data/hf_support.h"

namespace strata::data::hf {

struct NormalizerStep {
  enum Kind { kUnicode, kReplace, kPrepend } kind;
  const icu::Normalizer2* unicode = nullptr;  // kUnicode: ICU's NFC, NFD, NFKC or NFKD
  int regex = -1;                             // kReplace with a Regex pattern, in the RegexSet
  std::string pattern;                        // kReplace with a String pattern
  std::string content;                        // kReplace: the replacement; kPrepend: the prefix
};

class Normalizer {
 public:
  // Reads root["normalizer"]: null, one normalizer, or a Sequence (nested ones are flattened).
  // Regex patterns are compiled into `regexes`.
  void read(const Reader& r, const json& root, RegexSet& regexes);
  bool empty() const { return steps_.empty(); }
  // `in` normalized: `in` itself when no step changed it, else a view of one of `bufs`.
  // `origin`: how many bytes at the start of the text `tokenizers` aligns with the first
  // character of the text being encoded (0 for text that does not start there), before and after
  // (see PreTokenizerRun::run).
  std::string_view apply(std::string_view in, size_t& origin, Matcher& m,
                         std::array<std::string, 2>& bufs) const;

 private:
  void read_one(const Reader& r, const json& n, const std::string& path, RegexSet& regexes);
  // One step from `in` into `out`; false (and `out` unused) when it changes nothing.
  bool apply_step(const NormalizerStep& s, std::string_view in, size_t& origin, Matcher& m,
                  std::string& out) const;

  std::vector<NormalizerStep> steps_;
};

}  // namespace strata::data::hf
