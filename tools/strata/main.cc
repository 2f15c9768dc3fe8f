// strata: the command line. Exit codes: 0 success, 2 usage or configuration error (bad config,
// data file or command line), 1 runtime failure.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "strata/core/check.h"
#include "tools/strata/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: distributed training of Transformer models", "strata"};
  app.require_subcommand(1);
  strata::cli::add_train_command(app);
  strata::cli::add_data_command(app);
  strata::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const strata::InputError& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
