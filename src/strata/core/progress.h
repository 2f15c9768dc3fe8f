// What a person at a terminal sees of a run while it works: one live line rewritten in place (the
// training step with its ETA; a long piece of other work — a checkpoint written or read, a corpus
// tokenized, a model imported — with its share done, rate and ETA), with the log's own lines
// printed above it. Where stdout is not a terminal (a file, a pipe, a batch job's log) nothing is
// drawn and the log lines are all there is.
//
// Live drawing is a per-process choice made once by the command (set_live_progress), from
// decide_live_progress(): STRATA_PROGRESS=live|lines decides; else a terminal stdout (TERM not
// "dumb") outside an MPI launcher — a rank's stdout is OpenMPI's pseudo-terminal even when
// mpirun's own output goes to a file, so `strata launch` passes its own answer down in
// STRATA_PROGRESS. Only rank 0 draws.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

bool decide_live_progress();
void set_live_progress(bool live);
bool live_progress();

// The training's live line: `text` replaces the line in place (live only).
void status_line(const std::string& text);
// A log line: printed on stdout with a newline (live: above the live line, which is redrawn).
void log_line(const std::string& line);
// Ends the live line (a newline after it), e.g. before the run's last words.
void end_status_line();

// "4m05s", "1h02m", "12s", "3.4s"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

// One long piece of work while it runs (RAII): `what` with its share of `total` done, the rate
// and the ETA, redrawn at most ten times a second on the live line; gone from the line when it
// ends. Nested tasks: the innermost shows. Without live progress an advance costs a lock and
// an add.
class ProgressTask {
 public:
  enum class Unit { Bytes, Items };
  ProgressTask(std::string what, uint64_t total, Unit unit);
  ~ProgressTask();
  ProgressTask(const ProgressTask&) = delete;
  ProgressTask& operator=(const ProgressTask&) = delete;
};
// Adds n to the innermost task of this process (any thread); nothing without one. Callers
// advance in pieces of about a megabyte or an item, not per element.
void progress_advance(uint64_t n);

}  // namespace strata
