#include "strata/data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/mapped_token_dataset.h"
#include "strata/data/megatron_dataset.h"

namespace strata::data {

namespace fs = std::filesystem;

namespace {

// One piece of the dataset, in order: an llm.c shard, or a Megatron prefix (x for x.bin/x.idx).
struct Part {
  bool megatron;
  std::string path;
  bool operator==(const Part&) const = default;
};

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::string strip_extension(const std::string& s) {
  return s.substr(0, s.size() - 4);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

bool starts_with_llmc_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof(magic));
  return in.gcount() == sizeof(magic) && is_llmc_magic(magic);
}

Part classify_file(const std::string& file, const std::string& format) {
  const bool is_bin = ends_with(file, ".bin"), is_idx = ends_with(file, ".idx");
  if (format == "llmc") return {false, file};
  if (format == "megatron") {
    STRATA_INPUT_CHECK(is_bin || is_idx, file,
                       ": a Megatron dataset is named by its prefix x (meaning x.bin + x.idx) or "
                       "by x.bin / x.idx; this path ends in neither");
    return {true, strip_extension(file)};
  }
  if (is_idx) return {true, strip_extension(file)};
  // A Megatron .bin has no header; the .idx beside it is what marks it.
  if (is_bin && exists(strip_extension(file) + ".idx") && !starts_with_llmc_magic(file))
    return {true, strip_extension(file)};
  return {false, file};
}

std::vector<std::string> list_bin_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string p = it->path().string();
    if (ends_with(p, ".bin") && it->is_regular_file(ec)) files.push_back(p);
  }
  STRATA_INPUT_CHECK(!ec, "cannot list directory ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g;
  std::vector<std::string> files;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Part> resolve(const std::string& path, const std::string& format) {
  std::vector<Part> parts;
  auto add = [&](Part p) {
    if (std::find(parts.begin(), parts.end(), p) == parts.end()) parts.push_back(std::move(p));
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::vector<std::string> files = list_bin_files(path);
    STRATA_INPUT_CHECK(!files.empty(), "directory ", path,
                       " contains no .bin files; point data.path at llm.c shards (*.bin), a ",
                       "Megatron prefix, or a directory holding them");
    for (const std::string& f : files) add(classify_file(f, format));
  } else if (exists(path)) {
    add(classify_file(path, format));
  } else if (path.find_first_of("*?[") != std::string::npos) {
    const std::vector<std::string> files = glob_files(path);
    STRATA_INPUT_CHECK(!files.empty(), "no files match the pattern ", path,
                       "; check data.path (tried it as a glob pattern)");
    for (const std::string& f : files) {
      STRATA_INPUT_CHECK(!fs::is_directory(f, ec), "the pattern ", path, " matches directory ", f,
                         "; a pattern must match only data files");
      add(classify_file(f, format));
    }
  } else {
    const std::string bin = path + ".bin", idx = path + ".idx";
    STRATA_INPUT_CHECK(exists(bin) || exists(idx), "no dataset at ", path, ": tried ", path,
                       " (file, directory or glob pattern), and ", bin, " + ", idx,
                       " (Megatron prefix); none exists. Check data.path");
    if (format != "megatron" && !exists(idx)) {
      add(classify_file(bin, format));
    } else {
      add({true, path});
    }
  }
  return parts;
}

void check_format(const std::string& format) {
  STRATA_INPUT_CHECK(format == "auto" || format == "llmc" || format == "megatron",
                     "unknown dataset format \"", format, "\"; use auto, llmc or megatron");
}

std::unique_ptr<TokenDataset> open_parts(const std::string& source,
                                         const std::vector<Part>& parts) {
  auto ds = std::make_unique<MappedTokenDataset>(source);
  for (const Part& part : parts) {
    if (part.megatron) {
      add_megatron_dataset(*ds, part.path);
    } else {
      add_llmc_shard(*ds, part.path);
    }
  }
  ds->finalize();
  return ds;
}

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

// The words of a file name: runs of letters and digits, lower-cased.
std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> words;
  std::string w;
  for (char c : name + ".") {
    if (is_word_char(c)) {
      w += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      words.push_back(w), w.clear();
    }
  }
  return words;
}

// A directory's .bin files by split (a Megatron pair counts once, by its .bin).
struct DirSplits {
  std::vector<std::string> train, val, ignored;
};
DirSplits split_directory(const std::string& dir) {
  const std::vector<std::string> files = list_bin_files(dir);
  STRATA_INPUT_CHECK(!files.empty(), "directory ", dir,
                     " contains no .bin files; point data.path at llm.c shards (*.bin), a ",
                     "Megatron prefix, or a directory holding them");
  DirSplits d;
  bool named = false, any_train = false;
  for (const std::string& f : files) {
    const Split s = split_of(f);
    named |= s != Split::None;
    any_train |= s == Split::Train;
  }
  for (const std::string& f : files) {
    const Split s = split_of(f);
    if (s == Split::Val) {
      d.val.push_back(f);
    } else if (!named || s == Split::Train || !any_train) {
      d.train.push_back(f);
    } else {
      d.ignored.push_back(f);
    }
  }
  return d;
}

std::vector<Part> parts_of(const std::vector<std::string>& files, const std::string& format) {
  std::vector<Part> parts;
  for (const std::string& f : files) parts.push_back(classify_file(f, format));
  return parts;
}

// path with the last word "train" of its last component as "val", or "" when it has none.
std::string beside_val(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  for (size_t at = path.rfind("train"); at != std::string::npos && at >= base;
       at = at == 0 ? std::string::npos : path.rfind("train", at - 1)) {
    const bool left = at == base || !is_word_char(path[at - 1]);
    const bool right = at + 5 == path.size() || !is_word_char(path[at + 5]);
    if (left && right) return path.substr(0, at) + "val" + path.substr(at + 5);
  }
  return "";
}

bool dataset_exists(const std::string& path) {
  if (exists(path) || exists(path + ".bin") || exists(path + ".idx")) return true;
  return path.find_first_of("*?[") != std::string::npos && !glob_files(path).empty();
}

}  // namespace

std::unique_ptr<TokenDataset> open_dataset(const std::string& path, const std::string& format) {
  check_format(format);
  STRATA_INPUT_CHECK(!path.empty(), "empty dataset path; set data.path");
  return open_parts(path, resolve(path, format));
}

Split split_of(const std::string& file) {
  std::string name = fs::path(file).filename().string();
  if (ends_with(name, ".bin") || ends_with(name, ".idx")) name = strip_extension(name);
  bool train = false;
  for (const std::string& w : words_of(name)) {
    if (w == "val" || w == "valid" || w == "validation") return Split::Val;
    train |= w == "train";
  }
  return train ? Split::Train : Split::None;
}

DataSplits open_splits(const std::string& path, const std::string& val_path,
                       const std::string& format) {
  check_format(format);
  STRATA_INPUT_CHECK(!path.empty(), "empty dataset path; set data.path");
  DataSplits out;
  std::error_code ec;
  std::vector<std::string> dir_val;
  if (fs::is_directory(path, ec)) {
    DirSplits d = split_directory(path);
    STRATA_INPUT_CHECK(!d.train.empty(), "directory ", path, " holds only validation files (",
                       d.val.front(),
                       ", ...); point data.path at the training data and "
                       "data.val_path at these");
    out.train = open_parts(path + " (train split)", parts_of(d.train, format));
    out.train_files = d.train, out.ignored_files = d.ignored;
    dir_val = std::move(d.val);
  } else {
    out.train = open_dataset(path, format);
    out.train_files = {path};
  }
  if (!val_path.empty()) {
    if (fs::is_directory(val_path, ec)) {
      DirSplits d = split_directory(val_path);
      std::vector<std::string> files = d.val.empty() ? d.train : d.val;
      if (d.val.empty()) files.insert(files.end(), d.ignored.begin(), d.ignored.end());
      std::sort(files.begin(), files.end());
      out.val = open_parts(val_path, parts_of(files, format));
      out.val_files = files;
    } else {
      out.val = open_dataset(val_path, format);
      out.val_files = {val_path};
    }
    out.val_origin = "data.val_path";
  } else if (!dir_val.empty()) {
    out.val = open_parts(path + " (val split)", parts_of(dir_val, format));
    out.val_files = dir_val;
    out.val_origin = "the val files of data.path";
  } else if (const std::string v = beside_val(path); !v.empty() && dataset_exists(v)) {
    out.val = open_dataset(v, format);
    out.val_files = {v};
    out.val_origin = "found beside data.path";
  }
  return out;
}

}  // namespace strata::data
