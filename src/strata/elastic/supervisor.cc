// strata launch --elastic: the supervisor. It starts the job with mpirun, hears every rank's
// heartbeat (comm/heartbeat.h) and never waits on mpirun to learn of a failure: a rank whose
// connection ends without a word died; a rank silent for the heartbeat timeout is lost with its
// host's link; a rank that reports a failure (the watchdog, an error) ends the attempt. It then
// stops the job (the ranks it can reach exit when it hangs up; mpirun's process group is
// signalled; ranks it cannot reach end themselves), drops the lost workers, chooses a layout for
// those left (layout.h: the global batch kept) and starts again from the latest complete
// checkpoint, up to --max-restarts times. Events go to stdout and <run_dir>/elastic.jsonl.
#include "strata/elastic/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/ckpt/store.h"
#include "strata/comm/heartbeat.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/elastic/layout.h"
#include "strata/launch/mpirun.h"

namespace strata::elastic {

namespace {

using clock = std::chrono::steady_clock;

double since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The train command's config, overrides and run directory, read from its arguments.
struct TrainCommand {
  std::string config;
  std::vector<std::string> overrides;  // --set values, then --steps/--run-dir/--data as keys
  bool resume = false;
};

TrainCommand parse_train_command(const std::vector<std::string>& cmd) {
  STRATA_INPUT_CHECK(!cmd.empty() && cmd[0] == "train",
                     "strata launch --elastic runs `train`: give `-- train --config C ...`");
  TrainCommand t;
  for (size_t i = 1; i < cmd.size(); ++i) {
    const std::string& a = cmd[i];
    const bool has_value = i + 1 < cmd.size();
    auto value = [&] { return cmd[++i]; };
    if ((a == "--config" || a == "-c") && has_value) {
      t.config = value();
    } else if (a.rfind("--config=", 0) == 0) {
      t.config = a.substr(9);
    } else if (a == "--set" && has_value) {
      t.overrides.push_back(value());
    } else if (a == "--steps" && has_value) {
      t.overrides.push_back("train.steps=" + value());
    } else if (a == "--run-dir" && has_value) {
      t.overrides.push_back("train.run_dir=\"" + value() + "\"");
    } else if (a == "--data" && has_value) {
      t.overrides.push_back("data.path=\"" + value() + "\"");
    } else if (a == "--resume" || a.rfind("--resume=", 0) == 0) {
      t.resume = true;
    } else if (a == "--fault" || a.rfind("--fault=", 0) == 0) {
      STRATA_INPUT_FAIL(
          "--fault after `train` would kill every restart too; give it to "
          "`strata launch --elastic --fault ...`, which passes it to the first "
          "start only");
    }
  }
  STRATA_INPUT_CHECK(!t.config.empty(),
                     "strata launch --elastic: the train command needs --config");
  return t;
}

// The step of the latest complete checkpoint under root; 0 when there is none.
int64_t latest_step(const std::string& root) {
  const std::string dir = ckpt::latest_checkpoint(root);
  if (dir.empty()) return 0;
  const std::string name = std::filesystem::path(dir).filename().string();
  return name.rfind("step_", 0) == 0 ? std::atoll(name.c_str() + 5) : 0;
}

// This host's address on the route to `host` (no packet is sent: a UDP socket is only connected).
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return "";
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

int listen_any(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  STRATA_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  STRATA_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd, 256) == 0,
               "the elastic supervisor cannot listen: ", std::strerror(errno));
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// One rank's connection.
struct Conn {
  int fd = -1;
  int rank = -1;
  comm::LineInbox lines;
  clock::time_point heard;
  int64_t step = 0;
  bool done = false, term = false, closed = false;
  int report_code = -1;
  std::string report;
};

enum class Outcome { Success, Failed, InputError, Interrupted };

// SIGINT or SIGTERM to the supervisor: stop the job (mpirun leads its own process group, which a
// terminal's Ctrl-C does not reach) and exit without restarting.
volatile sig_atomic_t g_interrupted = 0;
void on_interrupt(int signo) {
  g_interrupted = signo;
}

struct Attempt {
  int number = 0;
  ElasticLayout layout;
  int64_t resume_step = 0;
  // Filled by watch():
  Outcome outcome = Outcome::Failed;
  std::string cause;           // what ended it, for the log
  std::set<int> lost;          // ranks whose workers are gone
  std::set<int> silent;        // of those, the ones that fell silent (a host's link)
  int64_t last_step = 0;       // the most steps any rank completed
  double fault_wall = 0;       // when a rank said it was failing on purpose (--fault)
  double detect_wall = 0;      // when the supervisor knew
  double first_step_wall = 0;  // when a rank completed a step past resume_step
  bool exited = false;         // mpirun ended by itself, with exit_code
  int exit_code = 0;
};

class Supervisor {
 public:
  explicit Supervisor(const SupervisorOptions& o) : o_(o) {}
  int run();

 private:
  void watch(Attempt& a, int pid);
  void stop(Attempt& a, int pid, std::map<int, Conn>& conns);
  void read_conn(Attempt& a, Conn& c);
  void fail(Attempt& a, const std::string& cause);
  void event(const nlohmann::json& j);
  int host_of(const Attempt& a, int rank) const;

  SupervisorOptions o_;
  std::vector<ElasticHost> hosts_;
  int listen_fd_ = -1, port_ = 0;
  std::string run_dir_, ckpt_dir_;
  std::ofstream events_;
  double previous_detect_ = 0;  // when the last failure was detected
};

void Supervisor::event(const nlohmann::json& j) {
  nlohmann::json e = j;
  e["t"] = wall_now();
  events_ << e.dump() << "\n";
  events_.flush();
}

int Supervisor::host_of(const Attempt& a, int rank) const {
  int end = 0;
  for (size_t h = 0; h < a.layout.ranks_per_host.size(); ++h) {
    end += a.layout.ranks_per_host[h];
    if (rank < end) return int(h);
  }
  return -1;
}

// The ranks that said `done`, each counted once (a rank reconnecting is one rank).
int ranks_done(const std::map<int, Conn>& conns) {
  std::set<int> done;
  for (const auto& [fd, c] : conns) {
    if (c.done && c.rank >= 0) done.insert(c.rank);
  }
  return int(done.size());
}

void Supervisor::fail(Attempt& a, const std::string& cause) {
  if (a.detect_wall > 0) return;
  a.detect_wall = wall_now();
  a.cause = cause;
  std::printf("elastic: attempt %d failed: %s\n", a.number, cause.c_str());
  std::fflush(stdout);
}

void Supervisor::read_conn(Attempt& a, Conn& c) {
  char buf[4096];
  const ssize_t n = recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    c.closed = true;
    const bool quiet = !c.done && !c.term && c.report_code < 0;
    if (quiet && a.detect_wall == 0 && c.rank >= 0) {
      a.lost.insert(c.rank);
      fail(a, strata::detail::concat("rank ", c.rank,
                                     "'s process ended without a word (killed "
                                     "or crashed) after step ",
                                     c.step));
    }
    return;
  }
  c.heard = clock::now();
  c.lines.feed(buf, size_t(n));
  for (std::string line; c.lines.next(line);) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "hello") {
      int attempt = 0, rank = -1;
      in >> attempt >> rank;
      // A rank of an earlier attempt (a host that came back) has no place in this one.
      if (attempt != a.number) {
        shutdown(c.fd, SHUT_RDWR);
        c.closed = true;
        return;
      }
      c.rank = rank;
    } else if (kind == "beat" || kind == "step") {
      in >> c.step;
      a.last_step = std::max(a.last_step, c.step);
      if (a.first_step_wall == 0 && c.step > a.resume_step) {
        a.first_step_wall = wall_now();
        if (previous_detect_ > 0) {
          const double restart_s = a.first_step_wall - previous_detect_;
          std::printf(
              "elastic: training again at step %lld, %.2f s after the failure was detected\n",
              static_cast<long long>(c.step), restart_s);
          std::fflush(stdout);
          event({{"event", "running"},
                 {"attempt", a.number},
                 {"resume_step", a.resume_step},
                 {"restart_s", restart_s}});
        }
      }
      if (kind == "beat") (void)!send(c.fd, "ok\n", 3, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else if (kind == "fault") {
      a.fault_wall = wall_now();
    } else if (kind == "term") {
      c.term = true;
    } else if (kind == "done") {
      c.done = true;
    } else if (kind == "fatal") {
      in >> c.report_code;
      std::getline(in, c.report);
      if (c.report_code == 2 && a.outcome != Outcome::InputError && a.detect_wall == 0) {
        a.outcome = Outcome::InputError;
      }
      fail(a, strata::detail::concat("rank ", c.rank, " reported:", c.report));
    }
  }
}

void Supervisor::watch(Attempt& a, int pid) {
  std::map<int, Conn> conns;  // by fd
  const double timeout = o_.heartbeat_timeout_s;
  // Start-up (MPI, the data, a checkpoint to load) is not heartbeat-bounded before the hello.
  const double startup_s = std::max(120.0, 6 * timeout);
  const auto started = clock::now();
  bool exited = false;
  int status = 0;
  for (;;) {
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : conns) {
      if (!c.closed) fds.push_back({fd, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        Conn& c = conns[fd];
        c.fd = fd, c.heard = clock::now();
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_conn(a, conns[fds[i].fd]);
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = a.exited = true;
      a.exit_code = launch::exit_code_of(status);
    }
    int hello = 0;
    for (auto& [fd, c] : conns) {
      hello += c.rank >= 0;
      if (c.rank >= 0 && !c.closed && !c.done && a.detect_wall == 0 && since(c.heard) > timeout) {
        a.lost.insert(c.rank), a.silent.insert(c.rank);
        fail(a, strata::detail::concat("rank ", c.rank, " fell silent: no heartbeat for ", timeout,
                                       " s (its host or its link is gone)"));
      }
    }
    if (exited) {
      // Let the last words (a report, `done`, end-of-file) arrive before judging: until every
      // connection has closed (at once when the ranks ended with mpirun), at most 2 s.
      const auto t = clock::now();
      while (since(t) < 2.0) {
        std::vector<pollfd> rest;
        for (const auto& [fd, c] : conns) {
          if (!c.closed) rest.push_back({fd, POLLIN, 0});
        }
        if (rest.empty()) break;
        if (poll(rest.data(), rest.size(), 100) <= 0) continue;
        for (const pollfd& p : rest) {
          if (p.revents != 0) read_conn(a, conns[p.fd]);
        }
      }
      // Counted after the drain: a `done` read during it counts.
      if (a.exit_code == 0 && ranks_done(conns) == a.layout.world) {
        a.outcome = Outcome::Success;
      } else {
        fail(a, strata::detail::concat("mpirun exited with code ", a.exit_code));
      }
      break;
    }
    if (g_interrupted != 0 && a.detect_wall == 0) {
      fail(a, strata::detail::concat("the supervisor got signal ", int(g_interrupted)));
      a.outcome = Outcome::Interrupted;
    }
    if (a.detect_wall > 0) break;
    if (hello < a.layout.world && since(started) > startup_s) {
      std::set<int> seen;
      for (const auto& [fd, c] : conns) seen.insert(c.rank);
      for (int r = 0; r < a.layout.world; ++r) {
        if (!seen.count(r)) a.lost.insert(r), a.silent.insert(r);
      }
      fail(a, strata::detail::concat(a.layout.world - hello, " rank(s) never reported within ",
                                     startup_s, " s of the start"));
      break;
    }
  }
  if (a.outcome == Outcome::Success) {
    for (auto& [fd, c] : conns) close(fd);
    return;
  }
  stop(a, exited ? -1 : pid, conns);
  // Every rank said `done` before its connection closed (some while the job was being stopped):
  // the training finished, whatever ended the processes after.
  if (a.outcome != Outcome::Interrupted && ranks_done(conns) == a.layout.world) {
    std::printf("elastic: every rank of attempt %d finished; it counts as done\n", a.number);
    std::fflush(stdout);
    a.outcome = Outcome::Success;
  }
}

// Hangs up on every rank (those that can hear it exit), signals mpirun's process group, and waits
// a little for the connections to close: a rank whose connection stays open could not hear, so
// its worker counts as lost; it ends itself when its heartbeat timeout passes.
void Supervisor::stop(Attempt& a, int pid, std::map<int, Conn>& conns) {
  const auto t0 = clock::now();
  for (auto& [fd, c] : conns) {
    if (!c.closed) shutdown(fd, SHUT_WR);
  }
  if (pid > 0) kill(-pid, SIGTERM);
  const double window = std::min(o_.heartbeat_timeout_s, 5.0);
  bool reaped = pid < 0;
  while (since(t0) < window) {
    // A rank still talking will hear the hang-up and close; one silent for half the timeout
    // cannot hear it (they all beat several times per timeout), so nothing is waited for.
    std::vector<pollfd> open;
    bool talking = false;
    for (const auto& [fd, c] : conns) {
      if (c.closed) continue;
      open.push_back({fd, POLLIN, 0});
      talking = talking || since(c.heard) < o_.heartbeat_timeout_s / 2;
    }
    if (!reaped) {
      int status = 0;
      reaped = waitpid(pid, &status, WNOHANG) == pid;
    }
    if (!talking && reaped) break;
    poll(open.data(), open.size(), 100);
    // What arrives meanwhile is read as any other line (a `done` or a report counts).
    for (const pollfd& p : open) {
      if (p.revents != 0) read_conn(a, conns[p.fd]);
    }
  }
  if (!reaped) {
    kill(-pid, SIGKILL);
    int status = 0;
    const auto t1 = clock::now();
    while (waitpid(pid, &status, WNOHANG) != pid && since(t1) < 2.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::vector<int> unreachable;
  for (auto& [fd, c] : conns) {
    if (!c.closed && c.rank >= 0) {
      unreachable.push_back(c.rank);
      a.lost.insert(c.rank), a.silent.insert(c.rank);
    }
    close(fd);
  }
  std::printf("elastic: stopped attempt %d in %.2f s", a.number, since(t0));
  if (!unreachable.empty()) {
    std::printf("; %zu rank(s) could not be reached and end themselves", unreachable.size());
  }
  std::printf("\n");
  std::fflush(stdout);
}

int Supervisor::run() {
  const TrainCommand train = parse_train_command(o_.command);
  const ConfigLoader load = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> all = train.overrides;
    all.insert(all.end(), extra.begin(), extra.end());
    return load_config(train.config, all);
  };
  const Config cfg = load({});
  ckpt_dir_ = cfg.checkpoint.dir;
  STRATA_INPUT_CHECK(!ckpt_dir_.empty(),
                     "strata launch --elastic restarts from the latest checkpoint: set "
                     "checkpoint.dir (and checkpoint.interval, the steps a failure can cost)");
  if (cfg.checkpoint.interval <= 0) {
    std::printf(
        "elastic: note: checkpoint.interval is 0, so a failure restarts from the last "
        "start's checkpoint (or step 0); set it to bound the steps a failure costs\n");
  }
  run_dir_ = cfg.train.run_dir;
  if (!o_.hostfile.empty()) {
    for (const auto& [name, slots] : comm::parse_hostfile(o_.hostfile)) {
      hosts_.push_back({name, slots});
    }
  } else {
    const int n = o_.n > 0 ? o_.n : o_.max_ranks;
    STRATA_INPUT_CHECK(n > 0, "strata launch --elastic on one host needs -n or --max-ranks");
    hosts_.push_back({"localhost", n});
  }
  int slots = 0;
  for (const ElasticHost& h : hosts_) slots += h.slots;
  const int max_ranks = o_.max_ranks > 0 ? o_.max_ranks : (o_.n > 0 ? o_.n : slots);
  const int first_max = o_.n > 0 ? std::min(o_.n, max_ranks) : max_ranks;
  std::string addr = o_.supervisor_addr;
  if (addr.empty())
    addr = o_.hostfile.empty() ? "127.0.0.1" : local_address_towards(hosts_[0].name);
  STRATA_INPUT_CHECK(!addr.empty(), "cannot tell which address the ranks on ", hosts_[0].name,
                     " reach this host at; give --supervisor-addr");
  listen_fd_ = listen_any(&port_);
  std::filesystem::create_directories(run_dir_);
  events_.open(std::filesystem::path(run_dir_) / "elastic.jsonl", std::ios::app);
  setenv("STRATA_SUPERVISOR", (addr + ":" + std::to_string(port_)).c_str(), 1);
  setenv("STRATA_HEARTBEAT_TIMEOUT_S", std::to_string(o_.heartbeat_timeout_s).c_str(), 1);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  int64_t batch = 0;
  for (int number = 1;; ++number) {
    Attempt a;
    a.number = number;
    try {
      a.layout = choose_elastic_layout(load, hosts_, o_.min_ranks,
                                       number == 1 ? first_max : max_ranks, batch);
    } catch (const InputError& e) {
      std::printf("elastic: giving up: %s\n", e.what());
      event({{"event", "gave_up"}, {"reason", e.what()}});
      return number == 1 ? 2 : 1;
    }
    if (number == 1) batch = a.layout.batch;
    a.resume_step = latest_step(ckpt_dir_);
    std::vector<std::string> command = o_.command;
    for (const std::string& s : a.layout.overrides) command.insert(command.end(), {"--set", s});
    if (!train.resume) command.insert(command.end(), {"--resume", "auto"});
    if (number == 1 && !o_.fault.empty()) command.insert(command.end(), {"--fault", o_.fault});
    std::string hostfile;
    if (!o_.hostfile.empty()) {
      hostfile =
          (std::filesystem::path(run_dir_) / ("elastic_hosts." + std::to_string(number))).string();
      std::string lines;
      for (size_t h = 0; h < hosts_.size(); ++h) {
        if (a.layout.ranks_per_host[h] > 0) {
          lines += hosts_[h].name + " slots=" + std::to_string(a.layout.ranks_per_host[h]) + "\n";
        }
      }
      atomic_write(hostfile, lines, IoError::runtime);
    }
    setenv("STRATA_ATTEMPT", std::to_string(number).c_str(), 1);
    std::printf("elastic: attempt %d: %s; from %s\n", number, a.layout.describe().c_str(),
                a.resume_step > 0
                    ? ("the checkpoint of step " + std::to_string(a.resume_step)).c_str()
                    : "step 0");
    std::fflush(stdout);
    event({{"event", "start"},
           {"attempt", number},
           {"world", a.layout.world},
           {"layout", a.layout.describe()},
           {"resume_step", a.resume_step}});
    const int threads = launch::threads_per_rank(a.layout.world, o_.threads, o_.hostfile.empty());
    const int pid =
        launch::spawn(launch::mpirun_command(a.layout.world, hostfile, threads, command), true);
    watch(a, pid);
    if (a.outcome == Outcome::Success) {
      std::printf("elastic: done after %d restart(s)\n", number - 1);
      event({{"event", "done"}, {"attempt", number}, {"restarts", number - 1}});
      return 0;
    }
    nlohmann::json failure = {{"event", "failure"},       {"attempt", number},
                              {"cause", a.cause},         {"lost_ranks", a.lost},
                              {"last_step", a.last_step}, {"detect_t", a.detect_wall}};
    if (a.exited) failure["mpirun_exit_code"] = a.exit_code;
    if (a.fault_wall > 0) failure["detect_s"] = a.detect_wall - a.fault_wall;
    event(failure);
    if (a.outcome == Outcome::Interrupted) {
      std::printf("elastic: stopped on a signal; the latest checkpoint is in %s\n",
                  ckpt_dir_.c_str());
      event({{"event", "interrupted"}});
      return 128 + int(g_interrupted);
    }
    if (a.outcome == Outcome::InputError) {
      std::printf("elastic: giving up: the job failed on its input, which a restart cannot fix\n");
      event({{"event", "gave_up"}, {"reason", a.cause}});
      return 2;
    }
    if (number > o_.max_restarts) {
      std::printf("elastic: giving up after %d restart(s) (--max-restarts)\n", number - 1);
      event({{"event", "gave_up"}, {"reason", "max restarts"}});
      return a.exit_code != 0 ? a.exit_code : 1;
    }
    // The lost workers leave; a host whose every rank fell silent leaves whole.
    std::map<int, int> lost_per_host, silent_per_host;
    for (int r : a.lost) ++lost_per_host[host_of(a, r)];
    for (int r : a.silent) ++silent_per_host[host_of(a, r)];
    for (const auto& [h, n] : lost_per_host) {
      if (h < 0) continue;
      ElasticHost& host = hosts_[size_t(h)];
      const bool whole = silent_per_host[h] == a.layout.ranks_per_host[size_t(h)];
      host.slots = whole ? 0 : std::max(0, host.slots - n);
      std::printf(
          "elastic: %s: %s\n", host.name.c_str(),
          whole ? "unreachable, dropped"
                : strata::detail::concat(n, " worker(s) lost, ", host.slots, " left").c_str());
    }
    previous_detect_ = a.detect_wall;
  }
}

}  // namespace

int run_supervisor(const SupervisorOptions& o) {
  return Supervisor(o).run();
}

}  // namespace strata::elastic
