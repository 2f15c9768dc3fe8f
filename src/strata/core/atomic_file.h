// Every whole file strata writes goes through here, so that a file under its final name is always
// complete: the bytes go to a temporary file beside it ("<path>.tmp.<pid>.<n>", the same
// directory, hence the same file system), which is written fully, fsynced once, renamed over the
// target, and then the directory is fsynced (a rename is durable only once its directory entry
// is). On a failure up to the rename the temporary file is removed and the target is left as it
// was; only the directory's fsync comes after, and its failure leaves the complete new file.
//
// Checkpoint directories keep their own protocol (ckpt/store.h: files written into a temporary
// step directory, that directory fsynced and renamed, then `latest`); their files and renames use
// the pieces below (write_fully, fsync_fd, fsync_dir, rename_durably).
//
// Not whole files, and so appended to in place: the logs written as a run goes, one complete line
// at a time, which a reader may tail while they grow: metrics.jsonl's rows (monitor/metrics.cc; a
// resumed run first trims the rows past its checkpoint by rewriting the file through here), the
// elastic supervisor's events log elastic.jsonl (elastic/supervisor.cc), and stdout
// and stderr (the launcher relays mpirun's output there as it comes). A crash loses at most the
// line being written.
//
// A test-only seam: STRATA_CKPT_FAIL_IO=write|fsync|rename makes every such call through here
// fail with EIO, as a failing disk would (root ignores permissions, so a test cannot provoke all
// of these otherwise). It is named for the checkpoint tests that use it; ckpt/store.cc adds
// `read` for its reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

// What a failed system call throws. A file the user named as an output (data prepare --output, a
// trace, a run directory) that cannot be written is an InputError (exit 2): the user fixes the
// path. A checkpoint or other file the run writes on its own is a runtime Error (exit 1), which
// the elastic supervisor retries from the previous checkpoint. Either way the message names the
// file and the system's reason, and, for a full disk or a permission, what to check.
enum class IoError { input, runtime };

// Whether the seam above fails `call` ("write", "fsync", "rename", "read"); sets errno to EIO
// when it does.
bool io_fault_injected(const char* call);
// Throws `kind` saying "<what> <path>: <strerror(errno)>" and a hint for ENOSPC, EDQUOT,
// EACCES, EPERM, EROFS, ENOENT and ENOTDIR.
[[noreturn]] void io_fail(IoError kind, const std::string& what, const std::string& path);

// The directory holding `path` ("." for a bare name).
std::string parent_dir(const std::string& path);
// All n bytes to fd, in calls of at most 1 GiB, resuming after a short write or EINTR.
void write_fully(int fd, const void* bytes, size_t n, const std::string& path, IoError kind);
void fsync_fd(int fd, const std::string& path, IoError kind);
void fsync_dir(const std::string& dir, IoError kind);
// Renames `from` over `to` (either files or directories), then fsyncs `to`'s directory.
void rename_durably(const std::string& from, const std::string& to, IoError kind);

// The streaming form: write() appends (small pieces are gathered into 1 MiB writes, large ones go
// straight through), write_at() overwrites bytes already written (a header whose counts are known
// last), commit() fsyncs, renames over `path` and fsyncs the directory. Destroyed without a
// successful commit() (an exception, an interrupted prepare), it removes the temporary file, so
// nothing appears under `path`.
class AtomicFile {
 public:
  AtomicFile(std::string path, IoError errors);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  void write(const void* bytes, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  void write_at(int64_t offset, const void* bytes, size_t n);
  int64_t bytes_written() const { return written_; }
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush();
  void discard();  // closes and removes the temporary file

  std::string path_, temp_path_;
  IoError errors_;
  int fd_ = -1;
  bool renamed_ = false;
  int64_t written_ = 0;
  std::string buffer_;
};

// The one-shot form: `bytes` become the whole content of `path`, atomically.
void atomic_write(const std::string& path, std::string_view bytes, IoError errors);

}  // namespace strata
