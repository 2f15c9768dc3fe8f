// The report's page (make_html) and its directory (write_report).
#include "strata/report/report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"

namespace strata::report {

namespace fs = std::filesystem;

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "1,234,567"
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string str(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

double median_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double d) { return !std::isfinite(d); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Rows = std::vector<std::pair<std::string, std::string>>;  // label, escaped HTML

void add(Rows& rows, const std::string& label, const std::string& text) {
  if (!text.empty()) rows.emplace_back(label, html_escape(text));
}

// The run's own description: run.json's model, layout, data and machine.
void run_rows(const nlohmann::json& run, Rows& rows) {
  const nlohmann::json obj = nlohmann::json::object();
  std::string started = str(run, "started");
  if (!str(run, "host").empty()) started += " on " + str(run, "host");
  add(rows, "Started", started);
  if (const auto r = run.find("resumed"); r != run.end() && r->is_object()) {
    add(rows, "Resumed", "at step " + str(*r, "step") + " from " + str(*r, "from"));
  }
  const nlohmann::json m = run.value("model", obj);
  if (!m.empty()) {
    std::string s = str(m, "name");
    if (!str(m, "family").empty() && str(m, "family") != s) s += " (" + str(m, "family") + ")";
    if (m.contains("parameters") && m["parameters"].is_number_integer()) {
      s += ": " + grouped(m["parameters"].get<int64_t>()) + " parameters";
    }
    s += " in " + str(m, "dtype") + ", " + str(m, "layers") + " layers, hidden " +
         str(m, "hidden") + ", " + str(m, "heads") + " heads, seq_len " + str(m, "seq_len") +
         ", vocab " + str(m, "vocab");
    add(rows, "Model", s);
  }
  const nlohmann::json l = run.value("layout", obj);
  if (!l.empty()) {
    std::string s = str(l, "world_size") + " rank" + (str(l, "world_size") == "1" ? "" : "s") +
                    " = dp " + str(l, "dp") + " x tp " + str(l, "tp") + " x pp " + str(l, "pp");
    if (l.value("pp", 1) > 1) {
      s += " (" + str(l, "schedule") + ", " + str(l, "virtual_stages") + " virtual stage" +
           (str(l, "virtual_stages") == "1" ? "" : "s") + ")";
    }
    s += ", ZeRO stage " + str(l, "zero_stage");
    if (l.value("mics_shard_size", -1) > 0)
      s += " (MiCS groups of " + str(l, "mics_shard_size") + ")";
    s += ", sequence parallel " + std::string(l.value("sequence_parallel", false) ? "on" : "off");
    s += ", recompute " + str(l, "recompute") + ", device " + str(l, "device");
    add(rows, "Layout", s);
    add(rows, "Batch",
        str(l, "train_batch_size") + " sequences a step = micro-batch " + str(l, "micro_batch") +
            " x accumulation " + str(l, "gradient_accumulation") + " x dp " + str(l, "dp"));
  }
  const nlohmann::json d = run.value("data", obj);
  if (!d.empty()) {
    std::string s = str(d, "train");
    if (d.contains("tokens") && d["tokens"].is_number_integer()) {
      s += " (" + grouped(d["tokens"].get<int64_t>()) + " tokens)";
    }
    if (!str(d, "val").empty()) s += "; validation: " + str(d, "val");
    add(rows, "Data", s);
  }
  add(rows, "CPU", str(run, "cpu"));
  add(rows, "MFU peak", str(run, "peak"));
}

// What the metrics say: steps, losses, speed, memory, stragglers.
void metric_rows(const RunData& run, Rows& rows) {
  const std::vector<StepRow>& st = run.steps;
  std::string steps = std::to_string(st.front().step) + "-" + std::to_string(st.back().step) +
                      " (" + std::to_string(st.size()) + " rows)";
  if (run.run && run.run->contains("steps")) steps += " of train.steps " + str(*run.run, "steps");
  add(rows, "Steps", steps);
  for (auto it = st.rbegin(); it != st.rend(); ++it) {
    if (std::isfinite(it->number("loss"))) {
      add(rows, "Final loss",
          fmt("%.4f", it->number("loss")) + " (step " + std::to_string(it->step) + ")");
      break;
    }
  }
  const StepRow* last_val = nullptr;
  const StepRow* best_val = nullptr;
  int64_t skipped = 0;
  std::vector<double> tps, mfu, secs;
  double peak = 0, rss = 0;
  std::map<int, int> slow;  // rank: windows it was slow in
  int windows = 0;
  for (const StepRow& r : st) {
    const double v = r.number("val_loss");
    if (std::isfinite(v)) {
      last_val = &r;
      if (best_val == nullptr || v < best_val->number("val_loss")) best_val = &r;
    }
    if (r.row.value("skipped", false)) ++skipped;
    tps.push_back(r.number("tokens_per_s"));
    mfu.push_back(r.number("mfu"));
    secs.push_back(r.number("step_time_s"));
    double total = 0;
    if (const auto pb = r.row.find("peak_bytes"); pb != r.row.end() && pb->is_object()) {
      for (const auto& [name, b] : pb->items()) total += b.is_number() ? b.get<double>() : 0.0;
    }
    peak = std::max(peak, total);
    if (std::isfinite(r.number("max_rss_bytes"))) rss = std::max(rss, r.number("max_rss_bytes"));
    if (const auto s = r.row.find("stragglers"); s != r.row.end() && s->is_object()) {
      ++windows;
      for (const auto& q : s->value("slow_ranks", nlohmann::json::array())) {
        if (q.is_number_integer()) ++slow[q.get<int>()];
      }
    }
  }
  if (last_val != nullptr) {
    add(rows, "Validation loss",
        "last " + fmt("%.4f", last_val->number("val_loss")) + " (step " +
            std::to_string(last_val->step) + "), best " +
            fmt("%.4f", best_val->number("val_loss")) + " (step " + std::to_string(best_val->step) +
            ")");
  } else {
    add(rows, "Validation loss", "none (no validation data, or no step evaluated yet)");
  }
  if (const double m = median_of(tps); std::isfinite(m)) {
    add(rows, "Median tokens/s", fmt("%.0f", m));
  }
  if (const double m = median_of(mfu); std::isfinite(m)) {
    add(rows, "Median MFU", fmt("%.1f%%", 100.0 * m));
  }
  if (const double m = median_of(secs); std::isfinite(m)) {
    add(rows, "Median step time", fmt("%.4f s", m));
  }
  if (peak > 0) add(rows, "Peak tracked memory (rank 0)", format_bytes(size_t(peak)));
  if (rss > 0) add(rows, "Max RSS (rank 0)", format_bytes(size_t(rss)));
  if (skipped > 0) add(rows, "Skipped steps", std::to_string(skipped) + " (loss-scale overflow)");
  if (windows > 0) {
    std::string s = std::to_string(windows) + " window" + (windows == 1 ? "" : "s") + "; ";
    if (slow.empty()) s += "no rank slow";
    for (auto it = slow.begin(); it != slow.end(); ++it) {
      s += std::string(it == slow.begin() ? "slow: " : ", ") + "rank " + std::to_string(it->first) +
           " in " + std::to_string(it->second);
    }
    add(rows, "Straggler windows", s);
  }
}

constexpr const char* kStyle = R"(
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 24px auto; max-width: 1000px;
       color: #222; background: #fff; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table.summary { border-collapse: collapse; width: 100%; font-size: 14px; }
table.summary th { text-align: left; vertical-align: top; padding: 4px 12px 4px 0;
                   width: 220px; color: #555; font-weight: normal; }
table.summary td { padding: 4px 0; }
table.summary tr { border-bottom: 1px solid #eee; }
.note { background: #fff6dd; border: 1px solid #e8d28a; padding: 8px 12px; margin: 12px 0;
        font-size: 14px; }
figure { margin: 18px 0; }
figure img { max-width: 100%; border: 1px solid #e4e4e4; }
figcaption { font-size: 13px; color: #555; margin-top: 4px; }
pre { background: #f6f6f6; border: 1px solid #e4e4e4; padding: 10px; font-size: 12px;
      overflow-x: auto; }
pre.command { white-space: pre-wrap; overflow-wrap: anywhere; }
code { font-size: 13px; }
.muted { color: #777; font-size: 13px; }
)";

}  // namespace

std::string make_html(const RunData& run, const std::vector<FigureFile>& figures) {
  const std::string name = fs::path(run.run_dir).lexically_normal().filename().string();
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<title>strata report: " + html_escape(name.empty() ? run.run_dir : name) + "</title>\n";
  h += "<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  h += "<h1>strata run report</h1>\n<div class=\"muted\">" + html_escape(run.run_dir) + "</div>\n";
  for (const std::string& n : run.notes) h += "<div class=\"note\">" + html_escape(n) + "</div>\n";

  Rows rows;
  add(rows, "Run directory", run.run_dir);
  if (run.run) run_rows(*run.run, rows);
  metric_rows(run, rows);
  h += "<h2>Summary</h2>\n<table class=\"summary\">\n";
  for (const auto& [label, value] : rows) {
    h += "<tr><th>" + html_escape(label) + "</th><td>" + value + "</td></tr>\n";
  }
  h += "</table>\n";

  h += "<h2>Figures</h2>\n";
  for (const FigureFile& f : figures) {
    h += "<figure><img src=\"" + html_escape(f.file) + "\" alt=\"" + html_escape(f.caption) +
         "\"><figcaption>" + html_escape(f.caption) + "</figcaption></figure>\n";
  }

  h += "<h2>Configuration</h2>\n";
  if (run.run && run.run->contains("config")) {
    const nlohmann::json& r = *run.run;
    h += "<p class=\"muted\">" + html_escape(str(r, "config_origin")) + "</p>\n";
    h += "<pre>" + html_escape((*run.run)["config"].dump(2)) + "</pre>\n";
    if (const auto c = r.find("command"); c != r.end() && c->is_array()) {
      std::string line;
      for (const auto& a : *c) {
        const std::string s = a.is_string() ? a.get<std::string>() : a.dump();
        const bool quote = s.empty() || s.find_first_of(" \t\"'$\\") != std::string::npos;
        line += (line.empty() ? "" : " ") + (quote ? "'" + s + "'" : s);
      }
      h += "<h2>Command line</h2>\n<pre class=\"command\">" + html_escape(line) + "</pre>\n";
    }
  } else {
    h += "<div class=\"note\">The config and layout of this run are unknown: it has no run.json "
         "(the run predates it).</div>\n";
  }
  std::string version;
  if (run.run) version = str(*run.run, "strata_version");
  h += "<p class=\"muted\">Made by strata report" +
       (version.empty() ? std::string() : " from a run of strata " + html_escape(version)) +
       ".</p>\n</body>\n</html>\n";
  return h;
}

Written write_report(const std::string& run_dir, const std::string& out_dir) {
  RunData run = read_run(run_dir);
  std::error_code ec;
  // The page names the run by its absolute path (a relative one says little once moved).
  const fs::path absolute = fs::absolute(run_dir, ec);
  if (!ec) run.run_dir = absolute.lexically_normal().string();
  fs::path out = out_dir.empty() ? fs::path(run_dir) / "report" : fs::path(out_dir);
  out = out.lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "dir/" is "dir"
  if (fs::exists(out, ec)) {
    STRATA_INPUT_CHECK(fs::is_directory(out, ec), "the report's output ", out.string(),
                       " exists and is not a directory; give another -o");
    STRATA_INPUT_CHECK(fs::is_empty(out, ec) || fs::exists(out / "index.html", ec),
                       "the report's output directory ", out.string(),
                       " holds files and no index.html (not an earlier report), so it is not "
                       "replaced; give another -o");
  }
  const std::vector<FigureFile> figures = make_figures(run);
  const std::string html = make_html(run, figures);

  if (out.has_parent_path()) {
    fs::create_directories(out.parent_path(), ec);
    STRATA_INPUT_CHECK(!ec, "cannot create ", out.parent_path().string(), ": ", ec.message());
  }
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = out.string() + ".tmp." + pid;
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create ", tmp.string(), ": ", ec.message(),
                     "; give -o a directory where you can write");
  // Until the rename, a failure leaves no trace but the removed temporary directory.
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code e;
      if (!dir.empty()) fs::remove_all(dir, e);
    }
  } cleanup{tmp};
  Written w;
  w.dir = out.string();
  w.notes = run.notes;
  for (const FigureFile& f : figures) {
    atomic_write((tmp / f.file).string(), f.png, IoError::input);
    w.files.push_back((out / f.file).string());
  }
  atomic_write((tmp / "index.html").string(), html, IoError::input);
  w.files.push_back((out / "index.html").string());
  if (fs::exists(out, ec)) {
    // An earlier report: moved aside, the new one renamed in, the old one removed.
    const fs::path old = out.string() + ".old." + pid;
    rename_durably(out.string(), old.string(), IoError::input);
    try {
      rename_durably(tmp.string(), out.string(), IoError::input);
    } catch (...) {
      std::rename(old.c_str(), out.c_str());
      throw;
    }
    fs::remove_all(old, ec);
  } else {
    rename_durably(tmp.string(), out.string(), IoError::input);
  }
  cleanup.dir.clear();
  return w;
}

}  // namespace strata::report
