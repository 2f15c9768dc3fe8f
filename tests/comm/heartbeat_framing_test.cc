// The heartbeat's framing (comm/heartbeat.h): lines leave whole and in order even when the socket
// cannot take them now, and a line split over several reads arrives whole.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "strata/comm/heartbeat.h"

namespace strata::comm {
namespace {

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0);
    const int small = 4096;  // the kernel's minimum; a few hundred lines fill it
    ::setsockopt(fd[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    ::setsockopt(fd[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  }
  ~SocketPair() {
    for (int f : fd) ::close(f);
  }
};

std::vector<std::string> read_all_lines(int fd, LineInbox& in, size_t want) {
  std::vector<std::string> out;
  char buf[97];  // an odd size: lines straddle reads
  while (out.size() < want) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    in.feed(buf, size_t(n));
    for (std::string line; in.next(line);) out.push_back(line);
  }
  return out;
}

TEST(HeartbeatFraming, AFullSocketKeepsTheLinesForLaterInsteadOfDroppingThem) {
  SocketPair s;
  LineOutbox out;
  const int lines = 5000;  // far more than the socket buffers hold
  for (int i = 0; i < lines; ++i) {
    out.add("beat " + std::to_string(i) + "\n");
    EXPECT_TRUE(out.flush(s.fd[0]));  // never blocks, never fails on a full buffer
  }
  EXPECT_FALSE(out.empty()) << "the test should have filled the socket";
  LineInbox in;
  std::vector<std::string> got;
  for (int round = 0; round < 10000 && got.size() < size_t(lines); ++round) {
    for (const std::string& l : read_all_lines(s.fd[1], in, size_t(lines))) got.push_back(l);
    out.flush(s.fd[0]);
  }
  ASSERT_EQ(got.size(), size_t(lines));
  for (int i = 0; i < lines; ++i) EXPECT_EQ(got[size_t(i)], "beat " + std::to_string(i));
  EXPECT_TRUE(out.empty());
}

TEST(HeartbeatFraming, ALineSplitOverReadsArrivesWhole) {
  LineInbox in;
  std::string line;
  in.feed("be", 2);
  EXPECT_FALSE(in.next(line));
  in.feed("at 12\nste", 9);
  ASSERT_TRUE(in.next(line));
  EXPECT_EQ(line, "beat 12");
  EXPECT_FALSE(in.next(line));
  in.feed("p 13\ndone\n", 10);
  ASSERT_TRUE(in.next(line));
  EXPECT_EQ(line, "step 13");
  ASSERT_TRUE(in.next(line));
  EXPECT_EQ(line, "done");
  EXPECT_FALSE(in.next(line));
}

TEST(HeartbeatFraming, ABrokenConnectionIsReported) {
  SocketPair s;
  ::close(s.fd[1]);
  s.fd[1] = -1;
  LineOutbox out;
  out.add("beat 1\n");
  EXPECT_FALSE(out.flush(s.fd[0]));
}

}  // namespace
}  // namespace strata::comm
