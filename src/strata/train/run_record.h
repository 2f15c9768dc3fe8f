// What a run tells a person before its first step: which files it trains and validates on, and
// <run_dir>/run.json, the record `strata report` shows beside the metrics (the config as given, the
// layout and the model as resolved, the machine).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"

namespace strata {

// "a, b, c" of at most 6 names, else the first 3, "...", the last 2 and the count.
std::string list_files(const std::vector<std::string>& files);

// Rank 0: which files are trained on, which validate (and which are ignored), and when
// validation runs.
void print_data(const data::DataSplits& d, const Config& cfg, const Engine& engine);

struct RunRecord {
  const Config& cfg;
  const comm::RankGrid& grid;
  const Engine& engine;
  std::string model_line, cpu, peak;
  nlohmann::json resumed;  // {"step", "from"} when the run continues a checkpoint
  std::vector<std::string> rank_names;
  std::string config_path, started;
  nlohmann::json config, data;
  std::string version;
  std::vector<std::string> command_line;
};

// Rank 0 writes <run_dir>/run.json whole (core/atomic_file.h) once the run is set up: a resumed
// or restarted run rewrites it with its own layout and the step it resumed at.
void write_run_json(const RunRecord& r);

}  // namespace strata
