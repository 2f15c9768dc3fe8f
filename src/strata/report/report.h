// strata report: a run directory (run_data.h) made into PNG figures (plot.h) and one HTML page.
//
// Figures, each a PNG beside index.html: loss.png (training loss per step, and the validation
// loss where the run evaluated), lr.png, grad_norm.png, throughput.png (tokens/s and MFU),
// memory.png (rank 0's tracked peak bytes per category, stacked, in MiB or GiB) and rank_times.png
// (each rank's step time and busy time per straggler window; over 16 ranks the min–max band, the
// median and the slowest rank; a single-process run says so in the figure). index.html is
// self-contained (inline CSS, relative links to the PNGs): a summary table (run, model, layout,
// CPU, steps, final and best losses, median tokens/s, MFU and step time, peak memory), the figures,
// the config as JSON and the command line, every string HTML-escaped. Without run.json the page
// says that the config and layout are unknown.
#pragma once

#include <string>
#include <vector>

#include "strata/report/run_data.h"

namespace strata::report {

struct FigureFile {
  std::string file;  // "loss.png"
  std::string caption;
  std::string png;  // the bytes
};

// The figures of a run, in page order.
std::vector<FigureFile> make_figures(const RunData& run);
// The page, linking `figures` by file name.
std::string make_html(const RunData& run, const std::vector<FigureFile>& figures);
std::string html_escape(const std::string& s);

struct Written {
  std::string dir;                 // the report directory
  std::vector<std::string> files;  // its files, index.html last
  std::vector<std::string> notes;  // what the reader noted (RunData::notes)
};

// Reads run_dir and writes the report to out_dir ("": <run_dir>/report). Every file is written
// into a new directory beside out_dir, which then replaces it: out_dir holds either the previous
// report or the whole new one, never a part. An out_dir that exists and is neither empty nor a
// previous report (it has no index.html) is an InputError, as are the errors of read_run.
Written write_report(const std::string& run_dir, const std::string& out_dir);

}  // namespace strata::report
