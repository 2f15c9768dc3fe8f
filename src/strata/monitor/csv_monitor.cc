#include "strata/monitor/csv_monitor.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <sstream>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"

namespace strata::monitor {

namespace {

// The shortest text that reads back as the same double (Python's repr, which DeepSpeed's csv
// writer prints).
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The rows of `text` after its header whose step is at most keep_through.
std::string rows_through(const std::string& text, int64_t keep_through) {
  std::istringstream in(text);
  std::string line, kept;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    int64_t step = 0;
    const auto r = std::from_chars(line.data(), line.data() + line.size(), step);
    if (r.ec == std::errc() && r.ptr != line.data() && *r.ptr == ',' && step <= keep_through) {
      kept += line + "\n";
    }
  }
  return kept;
}

}  // namespace

CsvMonitor::CsvMonitor(const std::string& dir, int64_t keep_through)
    : dir_(dir), keep_through_(keep_through) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create the csv_monitor directory '", dir, "': ", ec.message(),
                     "; set csv_monitor.output_path to a writable directory");
}

std::string CsvMonitor::file_of(const std::string& tag) const {
  std::string name = tag;
  for (char& ch : name) {
    if (ch == '/' || ch == ' ') ch = '_';
  }
  return (std::filesystem::path(dir_) / (name + ".csv")).string();
}

void CsvMonitor::write(int64_t step, const Scalars& values) {
  for (const Scalar& s : values) {
    const std::string path = file_of(s.tag);
    auto it = files_.find(path);
    if (it == files_.end()) {
      // First write of this tag in this run: the header, then the rows this run keeps.
      std::string text;
      if (keep_through_ > 0 && std::filesystem::exists(path)) {
        std::ifstream in(path, std::ios::binary);
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      const size_t slash = s.tag.rfind('/');
      const std::string column = slash == std::string::npos ? s.tag : s.tag.substr(slash + 1);
      atomic_write(path, "step," + column + "\n" + rows_through(text, keep_through_),
                   IoError::input);
      auto f = std::make_unique<std::ofstream>(path, std::ios::app);
      it = files_.emplace(path, std::move(f)).first;
    }
    std::ofstream& out = *it->second;
    out << step << ',' << number(s.value) << '\n';
    out.flush();
    if (!out.good() && !warned_) {
      warned_ = true;
      std::fprintf(stderr, "warning: cannot write %s; training goes on\n", path.c_str());
    }
  }
}

}  // namespace strata::monitor
