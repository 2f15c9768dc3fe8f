// The subcommands of the strata CLI; each registers itself on the app and runs from its callback.
// Failures throw: InputError for what the user must change, Error for the rest.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/model_config.h"

namespace strata::cli {

// The process's command line as main received it, before MPI_Init sees it (run.json records
// train's).
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

void add_train_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
// The job's exit code is written to *exit_code.
void add_launch_command(CLI::App& app, int* exit_code);
void add_topology_command(CLI::App& app);
void add_schedule_command(CLI::App& app);
void add_elastic_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_doctor_command(CLI::App& app);
void add_report_command(CLI::App& app);

// strata bench --calibrate: measures this machine (every rank of the job takes part) and rank 0
// writes its device profile (planner/device_profile.h) to `output`. `model`: a preset whose GEMM
// shapes the efficiency curve follows ("": generic Transformer shapes). `device` "cuda" is an
// InputError for now.
void run_calibrate(const std::string& output, const std::optional<ModelConfig>& model,
                   const std::string& device);

// train.device: "cuda" puts this rank on a GPU (local rank mod the visible GPUs) before anything
// is allocated, and makes it the device every Buffer and view of the run lives on; "cpu" notes a
// visible GPU on rank 0. No GPU for "cuda" is an InputError.
void select_device(const std::string& device, bool rank0);

// The time now in UTC, as strftime writes `format` (at most 63 bytes), e.g. kUtcMinute:
// "2026-12-05 07:25 UTC".
inline constexpr const char* kUtcMinute = "%Y-%m-%d %H:%M UTC";
std::string utc_now(const char* format);

}  // namespace strata::cli
