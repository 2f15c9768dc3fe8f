// clang-format off
// fuzz-sources: src/strata/data/hf_tokenizer.cc src/strata/data/hf_support.cc src/strata/data/hf_normalizer.cc src/strata/data/hf_pre_tokenizer.cc src/strata/data/hf_bpe.cc src/strata/core/check.cc
// fuzz-flags: -lpcre2-8 -licuuc
// clang-format on
//
// The Hugging Face tokenizer.json reader (data/hf_tokenizer.h) on arbitrary text, and the encoder
// on what it accepts. An InputError is the expected answer to garbage; a finding is a crash, a
// sanitizer report, any other exception, or an accepted tokenizer that breaks what encoding
// promises: every id in [0, vocab_size), the same ids when the same text is encoded again (the
// pre-token cache must not change them), and template ids inside the vocabulary. The texts
// encoded are fixed samples (ASCII, CJK, emoji, combining marks, odd whitespace, special-token
// look-alikes, text not in NFC) and the input itself where it is UTF-8. Seeds in
// fuzz/corpus/tokenizer/ are small files of each family strata reads: GPT-2, Llama-3, Qwen2 (NFC),
// SmolLM2 (Digits), Gemma (Replace, byte_fallback), Llama-2 legacy (Prepend), Mistral (Metaspace)
// and a mix of the other normalizers and Split behaviors.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"

namespace {

using strata::data::HfTokenizer;

void require(bool ok, const char* promise) {
  if (!ok) {
    std::fprintf(stderr, "accepted tokenizer breaks its promise: %s\n", promise);
    std::abort();
  }
}

void check_ids(const HfTokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) require(id >= 0 && id < tok.vocab_size(), "ids inside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const HfTokenizer> tok;
  try {
    tok = HfTokenizer::parse(text, "fuzz.json");
  } catch (const strata::InputError&) {
    return 0;
  }
  require(tok->vocab_size() >= 1 && tok->vocab_size() <= strata::data::kMaxTokenizerVocab,
          "a vocabulary size in [1, 2^24]");
  check_ids(*tok, tok->template_prefix());
  check_ids(*tok, tok->template_suffix());
  static const char* const kSamples[] = {
      "Hello world, it's 2026! DON'T  stop\r\n\tnow   ",
      "日本語のテキスト 中文 한국어 🙂👍🏽 e\u0301 naïve \u00a0\u3000x",
      "<|endoftext|><|begin_of_text|>a<|eot_id|> <mask>  ab",
      "<s>hi</s> x<bos>▁▁y <unk><|im_start|>a-b--c \u1100\u1161\ufb01 \xef\xbf\xbd",
      "12345678901234567890 3.14 \n\n\n   \x0b\x0c",
  };
  HfTokenizer::Session session(*tok);
  try {
    for (const char* sample : kSamples) {
      std::vector<int32_t> a, b;
      session.encode_append(sample, a);
      session.encode_append(sample, b);
      check_ids(*tok, a);
      require(a == b, "the same ids for the same text");
    }
    if (!strata::data::first_invalid_utf8(text) && size <= 4096) {
      std::vector<int32_t> ids;
      session.encode_append(text, ids);
      check_ids(*tok, ids);
    }
  } catch (const strata::InputError&) {
    // A pattern that exceeds PCRE2's match limit on a text: reported, not a crash.
  }
  return 0;
}
