// A rank's line to the elastic supervisor (`strata launch --elastic`). The supervisor sets
// STRATA_SUPERVISOR=host:port (and STRATA_HEARTBEAT_TIMEOUT_S) in every rank's environment; each
// rank then keeps one TCP connection to it, from a thread of its own, so liveness does not depend
// on the training loop making progress (a hang is the watchdog's to report).
//
// Lines, rank -> supervisor:  hello ATTEMPT RANK WORLD PID HOST | beat STEP | step STEP
//                             | fault PHASE
//                             | fatal CODE MESSAGE | term | done
// supervisor -> rank:         ok (one per beat)
//
// The two ends watch each other. A rank whose process dies closes the connection at once: the
// supervisor sees end-of-file with no report before it, the sign of a lost worker. A rank that
// hears nothing for the timeout (its host's link is cut, or the supervisor is gone) ends itself
// and its host's OpenMPI daemon, since nobody can reach it to do so. When the supervisor stops a
// job it shuts its side down; every rank that can still hear it exits at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::comm {

// The framing, both ends. Lines leave whole and in order: what a non-blocking send cannot take
// now (a full socket buffer, a partial send) waits in the outbox for the next flush, instead of
// being dropped or cut in half (half a line would merge with the next one into garbage).
class LineOutbox {
 public:
  void add(const std::string& line) { pending_ += line; }
  // Sends what the socket takes without blocking; false when the connection is broken.
  bool flush(int fd);
  bool empty() const { return pending_.empty(); }

 private:
  std::string pending_;
};

// Received bytes in, whole lines out: a line split over several recv calls waits for its end.
class LineInbox {
 public:
  void feed(const char* data, size_t n) { buf_.append(data, n); }
  // The next whole line, without its newline; false when none is complete yet.
  bool next(std::string& line);

 private:
  std::string buf_;
  size_t begin_ = 0;
};

// Connects to the supervisor named by STRATA_SUPERVISOR and starts the heartbeat thread; a no-op
// when the variable is unset. Installs a SIGTERM handler that reports `term` (a launcher stopping
// this rank, not a lost worker) before exiting. Throws InputError on a malformed address.
void start_heartbeat(int rank, int world);
// The step training starts from (0, or a checkpoint's), then each completed one: sent at once as
// `step N`, and with each beat.
void heartbeat_step(int64_t step);
// Tells the supervisor this process is about to fail on purpose (`--fault ... phase=P`), so that it
// can time its detection; the failure itself must still be detected on its own.
void heartbeat_fault(const char* phase);
// Reports a failure this process is about to exit with (exit code 2 is an input error, which
// the supervisor does not retry). Safe to call more than once; the first report counts.
void heartbeat_fatal(int exit_code, const std::string& message);
// The command finished; the connection closes after this.
void heartbeat_done();

}  // namespace strata::comm
