// What strata report reads from a run directory: <run_dir>/metrics.jsonl (monitor/metrics.h, one
// JSON object per step, written by rank 0) and <run_dir>/run.json (the config, layout and model
// train writes at start; absent for runs that predate it).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace strata::report {

// One metrics.jsonl row, as written. Numbers absent or not finite (a NaN is written as null) are
// NaN here.
struct StepRow {
  int64_t step = 0;
  nlohmann::json row;  // the whole object
  double number(const char* key) const;
  double number(const char* object, const char* key) const;  // row[object][key]
};

struct RunData {
  std::string run_dir;
  std::vector<StepRow> steps;         // by step
  std::optional<nlohmann::json> run;  // run.json, when the run wrote one
  // What the reader left out or could not know, one sentence each (shown on the page).
  std::vector<std::string> notes;
};

// Reads a run directory. InputError (naming the path, and the line for metrics.jsonl) when: the
// directory does not exist or is not a directory; it has no metrics.jsonl; metrics.jsonl holds no
// row; a line is not a JSON object with an integer "step" (a last line without its newline is a
// row the run is still writing, or a crash cut: it is left out with a note instead); run.json
// exists but is not a JSON object. Rows are ordered by step; where a step appears twice (runs
// appended without the trim a resume does) the later row is kept, with a note.
RunData read_run(const std::string& run_dir);

}  // namespace strata::report
