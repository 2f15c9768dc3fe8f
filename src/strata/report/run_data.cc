#include "strata/report/run_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "strata/core/check.h"

namespace strata::report {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double as_number(const nlohmann::json& v) {
  if (!v.is_number()) return kNaN;
  const double d = v.get<double>();
  return std::isfinite(d) ? d : kNaN;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_INPUT_CHECK(in.good(), "cannot read ", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  STRATA_INPUT_CHECK(!in.bad(), "cannot read ", path.string());
  return text.str();
}

// The parser's message without its "[json.exception.parse_error.101] " prefix.
std::string parse_message(const nlohmann::json::parse_error& e) {
  std::string m = e.what();
  const size_t at = m.find("] ");
  return at == std::string::npos ? m : m.substr(at + 2);
}

}  // namespace

double StepRow::number(const char* key) const {
  const auto it = row.find(key);
  return it == row.end() ? kNaN : as_number(*it);
}

double StepRow::number(const char* object, const char* key) const {
  const auto it = row.find(object);
  if (it == row.end() || !it->is_object()) return kNaN;
  const auto v = it->find(key);
  return v == it->end() ? kNaN : as_number(*v);
}

RunData read_run(const std::string& run_dir) {
  STRATA_INPUT_CHECK(!run_dir.empty(), "give the run directory (train.run_dir) to report on");
  std::error_code ec;
  const fs::file_status st = fs::status(run_dir, ec);
  STRATA_INPUT_CHECK(fs::exists(st), "the run directory ", run_dir,
                     " does not exist; give the train.run_dir (--run-dir) of a run");
  STRATA_INPUT_CHECK(fs::is_directory(st), run_dir,
                     " is not a directory; give the train.run_dir (--run-dir) of a run");
  RunData d;
  d.run_dir = run_dir;
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  STRATA_INPUT_CHECK(fs::exists(metrics, ec), "no metrics.jsonl in ", run_dir,
                     ": strata train writes it to its train.run_dir from the first step on");
  const std::string text = read_file(metrics);
  std::map<int64_t, StepRow> rows;
  int64_t duplicates = 0;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    const bool complete = nl != std::string::npos;
    const std::string line = text.substr(at, complete ? nl - at : std::string::npos);
    at = complete ? nl + 1 : text.size();
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    std::string problem;
    try {
      j = nlohmann::json::parse(line);
      if (!j.is_object()) {
        problem = "not a JSON object";
      } else if (!j.contains("step") || !j["step"].is_number_integer()) {
        problem = "no integer \"step\"";
      }
    } catch (const nlohmann::json::parse_error& e) {
      problem = "not JSON (" + parse_message(e) + ")";
    }
    if (!problem.empty()) {
      if (!complete) {
        d.notes.push_back("metrics.jsonl line " + std::to_string(line_no) +
                          " has no end (the run is writing it, or stopped while it did): left "
                          "out");
        continue;
      }
      STRATA_INPUT_FAIL(metrics.string(), " line ", line_no, ": ", problem,
                        "; each line must be one step's JSON object as strata train writes it");
    }
    StepRow r;
    r.step = j["step"].get<int64_t>();
    r.row = std::move(j);
    if (rows.count(r.step) != 0) ++duplicates;
    rows[r.step] = std::move(r);
  }
  STRATA_INPUT_CHECK(!rows.empty(), metrics.string(),
                     " holds no step yet: report once the run has trained a step");
  if (duplicates > 0) {
    d.notes.push_back("metrics.jsonl has " + std::to_string(duplicates) +
                      " steps more than once (runs appended to one file): the last row of each "
                      "is shown");
  }
  for (auto& [step, r] : rows) d.steps.push_back(std::move(r));

  const fs::path run_json = fs::path(run_dir) / "run.json";
  if (fs::exists(run_json, ec)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(run_json));
    } catch (const nlohmann::json::parse_error& e) {
      STRATA_INPUT_FAIL(run_json.string(), ": not JSON (", parse_message(e),
                        "); strata train writes it whole at start, so it was changed since");
    }
    STRATA_INPUT_CHECK(j.is_object(), run_json.string(), ": not a JSON object");
    d.run = std::move(j);
  } else {
    d.notes.push_back(
        "no run.json in the run directory: the run predates it (strata train writes the "
        "config, layout and model there at start), so they are unknown here");
  }
  return d;
}

}  // namespace strata::report
