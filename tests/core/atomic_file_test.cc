// The atomic writer: a file appears under its name complete or not at all. A failed write, fsync
// or rename (injected through STRATA_CKPT_FAIL_IO, as a failing disk would fail them) or an
// unwritable directory leaves the old content and no temporary file; a streaming writer destroyed
// without commit leaves nothing; short writes and EINTR are resumed.
#include "strata/core/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/check.h"
#include "tests/temp_dir_test.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Bytes that differ at every offset within a period of 251, so a lost or repeated block shows.
std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(i % 251);
  return s;
}

struct FailIo {
  explicit FailIo(const char* call) { ::setenv("STRATA_CKPT_FAIL_IO", call, 1); }
  ~FailIo() { ::unsetenv("STRATA_CKPT_FAIL_IO"); }
};

class AtomicFileTest : public test::TempDirTest {
 protected:
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  }
};

TEST_F(AtomicFileTest, WritesAndReplacesAFile) {
  const std::string target = path("out.json");
  atomic_write(target, "first\n", IoError::runtime);
  EXPECT_EQ(read_file(target), "first\n");
  atomic_write(target, "", IoError::runtime);
  EXPECT_EQ(read_file(target), "");
  atomic_write(target, "second", IoError::runtime);
  EXPECT_EQ(read_file(target), "second");
  EXPECT_EQ(entries(), std::vector<std::string>{"out.json"});
}

TEST_F(AtomicFileTest, StreamingKeepsTheOldFileUntilCommit) {
  const std::string target = path("out.bin");
  atomic_write(target, "old", IoError::runtime);
  // Small pieces (gathered), one larger than the buffer (written through) and a header
  // overwritten last: the file is exactly the bytes in order.
  const std::string big = pattern((size_t(3) << 20) + 17);
  std::string expected = "head";
  for (int i = 0; i < 1000; ++i) expected += std::to_string(i);
  expected += big + "tail";
  {
    AtomicFile f(target, IoError::runtime);
    EXPECT_EQ(fs::path(f.temp_path()).parent_path(), dir_);
    EXPECT_NE(f.temp_path().find(std::to_string(::getpid())), std::string::npos) << f.temp_path();
    f.write("HEAD", 4);
    for (int i = 0; i < 1000; ++i) f.write(std::to_string(i));
    f.write(big);
    f.write("tail");
    EXPECT_EQ(read_file(target), "old");
    EXPECT_TRUE(fs::exists(f.temp_path()));
    f.write_at(0, "head", 4);
    EXPECT_EQ(f.bytes_written(), int64_t(expected.size()));
    f.commit();
    EXPECT_FALSE(fs::exists(f.temp_path()));
  }
  EXPECT_EQ(read_file(target), expected);
  EXPECT_EQ(entries(), std::vector<std::string>{"out.bin"});
}

TEST_F(AtomicFileTest, WithoutCommitNothingIsLeft) {
  {
    AtomicFile f(path("new.bin"), IoError::runtime);
    f.write(pattern(size_t(2) << 20));
  }
  EXPECT_TRUE(entries().empty());

  atomic_write(path("kept.bin"), "old", IoError::runtime);
  {
    AtomicFile f(path("kept.bin"), IoError::runtime);
    f.write("new", 3);
  }
  EXPECT_EQ(read_file(path("kept.bin")), "old");
  EXPECT_EQ(entries(), std::vector<std::string>{"kept.bin"});
}

// Each failing call, in both forms and both error kinds: the error names the file and the
// system's reason, the old content stays, and no temporary file is left.
TEST_F(AtomicFileTest, AFailedWriteFsyncOrRenameKeepsTheOldContent) {
  const std::string target = path("state.json");
  atomic_write(target, "old", IoError::runtime);
  for (const char* call : {"write", "fsync", "rename"}) {
    for (IoError kind : {IoError::runtime, IoError::input}) {
      FailIo fail(call);
      std::string one_shot, streaming;
      bool input_error = false;
      try {
        atomic_write(target, "new", kind);
      } catch (const InputError& e) {
        one_shot = e.what(), input_error = true;
      } catch (const Error& e) {
        one_shot = e.what();
      }
      EXPECT_EQ(input_error, kind == IoError::input) << call << ": " << one_shot;
      try {
        AtomicFile f(target, kind);
        f.write(pattern(size_t(2) << 20));
        f.commit();
      } catch (const Error& e) {
        streaming = e.what();
      }
      for (const std::string& e : {one_shot, streaming}) {
        EXPECT_NE(e.find(target), std::string::npos) << call << ": " << e;
        EXPECT_NE(e.find("Input/output error"), std::string::npos) << call << ": " << e;
      }
      EXPECT_EQ(read_file(target), "old") << call;
      EXPECT_EQ(entries(), std::vector<std::string>{"state.json"}) << call;
    }
  }
}

TEST_F(AtomicFileTest, AnUnwritableDirectoryIsAnErrorNamingIt) {
  const std::string missing = path("no/such/dir");
  try {
    atomic_write(missing + "/out.json", "x", IoError::input);
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot create " + missing + "/out.json"), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
    EXPECT_NE(m.find(missing + " exists and is writable"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(path("no")));
}

TEST_F(AtomicFileTest, AReadOnlyDirectoryKeepsTheOldContent) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  fs::create_directory(path("ro"));
  atomic_write(path("ro/kept"), "old", IoError::runtime);
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(atomic_write(path("ro/kept"), "new", IoError::runtime), Error);
  fs::permissions(path("ro"), fs::perms::owner_all);
  EXPECT_EQ(read_file(path("ro/kept")), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(path("ro")), fs::directory_iterator()), 1);
}

TEST_F(AtomicFileTest, AFullDiskSaysSo) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  try {
    write_fully(fd, "abc", 3, "/dev/full", IoError::runtime);
    FAIL() << "no error";
  } catch (const InputError&) {
    FAIL() << "a full disk is a runtime error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("free space"), std::string::npos) << e.what();
  }
  ::close(fd);
}

std::atomic<int> g_signals{0};
void count_signal(int) {
  g_signals.fetch_add(1, std::memory_order_relaxed);
}

// A pipe read slowly while a timer interrupts the writer every 100 us (no SA_RESTART): writes
// return short counts or fail with EINTR, and write_fully still delivers every byte in order.
TEST(AtomicFileWriteFully, ResumesShortWritesAndEintr) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  struct sigaction sa = {}, old = {};
  sa.sa_handler = count_signal;
  ::sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGALRM, &sa, &old), 0);
  // The reader blocks SIGALRM, so every signal interrupts the writer.
  sigset_t alrm;
  ::sigemptyset(&alrm);
  ::sigaddset(&alrm, SIGALRM);
  ::pthread_sigmask(SIG_BLOCK, &alrm, nullptr);
  std::string got;
  std::thread reader([&] {
    char b[4096];
    for (;;) {
      const ssize_t r = ::read(fds[0], b, sizeof b);
      if (r <= 0) break;
      got.append(b, size_t(r));
      if (got.size() % 65536 < 4096) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  ::pthread_sigmask(SIG_UNBLOCK, &alrm, nullptr);
  const itimerval every = {{0, 100}, {0, 100}}, off = {};
  ::setitimer(ITIMER_REAL, &every, nullptr);
  const std::string bytes = pattern(size_t(16) << 20);
  std::string error;
  try {
    write_fully(fds[1], bytes.data(), bytes.size(), "the pipe", IoError::runtime);
  } catch (const Error& e) {
    error = e.what();
  }
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  ::sigaction(SIGALRM, &old, nullptr);
  EXPECT_EQ(error, "");
  EXPECT_GT(g_signals.load(), 0);
  EXPECT_TRUE(got == bytes) << got.size() << " of " << bytes.size() << " bytes";
}

}  // namespace
}  // namespace strata
