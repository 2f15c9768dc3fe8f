#include "strata/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "strata/core/check.h"

namespace strata {

namespace {

constexpr size_t kMaxCall = size_t(1) << 30;  // Linux writes at most ~2 GiB per call
constexpr size_t kWriteBuffer = size_t(1) << 20;

// A distinct temporary name per writer, even for two writers of one path in one process.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(next++);
}

}  // namespace

bool io_fault_injected(const char* call) {
  const char* v = std::getenv("STRATA_CKPT_FAIL_IO");
  if (v == nullptr || std::strcmp(v, call) != 0) return false;
  errno = EIO;
  return true;
}

void io_fail(IoError kind, const std::string& what, const std::string& path) {
  const int e = errno;
  std::string hint;
  if (e == ENOSPC || e == EDQUOT) {
    hint = "; free space on the file system of " + parent_dir(path);
  } else if (e == EACCES || e == EPERM || e == EROFS || e == ENOENT || e == ENOTDIR) {
    hint = "; check that the directory " + parent_dir(path) + " exists and is writable";
  }
  const std::string msg = what + " " + path + ": " + std::strerror(e) + hint;
  if (kind == IoError::input) STRATA_INPUT_FAIL(msg);
  STRATA_RUNTIME_FAIL(msg);
}

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

void write_fully(int fd, const void* bytes, size_t n, const std::string& path, IoError kind) {
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t w = io_fault_injected("write") ? -1 : ::write(fd, p, std::min(n, kMaxCall));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;  // a regular file takes no bytes only when it cannot grow
      io_fail(kind, "cannot write", path);
    }
    p += w, n -= size_t(w);
  }
}

void fsync_fd(int fd, const std::string& path, IoError kind) {
  if (io_fault_injected("fsync") || ::fsync(fd) != 0) io_fail(kind, "cannot flush", path);
}

void fsync_dir(const std::string& dir, IoError kind) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(kind, "cannot open", dir);
  const int rc = io_fault_injected("fsync") ? -1 : ::fsync(fd);
  const int e = errno;
  ::close(fd);
  errno = e;
  if (rc != 0) io_fail(kind, "cannot flush", dir);
}

void rename_durably(const std::string& from, const std::string& to, IoError kind) {
  if (io_fault_injected("rename") || std::rename(from.c_str(), to.c_str()) != 0) {
    io_fail(kind, "cannot rename " + from + " to", to);
  }
  fsync_dir(parent_dir(to), kind);
}

AtomicFile::AtomicFile(std::string path, IoError errors)
    : path_(std::move(path)), temp_path_(temp_name(path_)), errors_(errors) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail(errors_, "cannot create", temp_path_);
}

AtomicFile::~AtomicFile() {
  if (!renamed_) discard();
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* bytes, size_t n) {
  STRATA_CHECK(fd_ >= 0, "write after commit to ", path_);
  const char* p = static_cast<const char*>(bytes);
  if (buffer_.size() + n > kWriteBuffer) flush();
  if (n >= kWriteBuffer) {
    write_fully(fd_, p, n, temp_path_, errors_);
  } else {
    buffer_.append(p, n);
  }
  written_ += int64_t(n);
}

void AtomicFile::flush() {
  write_fully(fd_, buffer_.data(), buffer_.size(), temp_path_, errors_);
  buffer_.clear();
}

void AtomicFile::write_at(int64_t offset, const void* bytes, size_t n) {
  STRATA_CHECK(fd_ >= 0 && offset >= 0 && offset + int64_t(n) <= written_,
               "write_at outside the written range of ", path_);
  flush();
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t w = io_fault_injected("write") ? -1 : ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) io_fail(errors_, "cannot write", temp_path_);
    p += w, n -= size_t(w), offset += w;
  }
}

void AtomicFile::commit() {
  STRATA_CHECK(fd_ >= 0, "commit twice of ", path_);
  flush();
  fsync_fd(fd_, temp_path_, errors_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) io_fail(errors_, "cannot close", temp_path_);
  rename_durably(temp_path_, path_, errors_);
  renamed_ = true;
}

void atomic_write(const std::string& path, std::string_view bytes, IoError errors) {
  AtomicFile f(path, errors);
  f.write(bytes);
  f.commit();
}

}  // namespace strata
