#include "strata/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>

#include "strata/core/check.h"
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
  Output(const std::string& out_path, bool into_dir, const std::string& split, bool megatron) {
    const std::string stem =
        into_dir ? (fs::path(out_path) / split).string() : out_path + "_" + split;
    if (megatron) {
      name_ = stem;
      megatron_ = std::make_unique<MegatronWriter>(name_, TokenType::U16);
    } else {
      name_ = stem + ".bin";
      llmc_ = std::make_unique<LlmcShardWriter>(name_, false);
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

}  // namespace

PrepareResult prepare_text_dataset(const std::vector<std::string>& inputs,
                                   const std::string& out_path, const std::string& format,
                                   double val_fraction) {
  STRATA_INPUT_CHECK(format == "llmc" || format == "megatron", "unknown output format \"", format,
                     "\"; use llmc or megatron");
  STRATA_INPUT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val fraction ", val_fraction,
                     " is outside [0, 1); give e.g. 0.1 for a 10% validation split, or 0");
  STRATA_INPUT_CHECK(!inputs.empty(), "no inputs; give text files or directories of them");
  STRATA_INPUT_CHECK(!out_path.empty(), "empty output path; give e.g. data/mytext");

  PrepareResult r;
  const std::vector<std::string> files = collect_files(inputs);
  STRATA_INPUT_CHECK(!files.empty(), "no input files: the inputs hold no regular files");
  const std::vector<Document> docs = classify(files, r);
  STRATA_INPUT_CHECK(!docs.empty(), "nothing readable in the inputs: all ", files.size(),
                     " files were skipped (", r.files_skipped_binary, " binary, ",
                     r.files_skipped_gzip, " gzip, ", r.files_skipped_empty, " empty, ",
                     r.files_skipped_unreadable, " unreadable); give plain text files");

  int64_t total = 0;
  for (const Document& d : docs) total += d.bytes + 1;
  int64_t val_target = 0;
  if (val_fraction > 0.0 && total >= 2) {
    val_target = std::clamp<int64_t>(std::llround(val_fraction * double(total)), 1, total - 1);
  }
  // Without a val split everything goes to train, even if a file grew since it was measured.
  const int64_t train_target =
      val_target > 0 ? total - val_target : std::numeric_limits<int64_t>::max();
  const bool megatron = format == "megatron";
  STRATA_INPUT_CHECK(megatron || total - val_target <= std::numeric_limits<int32_t>::max(),
                     "the inputs make ", total - val_target, " training tokens, more than an ",
                     "llm.c shard holds (2^31-1); use --format megatron");

  const bool into_dir = is_output_dir(out_path);
  const std::string dir = into_dir ? out_path : fs::path(out_path).parent_path().string();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    STRATA_INPUT_CHECK(!ec && fs::is_directory(dir), "cannot create output directory ", dir, ": ",
                       ec ? ec.message() : "a file of that name exists",
                       "; choose an output path in a writable directory");
  }
  Output train(out_path, into_dir, "train", megatron);
  std::unique_ptr<Output> val;
  if (val_target > 0) val = std::make_unique<Output>(out_path, into_dir, "val", megatron);

  const ByteTokenizer tok;
  std::vector<int32_t> ids;
  std::vector<char> chunk(kChunkBytes);
  // Sends tokens to train until it holds train_target, then to val. A document cut in two ends
  // in train and continues as a new document in val.
  auto emit = [&](const int32_t* t, int64_t n) {
    if (train.tokens() < train_target) {
      const int64_t k = std::min(n, train_target - train.tokens());
      train.append(t, k);
      if (train.tokens() == train_target) train.end_document();
      t += k, n -= k;
    }
    if (n > 0) {
      STRATA_CHECK(val != nullptr, "tokens past the train split with no val output");
      val->append(t, n);
    }
  };
  for (const Document& d : docs) {
    std::FILE* in = std::fopen(d.path.c_str(), "rb");
    if (!in) {
      ++r.files_skipped_unreadable;
      continue;
    }
    const int32_t eot = ByteTokenizer::kEot;
    emit(&eot, 1);
    size_t n;
    while ((n = std::fread(chunk.data(), 1, chunk.size(), in)) > 0) {
      ids.clear();
      tok.encode_append(std::string_view(chunk.data(), n), ids);
      emit(ids.data(), int64_t(ids.size()));
    }
    std::fclose(in);
    train.end_document();
    if (val) val->end_document();
    ++r.documents;
  }
  train.commit(r.outputs);
  if (val && val->tokens() > 0) val->commit(r.outputs);
  r.train_tokens = train.tokens();
  r.val_tokens = val ? val->tokens() : 0;
  r.files_skipped = r.files_skipped_binary + r.files_skipped_gzip + r.files_skipped_empty +
                    r.files_skipped_unreadable;
  return r;
}

}  // namespace strata::data
