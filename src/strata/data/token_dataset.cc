#include "strata/data/token_dataset.h"

#include <glob.h>

#include <algorithm>
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

}  // namespace

std::unique_ptr<TokenDataset> open_dataset(const std::string& path, const std::string& format) {
  STRATA_INPUT_CHECK(format == "auto" || format == "llmc" || format == "megatron",
                     "unknown dataset format \"", format, "\"; use auto, llmc or megatron");
  STRATA_INPUT_CHECK(!path.empty(), "empty dataset path; set data.path");
  auto ds = std::make_unique<MappedTokenDataset>(path);
  for (const Part& part : resolve(path, format)) {
    if (part.megatron) {
      add_megatron_dataset(*ds, part.path);
    } else {
      add_llmc_shard(*ds, part.path);
    }
  }
  ds->finalize();
  return ds;
}

}  // namespace strata::data
