// The subcommands of the strata CLI; each registers itself on the app and runs from its callback.
// Failures throw: InputError for what the user must change, Error for the rest.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

void add_train_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace strata::cli
