// strata doctor RUN_DIR: why a job hung. Reads the flight records its ranks wrote
// (<run_dir>/flight/rank<R>.json, comm/flight_recorder.h) and names the rank(s) the others wait
// for and what they were doing (monitor/hang_doctor.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "strata/monitor/hang_doctor.h"
#include "tools/strata/commands.h"

namespace strata::cli {

void add_doctor_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "explain a hang: from the flight records the ranks wrote at their watchdog timeout, the "
      "rank(s) the others wait for and what they were doing");
  cmd->add_option("RUN_DIR", *dir,
                  "the run directory (train.run_dir; its flight/ folder is read) or a flight "
                  "records folder (flight, flight.1, ...)")
      ->required();
  cmd->callback([dir] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path flight = fs::path(*dir) / "flight";
    const std::string from = fs::is_directory(flight, ec) ? flight.string() : *dir;
    const monitor::Diagnosis d = monitor::diagnose(monitor::read_flight_records(from));
    std::printf("%s\n", from.c_str());
    for (const std::string& line : d.lines) std::printf("%s\n", line.c_str());
  });
}

}  // namespace strata::cli
