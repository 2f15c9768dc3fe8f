// The `pre_tokenizer` of a tokenizer.json: Split (Regex or String pattern, every behavior,
// invert), Digits, Metaspace, ByteLevel (last), and Sequences of them; null leaves each piece of
// text one word. The words go to the model (hf_bpe.h).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/data/hf_support.h"

namespace strata::data::hf {

// `tokenizers`' SplitDelimiterBehavior: what becomes of a match when a piece is split.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  enum Kind { kSplit, kMetaspace, kByteLevel } kind;
  int regex = -1;  // kSplit (Digits too), or kByteLevel with use_regex: GPT-2's pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace: one character, "▁" in every released model
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;  // kMetaspace
  bool split = true;                                           // kMetaspace
};

class PreTokenizer {
 public:
  // Reads root["pre_tokenizer"]; regexes are compiled into `regexes`.
  void read(const Reader& r, const json& root, RegexSet& regexes);
  const std::vector<PreStep>& steps() const { return steps_; }
  // Whether the words are byte-level (a ByteLevel step, which is the last): the model's symbols
  // are then bytes, else Unicode characters.
  bool byte_level() const { return !steps_.empty() && steps_.back().kind == PreStep::kByteLevel; }

 private:
  void read_one(const Reader& r, const json& p, const std::string& path, RegexSet& regexes);
  std::vector<PreStep> steps_;
};

// Per-thread pre-tokenization state: the split points and rewritten text of each step.
class PreTokenizerRun {
 public:
  using OnWord = std::function<void(std::string_view)>;
  explicit PreTokenizerRun(const PreTokenizer& pre);
  // Splits `piece` (non-empty) into words, in order, for on_word. `origin`: how many bytes at the
  // start of the piece `tokenizers` aligns with the first character of the text being encoded
  // (0 when the piece does not start there); Metaspace's prepend_scheme "first" prepends where it
  // is not 0.
  void run(std::string_view piece, size_t origin, Matcher& m, const OnWord& on_word) {
    step(piece, origin, 0, m, on_word);
  }

 private:
  struct Span {
    size_t b, e;
    bool match;
  };
  void step(std::string_view piece, size_t origin, size_t k, Matcher& m, const OnWord& on_word);
  // Splits by spans_[k] (the matches and the text between them, in `tokenizers`' find_matches
  // form) under `behavior`, and runs step k + 1 on each non-empty part.
  void split(std::string_view piece, size_t origin, size_t k, SplitBehavior behavior, Matcher& m,
             const OnWord& on_word);

  const PreTokenizer& pre_;
  std::vector<std::vector<Span>> spans_;  // per step
  std::vector<std::string> text_;         // per step: Metaspace's and ByteLevel's rewritten piece
};

}  // namespace strata::data::hf
