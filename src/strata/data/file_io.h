// Files the data layer reads and writes: a read-only memory map, and a writer that only ever
// leaves a complete file under its final name (core/atomic_file.h: temp file, fsync, rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "strata/core/atomic_file.h"

namespace strata::data {

// A whole file mapped read-only. Move-only; unmaps on destruction. An empty file maps to
// data() == nullptr, size() == 0. Throws InputError naming the path if it cannot be opened.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// The data layer's writer (core/atomic_file.h): its files are outputs the user named (data
// prepare --output), so one that cannot be written is an InputError naming the directory to fix.
class AtomicFileWriter : public AtomicFile {
 public:
  explicit AtomicFileWriter(std::string path) : AtomicFile(std::move(path), IoError::input) {}
};

}  // namespace strata::data
