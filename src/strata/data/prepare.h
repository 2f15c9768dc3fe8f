// `strata data prepare`: text files to a token dataset, with the byte tokenizer or a Hugging Face
// tokenizer.json (hf_tokenizer.h).
//
// Inputs are files or directories (walked recursively, sorted by path); every regular text
// file is one document. Skipped, and counted: gzip files, binary files (a NUL byte in the first
// 4 KiB), empty files and files that cannot be read. The token stream is, per document, an
// end-of-text token followed by the document's bytes (llm.c's convention: EOT opens a document),
// so it holds sum(file sizes) + documents tokens. The last `val_fraction` of the stream is the
// validation split (a document may straddle the cut; for Megatron it becomes two documents).
//   format "llmc":     out_path + "_train.bin", out_path + "_val.bin" (uint16 llm.c shards)
//   format "megatron": out_path + "_train.{bin,idx}", out_path + "_val.{bin,idx}" (uint16)
// When out_path is an existing directory or ends in '/', the files go inside it instead:
// out_path/train.bin, out_path/val.bin (megatron: out_path/train.{bin,idx}, ...), the directory
// created if needed. No val files are written when val_fraction is 0. Every file is written
// atomically; `outputs` lists them.
//
// With a tokenizer (options.tokenizer: a tokenizer.json or its directory), each document is read
// whole, must be UTF-8 (else InputError naming the file and byte offset, and no output is left),
// and is encoded as `tokenizers`' encode(text, add_special_tokens=True):
//   - a post-processor template that adds tokens (Llama-3: BOS) frames each document with them;
//   - otherwise (GPT-2) the end-of-text token <|endoftext|> opens each document, as llm.c does.
//   append_eod (Megatron's --append-eod): the end-of-text token closes each document instead of
//   opening it (GPT-2), or after the template's tokens (Llama-3: <|end_of_text|>).
// Documents are encoded in parallel (OpenMP), written in input order: the output does not depend
// on the thread count. Token width: llm.c uint16 when every id < 65536 (the vocabulary), else
// uint32; Megatron uint16 below 65,500 ids, else int32 (as Megatron's preprocess_data.py). With a
// val split the tokens are held in memory until the total is known (4 bytes a token).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::data {

struct PrepareResult {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t files_skipped = 0;                    // all of the four below
  int64_t files_skipped_binary = 0;             // a NUL byte in the first 4 KiB
  int64_t files_skipped_gzip = 0;               // starts with the gzip magic 1f 8b
  int64_t files_skipped_empty = 0;              // 0 bytes
  int64_t files_skipped_unreadable = 0;         // could not be opened or read
  std::vector<std::string> outputs;             // the files written, final names
  int64_t vocab_size = 0;                       // the tokenizer's ids: [0, vocab_size)
  std::string token_type;                       // "uint16", "uint32", "int32"
  std::vector<int32_t> doc_prefix, doc_suffix;  // the ids around every document
};

struct PrepareOptions {
  std::string format = "llmc";  // "llmc" | "megatron"
  double val_fraction = 0.0;    // in [0, 1)
  std::string tokenizer;        // empty: the byte tokenizer
  bool append_eod = false;      // needs a tokenizer
};

PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const PrepareOptions& options);

// The byte tokenizer, format "llmc" | "megatron", val_fraction in [0, 1).
PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const std::string& format,
                                   double val_fraction);

// Where a split goes: out_path + "_" + split, or out_path/split when out_path is an existing
// directory or ends in '/' (as above); the directory is created (InputError when it cannot be).
std::string prepare_output_stem(const std::string& out_path, const std::string& split);

// The end-of-text token of a tokenizer: the first of <|end_of_text|> (Llama-3), <|endoftext|>
// (GPT-2, Qwen2, SmolLM2), </s> (Llama-2, Mistral), <eos> (Gemma) that it has; nullopt if none.
class HfTokenizer;
std::optional<int32_t> end_of_text_id(const HfTokenizer& tok);

}  // namespace strata::data
