#include "strata/train/trace.h"

#include <algorithm>

#include "strata/core/atomic_file.h"
#include "strata/pipeline/schedule.h"

namespace strata {

StepTrace::StepTrace(MPI_Comm world, bool rank0, const comm::GridCoord& at)
    : world_(world), rank0_(rank0), at_(at) {}

void StepTrace::gather(const std::vector<pipeline::ActionSpan>& spans) {
  std::vector<Event> mine;
  for (const pipeline::ActionSpan& s : spans) {
    mine.push_back({s.start_s, s.end_s, int32_t(s.action.op), s.action.micro, s.action.chunk,
                    s.action.peer, at_.pp, at_.tp, at_.dp, at_.cp});
  }
  const int bytes = int(mine.size() * sizeof(Event));
  int ranks = 1;
  std::vector<Event> all = mine;
  std::vector<int> counts(1, bytes), displs(1, 0);
  if (world_ != MPI_COMM_NULL) {
    MPI_Comm_size(world_, &ranks);
    counts.assign(size_t(ranks), 0);
    MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world_);
    displs.assign(size_t(ranks), 0);
    for (int r = 1; r < ranks; ++r) {
      displs[size_t(r)] = displs[size_t(r - 1)] + counts[size_t(r - 1)];
    }
    all.assign(rank0_ ? size_t(displs.back() + counts.back()) / sizeof(Event) : 0, Event{});
    MPI_Gatherv(mine.data(), bytes, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, 0,
                world_);
  }
  if (!rank0_) return;
  double t0 = 1e300;
  for (const Event& e : all) t0 = std::min(t0, e.start_s);
  double end_us = offset_us_;
  for (int r = 0; r < ranks; ++r) {
    const size_t first = size_t(displs[size_t(r)]) / sizeof(Event);
    const size_t last = first + size_t(counts[size_t(r)]) / sizeof(Event);
    for (size_t i = first; i < last; ++i) {
      const Event& e = all[i];
      const pipeline::Action a{pipeline::Op(e.op), e.micro, e.chunk, e.peer};
      const double ts = offset_us_ + 1e6 * (e.start_s - t0), dur = 1e6 * (e.end_s - e.start_s);
      events_.push_back({{"name", pipeline::action_name(a)},
                         {"ph", "X"},
                         {"pid", 0},
                         {"tid", r},
                         {"ts", ts},
                         {"dur", dur}});
      end_us = std::max(end_us, ts + dur);
      if (i == first && offset_us_ == 0.0) {  // the thread's name, once
        const std::string name = "rank " + std::to_string(r) + " (stage " + std::to_string(e.pp) +
                                 ", tp " + std::to_string(e.tp) + ", dp " + std::to_string(e.dp) +
                                 ")";
        events_.push_back({{"name", "thread_name"},
                           {"ph", "M"},
                           {"pid", 0},
                           {"tid", r},
                           {"args", {{"name", name}}}});
      }
    }
  }
  offset_us_ = end_us + 1000.0;  // a millisecond between steps
}

void StepTrace::write(const std::string& path) const {
  atomic_write(path, nlohmann::json{{"traceEvents", events_}}.dump(), IoError::input);
}

}  // namespace strata
