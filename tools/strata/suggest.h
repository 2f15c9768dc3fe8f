// "Did you mean" for a command line CLI11 refused: each misspelt subcommand or flag, matched
// against what the subcommand reading it accepts.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace strata::cli {

// Walks argv through `app`'s subcommands the way CLI11 reads it (a subcommand name descends, an
// option takes its values, "--" ends the options) and returns, for each flag the current
// subcommand does not know and each word where a subcommand was expected, a line such as
// "unknown option --stpes of 'strata train': did you mean --steps?". Empty when every word is
// known.
std::vector<std::string> suggestions(const CLI::App& app, int argc, const char* const* argv);

}  // namespace strata::cli
