#include "strata/data/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "strata/core/check.h"

namespace strata::data {

namespace {

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

constexpr size_t kWriteBuffer = size_t(1) << 20;

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_INPUT_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno),
                     "; check the path and its permissions");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    STRATA_INPUT_FAIL("cannot stat ", path, ": ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    STRATA_INPUT_FAIL(path, " is not a regular file; give a data file, a directory of shards, ",
                      "a glob pattern or a Megatron prefix");
  }
  size_ = int64_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    STRATA_INPUT_CHECK(p != MAP_FAILED, "cannot mmap ", path, " (", size_,
                       " bytes): ", std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_t(size_));
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_t(size_));
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_INPUT_CHECK(fd_ >= 0, "cannot create ", temp_path_, ": ", std::strerror(errno),
                     "; check that the output directory ", parent_dir(path_),
                     " exists and is writable");
  buffer_.reserve(kWriteBuffer);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* bytes, size_t n) {
  STRATA_CHECK(fd_ >= 0, "write after commit to ", path_);
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (buffer_.size() + n > kWriteBuffer) flush();
  if (n >= kWriteBuffer) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      STRATA_INPUT_CHECK(w > 0, "cannot write ", temp_path_, ": ", std::strerror(errno),
                         "; check free space in ", parent_dir(path_));
      p += w, n -= size_t(w), written_ += w;
    }
    return;
  }
  buffer_.insert(buffer_.end(), p, p + n);
  written_ += int64_t(n);
}

void AtomicFileWriter::flush() {
  const uint8_t* p = buffer_.data();
  size_t n = buffer_.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    STRATA_INPUT_CHECK(w > 0, "cannot write ", temp_path_, ": ", std::strerror(errno),
                       "; check free space in ", parent_dir(path_));
    p += w, n -= size_t(w);
  }
  buffer_.clear();
}

void AtomicFileWriter::write_at(int64_t offset, const void* bytes, size_t n) {
  STRATA_CHECK(fd_ >= 0 && offset >= 0 && offset + int64_t(n) <= written_,
               "write_at outside the written range of ", path_);
  flush();
  ssize_t w = ::pwrite(fd_, bytes, n, off_t(offset));
  STRATA_INPUT_CHECK(w == ssize_t(n), "cannot write ", temp_path_, ": ", std::strerror(errno));
}

void AtomicFileWriter::commit() {
  STRATA_CHECK(fd_ >= 0, "commit twice of ", path_);
  flush();
  STRATA_INPUT_CHECK(::fsync(fd_) == 0, "cannot fsync ", temp_path_, ": ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(temp_path_.c_str());
    STRATA_INPUT_FAIL("cannot rename ", temp_path_, " to ", path_, ": ", std::strerror(err));
  }
  // The rename itself is durable only once the directory entry is synced.
  int dfd = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace strata::data
