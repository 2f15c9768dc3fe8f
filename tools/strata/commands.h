// The subcommands of the strata CLI; each registers itself on the app and runs from its callback.
// Failures throw: InputError for what the user must change, Error for the rest.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

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

}  // namespace strata::cli
