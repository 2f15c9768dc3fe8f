// strata report RUN_DIR [-o OUT_DIR]: a run's figures and one HTML page (report/report.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "strata/core/check.h"
#include "tools/strata/commands.h"
#ifdef STRATA_HAVE_REPORT
#include "strata/report/report.h"
#endif

namespace strata::cli {

namespace {

struct ReportArgs {
  std::string run_dir, out_dir;
};

void run_report(const ReportArgs& a) {
#ifdef STRATA_HAVE_REPORT
  const report::Written w = report::write_report(a.run_dir, a.out_dir);
  for (const std::string& n : w.notes) std::printf("note: %s\n", n.c_str());
  std::printf("report: %zu figures and index.html in %s\n", w.files.size() - 1, w.dir.c_str());
  std::printf("open: file://%s\n",
              std::filesystem::absolute(std::filesystem::path(w.dir) / "index.html").c_str());
#else
  (void)a;
  STRATA_INPUT_FAIL(
      "this strata was built without strata report (-DSTRATA_REPORT=OFF): install cairo "
      "(libcairo2-dev) and configure again with -DSTRATA_REPORT=ON");
#endif
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Plot a run's metrics (PNG) and write one HTML page with its config and layout");
  cmd->add_option("run_dir", args->run_dir, "the run's directory (train.run_dir)")->required();
  cmd->add_option("-o,--output", args->out_dir,
                  "directory for index.html and the figures (default RUN_DIR/report; an earlier "
                  "report there is replaced)");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace strata::cli
