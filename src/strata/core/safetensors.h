// The safetensors format: u64 little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}}, then
// the tensor bytes, offsets relative to the end of the header. Used for golden fixtures,
// checkpoints and interop with Hugging Face.
//
// The readers treat every file as hostile: a header longer than the file or than 100 MB, JSON
// nested deeper than 16 levels, repeated keys, unknown dtypes, negative or overflowing shapes,
// offsets outside the data section, sizes that disagree with shape × dtype, overlapping tensors
// and non-string metadata are all an InputError naming the file and the problem. Unknown keys in
// a tensor's entry are ignored (as Hugging Face's reader does), and so are gaps between tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace strata {

// Bytes per element of a safetensors dtype ("F32", "BF16", "I64", "F8_E4M3", ...); 0 if unknown.
size_t safetensors_dtype_bytes(const std::string& dtype);

// One tensor as the header describes it, validated: offset + bytes lie within the file and
// bytes == numel() × safetensors_dtype_bytes(dtype).
struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // of the tensor's first byte from the start of the file (not of the data)
  uint64_t bytes = 0;
  int64_t numel() const;
};

// A safetensors header without the tensor bytes: where each tensor lies, for pread.
struct SafetensorsIndex {
  std::string what;  // the file, named in errors
  uint64_t file_size = 0;
  uint64_t data_start = 0;  // 8 + the header length
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  // Throws InputError naming the file if absent or (when given) of another dtype.
  const SafetensorsEntry& at(const std::string& name, const std::string& dtype = "") const;
};

// Parses and validates the header of a safetensors file held whole in data[0, size); `what`
// names it in errors.
SafetensorsIndex parse_safetensors_header(const char* data, size_t size, const std::string& what);
// The same when data[0, size) is only the start of a file of file_size bytes: at least the length
// prefix and the whole header (a shorter buffer is a caller's bug, not an InputError).
SafetensorsIndex parse_safetensors_header(const char* data, size_t size, uint64_t file_size,
                                          const std::string& what);
// Reads only the length prefix and the header of the file at path, however large the file.
SafetensorsIndex read_safetensors_index(const std::string& path);

struct SafetensorView {
  std::string dtype;  // "F32", "BF16", "F16", "I32", "I64", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  int64_t numel() const;
};

// A whole safetensors file in memory.
class SafetensorsFile {
 public:
  // Reads and validates the whole file; InputError naming the file on any inconsistency.
  explicit SafetensorsFile(const std::string& path);
  bool has(const std::string& name) const { return index_.tensors.count(name) != 0; }
  // Throws InputError if absent or (when given) of another dtype.
  SafetensorView get(const std::string& name, const std::string& dtype = "") const;
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return index_.metadata; }

 private:
  std::vector<char> bytes_;
  SafetensorsIndex index_;
};

class SafetensorsWriter {
 public:
  // Copies the bytes; shape row-major. name must be new and not "__metadata__", dtype known and
  // bytes == numel × its size (else strata::Error: a caller's bug).
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
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace strata
