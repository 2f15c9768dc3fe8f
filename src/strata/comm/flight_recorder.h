// Flight recorder: each rank's ring of its last collectives and point-to-point messages, with
// the step and the activity (schedule action or engine phase) it was in when it issued them,
// written to `<dir>/rank<R>.json` when the job hangs. `strata doctor` reads every rank's file and
// names the rank(s) the others wait for (monitor/hang_doctor.h).
//
// Every Communicator and PeerExchange registers its group (a name and its members as world
// ranks) and records each operation when it is issued, starts and completes. A collective is
// numbered within its group (the n-th collective issued on that communicator: the same on every
// member, since every member issues the same collectives in the same order); a point-to-point
// message by peer and direction (the n-th message sent to, or received from, that peer on the
// group). The ring keeps the last kEntries operations; the per-group counts of issued operations
// are kept whole, so they still say how far each rank got after the ring has wrapped (a
// completion whose entry the ring has already dropped is not counted as completed).
//
// Recording is always on (a mutex and a few stores per operation). The file is written, once
// `enable` has named a directory: by abort_job (comm/mpi_runtime.h) before it ends the job, after
// a watchdog has marked the operation it gave up on (CommStream, PeerExchange); and by the
// recorder's own thread when the rank has been still (no operation issued or completed, no new
// activity) for half the watch timeout. The second keeps the record of a rank stuck outside
// communication (a hung kernel, a stop in user code), and of a waiting rank that a peer's
// MPI_Abort kills before its own watchdog fires: the still rank passes half the timeout before
// any watchdog passes the whole.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::comm::flight {

constexpr size_t kEntries = 512;

// Dumps go to dir (made when first written), as rank<R>.json. `watch`: the watchdog timeout (0:
// no still-rank snapshots). `identity`: this rank's place, e.g. "dp 1 tp 0 pp 1 on host-a".
void enable(const std::string& dir, std::chrono::seconds watch, std::string identity);
// Stops the snapshot thread and dumping (the run is over).
void disable();

// What this rank is doing now: the step being trained (1-based; 0 before the first) and a short
// label ("forward mb 3 chunk 0", "reduce", "optimizer"); kept to 63 bytes.
void set_activity(int64_t step, std::string_view what);

// A group of ranks: name ("dp", "tp", "pp", "pp-p2p", ...) and comm's members. Local (no
// communication). Returns its id for `issue`.
int register_group(const std::string& name, MPI_Comm comm);

enum class Kind : uint8_t { Collective, Send, Recv };

// Records an operation `op` ("all_reduce", "send", ...) issued on group `group`; peer is the
// group rank of a send's destination or a receive's source (ignored for collectives). Returns
// its id for start() and complete().
uint64_t issue(int group, Kind kind, const char* op, int peer, int tag, uint64_t bytes);
void start(uint64_t id);
void complete(uint64_t id, bool failed = false);
// The operation a watchdog gave up on: the dump names it.
void mark_stuck(uint64_t id);

// Writes this rank's record, `reason` first, if enabled; never throws (it runs on the way to
// abort_job). Returns whether a file was written.
bool dump(const std::string& reason);

// The record as JSON text (what dump writes): for tests.
std::string to_json(const std::string& reason);

}  // namespace strata::comm::flight
