// A Hugging Face `tokenizer.json` read and run for encoding, giving exactly the ids of the
// `tokenizers` package: the BPE tokenizers of GPT-2, Llama-3, Qwen2/3, SmolLM2 and OLMo 2
// (byte-level) and of Gemma, Llama-2, Mistral and Phi-3 (SentencePiece-style, over characters).
//
// What is read (anything else is refused with an InputError naming the key path):
//   normalizer      null, NFC/NFD/NFKC/NFKD (ICU), Replace, Prepend, Sequence (hf_normalizer.h)
//   pre_tokenizer   null, Split (every behavior, invert), Digits, Metaspace, ByteLevel (last),
//                   Sequence (hf_pre_tokenizer.h)
//   model           BPE: vocab, merges ("a b" strings or [a, b] pairs), unk_token, fuse_unk,
//                   byte_fallback, ignore_merges; dropout null, no subword prefix or suffix
//                   (hf_bpe.h)
//   added_tokens    matched as `tokenizers` does: leftmost longest, the normalized=false ones on
//                   the raw text, then the normalized=true ones by their normalized content in the
//                   normalized text between those; single_word, lstrip and rstrip kept
//   post_processor  null, ByteLevel, TemplateProcessing or a Sequence of them: the ids the
//                   "single" template puts before and after the sequence
// Regexes run in PCRE2 (UTF + UCP, JIT where available). Encoding is thread-safe through one
// Session per thread, which holds the match buffers and a cache of word ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data {

// The byte offset of the first byte of `text` that is not well-formed UTF-8 (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed, as for Rust's str), or nullopt.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Ids are below this bound (2^24); a vocabulary naming larger ids is refused.
inline constexpr int64_t kMaxTokenizerVocab = int64_t(1) << 24;

class HfTokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one. Throws InputError for anything it cannot
  // read or does not implement, naming the file and the key.
  static std::shared_ptr<const HfTokenizer> load(const std::string& path);
  // The same from the file's text; `source` names it in messages.
  static std::shared_ptr<const HfTokenizer> parse(std::string_view json_text,
                                                  const std::string& source);

  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // Per-thread encoding state.
  class Session {
   public:
    explicit Session(const HfTokenizer& tok);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    // Appends the ids of `text` (well-formed UTF-8, see first_invalid_utf8) as `tokenizers`'
    // encode(text, add_special_tokens=False): added tokens in the text are matched, no template.
    void encode_append(std::string_view text, std::vector<int32_t>& out);

   private:
    struct State;
    std::unique_ptr<State> s_;
  };

  // The ids the post-processor's single template puts before and after a sequence (Llama-3:
  // {<|begin_of_text|>}, {}); both empty for GPT-2's ByteLevel processor.
  const std::vector<int32_t>& template_prefix() const;
  const std::vector<int32_t>& template_suffix() const;
  // Largest id of the vocabulary and added tokens, + 1.
  int64_t vocab_size() const;
  // The id of an added token or vocabulary entry, by its text as written in the file.
  std::optional<int32_t> token_id(std::string_view content) const;
  const std::string& source() const;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::data
