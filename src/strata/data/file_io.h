// Files the data layer reads and writes: a read-only memory map, and a writer that only ever
// leaves a complete file under its final name (temp file, fsync, rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// Writes `path` atomically: bytes go to "<path>.tmp.<pid>", and commit() flushes, fsyncs and
// renames it over `path`. Destroyed without commit() (an exception, an interrupted prepare), it
// removes the temp file, so a half-written file never carries the final name. Throws InputError
// naming the directory when it cannot be created or written.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* bytes, size_t n);
  // Overwrites bytes already written at `offset` (e.g. a header whose counts are known last).
  void write_at(int64_t offset, const void* bytes, size_t n);
  int64_t bytes_written() const { return written_; }
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush();

  std::string path_, temp_path_;
  int fd_ = -1;
  int64_t written_ = 0;
  std::vector<uint8_t> buffer_;
};

}  // namespace strata::data
