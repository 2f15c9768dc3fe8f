#include "strata/comm/heartbeat.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"

namespace strata::comm {

namespace {

using clock = std::chrono::steady_clock;

struct Heartbeat {
  std::atomic<int> fd{-1};
  std::atomic<int64_t> step{-1};
  std::atomic<bool> stopping{false};
  std::atomic<bool> reported{false};
  std::mutex write_mu;
  LineOutbox outbox;  // under write_mu
  std::thread thread;
  int rank = 0;
  double timeout_s = 10.0;
};

Heartbeat& state() {
  static Heartbeat h;
  return h;
}

// One whole line, never blocking (a cut link must not stall the caller) and never raising SIGPIPE;
// what the socket cannot take now is sent by the next call or the beat thread.
void send_line(const std::string& line) {
  Heartbeat& h = state();
  const int fd = h.fd.load();
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(h.write_mu);
  h.outbox.add(line);
  h.outbox.flush(fd);
}

// Sends what is still pending; true when nothing is.
bool flush_pending() {
  Heartbeat& h = state();
  const int fd = h.fd.load();
  std::lock_guard<std::mutex> lock(h.write_mu);
  if (fd >= 0) h.outbox.flush(fd);
  return h.outbox.empty();
}

// Nobody can stop this rank any more: end it, and the OpenMPI daemon that started it, which
// would otherwise wait forever for a launcher it cannot reach.
[[noreturn]] void end_self(const char* why) {
  std::fprintf(stderr, "strata: rank %d on %s: %s; ending this rank\n", state().rank,
               host_name().c_str(), why);
  std::fflush(stderr);
  const pid_t parent = ::getppid();
  std::string comm;
  std::ifstream(std::string("/proc/") + std::to_string(parent) + "/comm") >> comm;
  if (comm == "orted") ::kill(parent, SIGKILL);
  ::_exit(3);
}

void on_sigterm(int) {
  const int fd = state().fd.load();
  if (fd >= 0) (void)!::send(fd, "term\n", 5, MSG_DONTWAIT | MSG_NOSIGNAL);
  ::_exit(128 + SIGTERM);
}

void beat_loop() {
  Heartbeat& h = state();
  const auto timeout = std::chrono::duration<double>(h.timeout_s);
  const auto interval =
      std::chrono::milliseconds(std::clamp(int(h.timeout_s * 1000.0 / 8.0), 50, 1000));
  auto heard = clock::now();
  auto next_beat = clock::now();
  char buf[256];
  while (!h.stopping.load()) {
    const auto now = clock::now();
    if (now >= next_beat) {
      send_line("beat " + std::to_string(std::max<int64_t>(h.step.load(), 0)) + "\n");
      next_beat = now + interval;
    }
    const int wait_ms =
        int(std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - clock::now())
                .count()) +
        1;
    // While lines wait in the outbox, wake when the socket can take them.
    const bool pending = !flush_pending();
    pollfd p{h.fd.load(), short(POLLIN | (pending ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, std::max(wait_ms, 1));
    if (h.stopping.load()) return;
    if (ready > 0 && (p.revents & POLLOUT)) flush_pending();
    if (ready > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      const ssize_t n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) end_self("the elastic supervisor stopped the job");
      if (n > 0) heard = clock::now();
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        end_self("the connection to the elastic supervisor failed");
      }
    }
    if (clock::now() - heard > timeout) {
      end_self(
          "no word from the elastic supervisor within STRATA_HEARTBEAT_TIMEOUT_S (its host "
          "or this one lost the network)");
    }
  }
}

int connect_to(const std::string& host, const std::string& port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) == 0) {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          return fd;
        }
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

bool LineOutbox::flush(int fd) {
  while (!pending_.empty()) {
    const ssize_t n = ::send(fd, pending_.data(), pending_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      pending_.erase(0, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

bool LineInbox::next(std::string& line) {
  const size_t nl = buf_.find('\n', begin_);
  if (nl == std::string::npos) {
    buf_.erase(0, begin_);  // keep only the unfinished line
    begin_ = 0;
    return false;
  }
  line.assign(buf_, begin_, nl - begin_);
  begin_ = nl + 1;
  return true;
}

void start_heartbeat(int rank, int world) {
  const char* addr = std::getenv("STRATA_SUPERVISOR");
  if (addr == nullptr || *addr == '\0') return;
  Heartbeat& h = state();
  if (h.fd.load() >= 0) return;
  const std::string a = addr;
  const size_t colon = a.rfind(':');
  STRATA_INPUT_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < a.size(),
                     "STRATA_SUPERVISOR=", a,
                     " is not host:port (strata launch --elastic sets it)");
  h.rank = rank;
  if (const char* t = std::getenv("STRATA_HEARTBEAT_TIMEOUT_S")) h.timeout_s = std::atof(t);
  STRATA_INPUT_CHECK(h.timeout_s > 0, "STRATA_HEARTBEAT_TIMEOUT_S must be a positive number");
  const int fd = connect_to(a.substr(0, colon), a.substr(colon + 1), h.timeout_s);
  if (fd < 0) end_self("cannot reach the elastic supervisor at STRATA_SUPERVISOR");
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  h.fd.store(fd);
  const char* attempt = std::getenv("STRATA_ATTEMPT");
  send_line(strata::detail::concat("hello ", attempt ? attempt : "0", " ", rank, " ", world, " ",
                                   ::getpid(), " ", host_name(), "\n"));
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  ::sigaction(SIGTERM, &sa, nullptr);
  h.thread = std::thread(beat_loop);
}

void heartbeat_step(int64_t step) {
  // Each completed step is sent at once (a few bytes per step): the supervisor counts the steps a
  // failure costs and times a restart to the first step after it.
  if (state().step.exchange(step) != step) send_line("step " + std::to_string(step) + "\n");
}

void heartbeat_fault(const char* phase) {
  send_line(std::string("fault ") + phase + "\n");
}

void heartbeat_fatal(int exit_code, const std::string& message) {
  if (state().reported.exchange(true)) return;
  std::string one_line = message;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  send_line(strata::detail::concat("fatal ", exit_code, " ", one_line, "\n"));
}

void heartbeat_done() {
  Heartbeat& h = state();
  if (h.fd.load() < 0) return;
  h.stopping.store(true);
  if (h.thread.joinable()) h.thread.join();
  send_line("done\n");
  // The last lines must arrive: wait (up to the timeout) until the socket has taken them.
  const auto deadline = clock::now() + std::chrono::duration<double>(h.timeout_s);
  while (!flush_pending() && clock::now() < deadline) {
    pollfd p{h.fd.load(), POLLOUT, 0};
    ::poll(&p, 1, 50);
  }
  std::lock_guard<std::mutex> lock(h.write_mu);
  const int fd = h.fd.exchange(-1);
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

}  // namespace strata::comm
