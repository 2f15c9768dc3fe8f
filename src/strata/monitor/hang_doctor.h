// The hang doctor (`strata doctor RUN_DIR`): from the flight records the ranks of a hung job
// wrote (comm/flight_recorder.h: each rank's last operations, per-group counts, its step and
// activity), which rank(s) the others wait for, and what those were doing.
//
// A rank waits in the oldest operation it has not completed (the one its watchdog gave up on,
// where it says). For a collective numbered n on a group, a member that issued fewer than n
// collectives on that group never reached it; for the n-th receive from a peer, a peer that sent
// fewer than n messages to this rank never sent it. Groups are matched across ranks by name,
// members and the order they were made in. A rank blamed by a waiting one is followed: one that
// itself waits passes the blame on; one that waits for nothing (stuck in compute, user code or an
// injected hang) or left no record (dead, or killed before it could write) is a root. Ranks that
// wait for each other in a cycle are a deadlock: their schedules disagree.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::monitor {

// The records in `dir` (rank<R>.json), by rank. InputError for a missing directory, no records,
// or a file that is not a flight record (named, with the reason).
std::vector<nlohmann::json> read_flight_records(const std::string& dir);

struct Diagnosis {
  std::vector<std::string> lines;  // the report, for people
  std::vector<int> roots;          // the ranks the others wait for (ascending)
  bool deadlock = false;           // the waits form a cycle: no rank is the root
};

Diagnosis diagnose(const std::vector<nlohmann::json>& records);

}  // namespace strata::monitor
