// The safetensors format: u64 little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}}, then
// the tensor bytes. Used for golden fixtures now and for checkpoints and interop later.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata {

struct SafetensorView {
  std::string dtype;  // "F32", "BF16", "F16", "I32", "I64", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Reads and validates the whole file; InputError naming the file on any inconsistency.
  explicit SafetensorsFile(const std::string& path);
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws InputError if absent or (when given) of another dtype.
  SafetensorView get(const std::string& name, const std::string& dtype = "") const;
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::vector<char> bytes_;
  size_t data_start_ = 0;
  std::map<std::string, SafetensorView> index_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Copies the bytes; shape row-major.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* data, size_t bytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes to path + ".tmp", flushes, then renames: a reader never sees a half-written file.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<char> data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace strata
