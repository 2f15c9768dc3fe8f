#include "strata/data/prepare.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>

#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/data/hf_tokenizer.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/tokenizer.h"

namespace strata::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kSniffBytes = 4096;
constexpr size_t kChunkBytes = size_t(1) << 20;

struct Document {
  std::string path;
  int64_t bytes;
};

std::vector<std::string> collect_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(input, ec);
    STRATA_INPUT_CHECK(fs::exists(st), "input ", input, " does not exist; give text files or ",
                       "directories of them");
    if (fs::is_regular_file(st)) {
      files.push_back(input);
      continue;
    }
    STRATA_INPUT_CHECK(fs::is_directory(st), "input ", input,
                       " is neither a regular file nor a directory");
    std::vector<std::string> found;
    const auto opts = fs::directory_options::skip_permission_denied;
    for (fs::recursive_directory_iterator it(input, opts, ec), end; !ec && it != end;
         it.increment(ec)) {
      std::error_code ec2;
      if (it->is_regular_file(ec2)) found.push_back(it->path().string());
    }
    STRATA_INPUT_CHECK(!ec, "cannot walk directory ", input, ": ", ec.message());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// Sorts files into documents and skip counts, from their sizes and first 4 KiB.
std::vector<Document> classify(const std::vector<std::string>& files, PrepareResult& r) {
  std::vector<Document> docs;
  char head[kSniffBytes];
  for (const std::string& f : files) {
    std::FILE* in = std::fopen(f.c_str(), "rb");
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (!in || ec) {
      if (in) std::fclose(in);
      ++r.files_skipped_unreadable;
      continue;
    }
    const size_t n = std::fread(head, 1, sizeof(head), in);
    const bool read_error = std::ferror(in);
    std::fclose(in);
    if (read_error) {
      ++r.files_skipped_unreadable;
    } else if (size == 0) {
      ++r.files_skipped_empty;
    } else if (n >= 2 && uint8_t(head[0]) == 0x1f && uint8_t(head[1]) == 0x8b) {
      ++r.files_skipped_gzip;
    } else if (std::memchr(head, 0, n) != nullptr) {
      ++r.files_skipped_binary;
    } else {
      docs.push_back({f, int64_t(size)});
    }
  }
  return docs;
}

// Whether the outputs go inside `out_path` (DIR/train.bin) rather than beside it as a prefix
// (PREFIX_train.bin): an existing directory, or a path ending in a separator.
bool is_output_dir(const std::string& out_path) {
  std::error_code ec;
  return out_path.back() == '/' || fs::is_directory(out_path, ec);
}

// One split of the output, in either format.
class Output {
 public:
  // type: U16, or U32 (llm.c) / I32 (Megatron) for larger vocabularies.
  Output(const std::string& out_path, bool into_dir, const std::string& split, bool megatron,
         TokenType type) {
    const std::string stem =
        into_dir ? (fs::path(out_path) / split).string() : out_path + "_" + split;
    if (megatron) {
      name_ = stem;
      megatron_ = std::make_unique<MegatronWriter>(name_, type);
    } else {
      name_ = stem + ".bin";
      llmc_ = std::make_unique<LlmcShardWriter>(name_, type != TokenType::U16);
    }
  }
  void append(const int32_t* tokens, int64_t n) {
    if (n == 0) return;
    megatron_ ? megatron_->append(tokens, n) : llmc_->append(tokens, n);
    tokens_ += n;
    open_ = true;
  }
  void end_document() {
    if (open_ && megatron_) megatron_->end_document();
    open_ = false;
  }
  int64_t tokens() const { return tokens_; }
  void commit(std::vector<std::string>& outputs) {
    if (megatron_) {
      megatron_->commit();
      outputs.push_back(name_ + ".bin");
      outputs.push_back(name_ + ".idx");
    } else {
      llmc_->commit();
      outputs.push_back(name_);
    }
  }

 private:
  std::string name_;
  std::unique_ptr<MegatronWriter> megatron_;
  std::unique_ptr<LlmcShardWriter> llmc_;
  int64_t tokens_ = 0;
  bool open_ = false;
};

struct Inputs {
  std::vector<Document> docs;
  bool megatron;
  bool into_dir;
};

// Checks the arguments, finds and sorts the documents, and creates the output directory.
Inputs check_inputs(const std::vector<std::string>& inputs, const std::string& out_path,
                    const PrepareOptions& o, PrepareResult& r) {
  STRATA_INPUT_CHECK(o.format == "llmc" || o.format == "megatron", "unknown output format \"",
                     o.format, "\"; use llmc or megatron");
  STRATA_INPUT_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0, "val fraction ", o.val_fraction,
                     " is outside [0, 1); give e.g. 0.1 for a 10% validation split, or 0");
  STRATA_INPUT_CHECK(!inputs.empty(), "no inputs; give text files or directories of them");
  STRATA_INPUT_CHECK(!out_path.empty(), "empty output path; give e.g. data/mytext");
  STRATA_INPUT_CHECK(!o.append_eod || !o.tokenizer.empty(),
                     "--append-eod needs --tokenizer: the byte tokenizer's end-of-text token "
                     "always opens a document");
  const std::vector<std::string> files = collect_files(inputs);
  STRATA_INPUT_CHECK(!files.empty(), "no input files: the inputs hold no regular files");
  Inputs in{classify(files, r), o.format == "megatron", is_output_dir(out_path)};
  STRATA_INPUT_CHECK(!in.docs.empty(), "nothing readable in the inputs: all ", files.size(),
                     " files were skipped (", r.files_skipped_binary, " binary, ",
                     r.files_skipped_gzip, " gzip, ", r.files_skipped_empty, " empty, ",
                     r.files_skipped_unreadable, " unreadable); give plain text files");
  return in;
}

void make_output_dir(const std::string& out_path, bool into_dir) {
  const std::string dir = into_dir ? out_path : fs::path(out_path).parent_path().string();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    STRATA_INPUT_CHECK(!ec && fs::is_directory(dir), "cannot create output directory ", dir, ": ",
                       ec ? ec.message() : "a file of that name exists",
                       "; choose an output path in a writable directory");
  }
}

// Where the val split starts in a stream of `total` tokens.
int64_t val_tokens_for(double val_fraction, int64_t total) {
  if (val_fraction <= 0.0 || total < 2) return 0;
  return std::clamp<int64_t>(std::llround(val_fraction * double(total)), 1, total - 1);
}

// Sends tokens to train until it holds train_target, then to val. A document cut in two ends in
// train and continues as a new document in val.
struct Splitter {
  Output* train;
  Output* val;
  int64_t train_target;
  void emit(const int32_t* t, int64_t n) {
    if (train->tokens() < train_target) {
      const int64_t k = std::min(n, train_target - train->tokens());
      train->append(t, k);
      if (train->tokens() == train_target) train->end_document();
      t += k, n -= k;
    }
    if (n > 0) {
      STRATA_CHECK(val != nullptr, "tokens past the train split with no val output");
      val->append(t, n);
    }
  }
  void end_document() {
    train->end_document();
    if (val) val->end_document();
  }
};

void finish(PrepareResult& r, Output& train, Output* val) {
  train.commit(r.outputs);
  if (val && val->tokens() > 0) val->commit(r.outputs);
  r.train_tokens = train.tokens();
  r.val_tokens = val ? val->tokens() : 0;
  r.files_skipped = r.files_skipped_binary + r.files_skipped_gzip + r.files_skipped_empty +
                    r.files_skipped_unreadable;
}

PrepareResult prepare_bytes(const std::vector<std::string>& inputs, const std::string& out_path,
                            const PrepareOptions& o) {
  PrepareResult r;
  const Inputs in = check_inputs(inputs, out_path, o, r);
  int64_t total = 0;
  for (const Document& d : in.docs) total += d.bytes + 1;
  const int64_t val_target = val_tokens_for(o.val_fraction, total);
  // Without a val split everything goes to train, even if a file grew since it was measured.
  const int64_t train_target =
      val_target > 0 ? total - val_target : std::numeric_limits<int64_t>::max();
  STRATA_INPUT_CHECK(in.megatron || total - val_target <= std::numeric_limits<int32_t>::max(),
                     "the inputs make ", total - val_target, " training tokens, more than an ",
                     "llm.c shard holds (2^31-1); use --format megatron");
  make_output_dir(out_path, in.into_dir);
  Output train(out_path, in.into_dir, "train", in.megatron, TokenType::U16);
  std::unique_ptr<Output> val;
  if (val_target > 0)
    val = std::make_unique<Output>(out_path, in.into_dir, "val", in.megatron, TokenType::U16);
  Splitter split{&train, val.get(), train_target};

  const ByteTokenizer tok;
  std::vector<int32_t> ids;
  std::vector<char> chunk(kChunkBytes);
  for (const Document& d : in.docs) {
    std::FILE* f = std::fopen(d.path.c_str(), "rb");
    if (!f) {
      ++r.files_skipped_unreadable;
      continue;
    }
    const int32_t eot = ByteTokenizer::kEot;
    split.emit(&eot, 1);
    size_t n;
    while ((n = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) {
      ids.clear();
      tok.encode_append(std::string_view(chunk.data(), n), ids);
      split.emit(ids.data(), int64_t(ids.size()));
    }
    std::fclose(f);
    split.end_document();
    ++r.documents;
  }
  r.vocab_size = ByteTokenizer::kVocabSize;
  r.token_type = "uint16";
  r.doc_prefix = {ByteTokenizer::kEot};
  finish(r, train, val.get());
  return r;
}

// Reads a whole file; false if it cannot be read.
bool read_file(const std::string& path, std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  text.clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  return ok;
}

// Documents are read and encoded this many bytes at a time.
constexpr int64_t kBatchBytes = int64_t(64) << 20;

PrepareResult prepare_tokenizer(const std::vector<std::string>& inputs, const std::string& out_path,
                                const PrepareOptions& o) {
  PrepareResult r;
  const std::shared_ptr<const HfTokenizer> tok = HfTokenizer::load(o.tokenizer);
  const Inputs in = check_inputs(inputs, out_path, o, r);

  r.doc_prefix = tok->template_prefix();
  r.doc_suffix = tok->template_suffix();
  const std::optional<int32_t> eot = end_of_text_id(*tok);
  const bool has_template = !r.doc_prefix.empty() || !r.doc_suffix.empty();
  if (!has_template || o.append_eod) {
    STRATA_INPUT_CHECK(eot.has_value(), tok->source(), ": no end-of-text token (",
                       "<|end_of_text|>, <|endoftext|>, </s> or <eos>) ",
                       has_template ? "for --append-eod"
                                    : "to open each document with, and its "
                                      "post-processor adds no BOS",
                       "; add one to added_tokens");
    (o.append_eod ? r.doc_suffix : r.doc_prefix).push_back(*eot);
  }
  r.vocab_size = tok->vocab_size();
  TokenType type = TokenType::U16;
  if (in.megatron) {
    type = megatron_token_type_for_vocab(r.vocab_size);
  } else if (r.vocab_size > 65536) {
    type = TokenType::U32;
  }
  r.token_type = token_type_name(type);

  // A val split needs the total first: the documents' tokens wait in memory.
  const bool hold = o.val_fraction > 0.0;
  std::vector<std::vector<int32_t>> held;

  make_output_dir(out_path, in.into_dir);
  std::unique_ptr<Output> train =
      std::make_unique<Output>(out_path, in.into_dir, "train", in.megatron, type);
  std::unique_ptr<Output> val;
  Splitter split{train.get(), nullptr, std::numeric_limits<int64_t>::max()};

  const int threads = omp_get_max_threads();
  std::vector<std::unique_ptr<HfTokenizer::Session>> sessions(static_cast<size_t>(threads));
  for (auto& s : sessions) s = std::make_unique<HfTokenizer::Session>(*tok);

  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::exception_ptr> errors;
  std::vector<size_t> batch;  // indices into in.docs
  uint64_t all_bytes = 0;
  for (const Document& d : in.docs) all_bytes += uint64_t(d.bytes);
  const ProgressTask progress("tokenizing", all_bytes, ProgressTask::Unit::Bytes);
  size_t next = 0;
  while (next < in.docs.size()) {
    batch.clear();
    int64_t bytes = 0;
    while (next < in.docs.size() && (batch.empty() || bytes < kBatchBytes)) {
      bytes += in.docs[next].bytes;
      batch.push_back(next++);
    }
    const int64_t n = int64_t(batch.size());
    progress_advance(uint64_t(bytes));
    texts.resize(batch.size());
    std::vector<char> readable(batch.size());
    for (int64_t i = 0; i < n; ++i)
      readable[size_t(i)] = read_file(in.docs[batch[size_t(i)]].path, texts[size_t(i)]);
    ids.assign(batch.size(), {});
    errors.assign(batch.size(), nullptr);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      if (!readable[size_t(i)]) continue;
      try {
        const std::string& text = texts[size_t(i)];
        if (const auto bad = first_invalid_utf8(text)) {
          STRATA_INPUT_FAIL(in.docs[batch[size_t(i)]].path, ": not valid UTF-8 at byte offset ",
                            *bad, "; a tokenizer encodes text: convert the file to UTF-8 (e.g. ",
                            "iconv) or leave it out");
        }
        std::vector<int32_t>& out = ids[size_t(i)];
        out = r.doc_prefix;
        sessions[size_t(omp_get_thread_num())]->encode_append(text, out);
        out.insert(out.end(), r.doc_suffix.begin(), r.doc_suffix.end());
      } catch (...) {
        errors[size_t(i)] = std::current_exception();
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (errors[size_t(i)]) std::rethrow_exception(errors[size_t(i)]);
      if (!readable[size_t(i)]) {
        ++r.files_skipped_unreadable;
        continue;
      }
      ++r.documents;
      if (hold) {
        held.push_back(std::move(ids[size_t(i)]));
      } else {
        split.emit(ids[size_t(i)].data(), int64_t(ids[size_t(i)].size()));
        split.end_document();
      }
    }
  }
  if (hold) {
    int64_t total = 0;
    for (const auto& d : held) total += int64_t(d.size());
    const int64_t val_target = val_tokens_for(o.val_fraction, total);
    if (val_target > 0) {
      val = std::make_unique<Output>(out_path, in.into_dir, "val", in.megatron, type);
      split = Splitter{train.get(), val.get(), total - val_target};
    }
    for (auto& d : held) {
      split.emit(d.data(), int64_t(d.size()));
      split.end_document();
      std::vector<int32_t>().swap(d);
    }
  }
  finish(r, *train, val.get());
  return r;
}

}  // namespace

std::optional<int32_t> end_of_text_id(const HfTokenizer& tok) {
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"}) {
    if (auto id = tok.token_id(name)) return id;
  }
  return std::nullopt;
}

std::string prepare_output_stem(const std::string& out_path, const std::string& split) {
  STRATA_INPUT_CHECK(!out_path.empty(), "empty output path; give e.g. data/mytext");
  const bool into_dir = is_output_dir(out_path);
  make_output_dir(out_path, into_dir);
  return into_dir ? (fs::path(out_path) / split).string() : out_path + "_" + split;
}

PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const PrepareOptions& options) {
  return options.tokenizer.empty() ? prepare_bytes(inputs, out_path, options)
                                   : prepare_tokenizer(inputs, out_path, options);
}

PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const std::string& format,
                                   double val_fraction) {
  PrepareOptions o;
  o.format = format;
  o.val_fraction = val_fraction;
  return prepare_text_dataset(inputs, out_path, o);
}

}  // namespace strata::data
