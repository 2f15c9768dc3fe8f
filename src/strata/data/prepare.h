// `strata data prepare`: text files to a token dataset with the byte tokenizer.
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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::data {

struct PrepareResult {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t files_skipped = 0;             // all of the four below
  int64_t files_skipped_binary = 0;      // a NUL byte in the first 4 KiB
  int64_t files_skipped_gzip = 0;        // starts with the gzip magic 1f 8b
  int64_t files_skipped_empty = 0;       // 0 bytes
  int64_t files_skipped_unreadable = 0;  // could not be opened or read
  std::vector<std::string> outputs;      // the files written, final names
};

// format: "llmc" | "megatron"; val_fraction in [0, 1).
PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const std::string& format,
                                   double val_fraction);

}  // namespace strata::data
