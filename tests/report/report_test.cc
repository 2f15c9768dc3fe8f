// strata report's library on made-up run directories: the nice ticks and their labels, every figure
// a PNG that cairo reads back and that is not one colour, with the data's colours drawn; the page
// linking every figure, escaping what it shows; the per-rank figure at 4 ranks, 32 ranks, one
// process and without per-rank arrays; bad input (each error by its message) leaving no files.
#include "strata/report/report.h"

#include <cairo.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/report/plot.h"

namespace strata::report {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  std::string t = "/tmp/strata_report_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A metrics.jsonl as train writes it: `steps` rows, validation every 10 steps, a straggler window
// every 5 steps with per-rank times for `ranks` ranks (none for 1), rank 1 the slow one.
std::string metrics(int steps, int ranks, bool per_rank = true) {
  std::string out;
  for (int s = 1; s <= steps; ++s) {
    nlohmann::json j;
    j["step"] = s;
    j["loss"] = 5.5 * std::exp(-s / 20.0) + 0.05 * std::sin(s);
    if (s % 10 == 0) j["val_loss"] = 5.6 * std::exp(-s / 22.0), j["val_ppl"] = 1.0;
    j["lr"] = 3e-4 * std::min(1.0, s / 10.0);
    j["grad_norm"] = 1.0 + 2.0 / s;
    j["tokens_per_s"] = 51000.0 + 800.0 * std::cos(s);
    j["mfu"] = 0.41 + 0.01 * std::sin(s);
    j["step_time_s"] = 0.08;
    j["skipped"] = false;
    j["max_rss_bytes"] = 300 << 20;
    j["peak_bytes"] = {
        {"params", 20 << 20},          {"master_params", 40 << 20}, {"grads", 20 << 20},
        {"optimizer_state", 80 << 20}, {"activations", 60 << 20},   {"checkpointed_activations", 0},
        {"comm_buffers", 4 << 20},     {"workspace", 8 << 20},      {"host_checkpoints", 0}};
    if (ranks > 1 && s % 5 == 0) {
      std::vector<double> step, busy;
      for (int r = 0; r < ranks; ++r) {
        step.push_back(0.08 + 0.001 * r);
        busy.push_back(r == 1 ? 0.07 : 0.03 + 0.0005 * r);
      }
      nlohmann::json st = {
          {"steps", {s - 4, s}},
          {"per_step",
           {{"step_s", {{"min", 0.08}, {"median", 0.081}, {"max", 0.09}, {"slowest_rank", 3}}},
            {"busy_s", {{"min", 0.03}, {"median", 0.031}, {"max", 0.07}, {"slowest_rank", 1}}}}},
          {"slow_ranks", {1}}};
      if (per_rank) st["per_rank"] = {{"step_time_s", step}, {"busy_s", busy}};
      j["stragglers"] = st;
    }
    out += j.dump() + "\n";
  }
  return out;
}

nlohmann::json run_json(int world) {
  return {
      {"strata_version", "0.9.0"},
      {"command", {"strata", "train", "--config", "<script>x.json", "--steps", "50"}},
      {"started", "2026-12-05T06:10:37Z"},
      {"host", "node-a"},
      {"config_origin", "The config file x.json with overrides."},
      {"config", {{"train_micro_batch_size_per_gpu", 1}, {"zero_optimization", {{"stage", 3}}}}},
      {"steps", 50},
      {"layout",
       {{"world_size", world},
        {"dp", world},
        {"tp", 1},
        {"pp", 1},
        {"virtual_stages", 1},
        {"schedule", "1f1b"},
        {"zero_stage", 3},
        {"mics_shard_size", -1},
        {"train_batch_size", 16},
        {"micro_batch", 1},
        {"gradient_accumulation", 16 / world},
        {"sequence_parallel", false},
        {"recompute", "full"},
        {"device", "cpu"}}},
      {"model",
       {{"name", "demo"},
        {"family", "gpt2"},
        {"parameters", 1234567},
        {"layers", 4},
        {"hidden", 128},
        {"heads", 4},
        {"seq_len", 64},
        {"vocab", 256},
        {"dtype", "bf16"}}},
      {"data", {{"train", "demo_train.bin"}, {"tokens", 100000}}},
      {"cpu", "Test CPU (AVX2)"},
      {"peak", "peak 100 GFLOP/s"}};
}

fs::path make_run(const std::string& root, const std::string& name, int steps, int ranks,
                  bool with_run_json = true, bool per_rank = true) {
  const fs::path dir = fs::path(root) / name;
  fs::create_directories(dir);
  write(dir / "metrics.jsonl", metrics(steps, ranks, per_rank));
  if (with_run_json) write(dir / "run.json", run_json(ranks).dump(2));
  return dir;
}

// A PNG read back by cairo: its size, how far it is from one colour, and how many pixels carry a
// strong colour (the data's lines and areas; the axes and text are grey).
struct PngStats {
  int width = 0, height = 0;
  double luma_variance = 0, nonwhite = 0;
  size_t saturated = 0, colours = 0;
};

PngStats png_stats(const fs::path& path) {
  PngStats st;
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << path;
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) return st;
  st.width = cairo_image_surface_get_width(s), st.height = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  double sum = 0, sq = 0;
  size_t nonwhite = 0;
  std::set<uint32_t> colours;
  for (int y = 0; y < st.height; ++y) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(data + size_t(y) * size_t(stride));
    for (int x = 0; x < st.width; ++x) {
      const uint32_t p = row[x] & 0xffffff;
      const int r = int(p >> 16), g = int((p >> 8) & 0xff), b = int(p & 0xff);
      const double luma = 0.299 * r + 0.587 * g + 0.114 * b;
      sum += luma, sq += luma * luma;
      if (p != 0xffffff) ++nonwhite;
      if (std::max({r, g, b}) - std::min({r, g, b}) > 80) ++st.saturated;
      if (colours.size() < 100000) colours.insert(p);
    }
  }
  const double n = double(st.width) * st.height;
  st.luma_variance = sq / n - (sum / n) * (sum / n);
  st.nonwhite = double(nonwhite) / n;
  st.colours = colours.size();
  cairo_surface_destroy(s);
  return st;
}

std::string message_of(const std::string& run_dir, const std::string& out = "") {
  try {
    write_report(run_dir, out);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(ReportPlot, NiceTicksAndLabels) {
  Ticks t = nice_ticks(0.3, 7.3, 6, false);
  EXPECT_DOUBLE_EQ(t.step, 2.0);
  EXPECT_DOUBLE_EQ(t.lo, 0.0);
  EXPECT_DOUBLE_EQ(t.hi, 8.0);
  EXPECT_EQ(t.values, std::vector<double>({0, 2, 4, 6, 8}));
  t = nice_ticks(1, 8, 8, true);
  EXPECT_DOUBLE_EQ(t.step, 1.0);
  t = nice_ticks(1, 3, 8, true);  // integer steps never go below 1
  EXPECT_DOUBLE_EQ(t.step, 1.0);
  t = nice_ticks(0, 3e-4, 6, false);
  EXPECT_NEAR(t.step, 1e-4, 1e-15);
  EXPECT_NEAR(t.hi, 3e-4, 1e-15);
  EXPECT_EQ(tick_label(2.5e-4, 5e-5, 3e-4), "2.5e-04");
  EXPECT_EQ(tick_label(51200, 200, 52000), "51.2k");
  EXPECT_EQ(tick_label(2000000, 1000000, 4000000), "2M");
  EXPECT_EQ(tick_label(0.25, 0.05, 1), "0.25");
  EXPECT_EQ(tick_label(4, 2, 10), "4");
  EXPECT_EQ(tick_label(0, 2, 10), "0");
  t = nice_ticks(5, 5, 6, false);  // one value: widened around it
  EXPECT_LT(t.lo, 5.0);
  EXPECT_GT(t.hi, 5.0);
}

TEST(ReportPlot, PanelWithoutDataShowsItsNote) {
  Figure f;
  Panel p;
  p.title = "empty";
  p.note = "nothing here";
  f.panels = {p};
  const std::string png = render_png(f);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(Report, EveryFigureDrawnAndLinked) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 50, 4);
  const Written w = write_report(run.string(), "");
  EXPECT_EQ(w.dir, (run / "report").string());
  const std::vector<std::string> pngs = {"loss.png",      "throughput.png", "lr.png",
                                         "grad_norm.png", "memory.png",     "rank_times.png"};
  ASSERT_EQ(w.files.size(), pngs.size() + 1);
  const std::string html = read_all(run / "report" / "index.html");
  for (const std::string& f : pngs) {
    const fs::path p = run / "report" / f;
    ASSERT_TRUE(fs::exists(p)) << p;
    EXPECT_EQ(read_all(p).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << f;
    const PngStats st = png_stats(p);
    EXPECT_EQ(st.width, 960) << f;
    EXPECT_GT(st.height, 200) << f;
    EXPECT_GT(st.luma_variance, 100.0) << f;  // not one colour
    EXPECT_GT(st.colours, 20u) << f;          // antialiased lines and text
    EXPECT_GT(st.saturated, 300u) << f;       // the data, in the palette's colours
    EXPECT_NE(html.find("<img src=\"" + f + "\""), std::string::npos) << f;
  }
  // Summary, config and command line, escaped.
  for (const char* s :
       {"1,234,567 parameters", "4 ranks = dp 4 x tp 1 x pp 1", "ZeRO stage 3", "Test CPU (AVX2)",
        "Final loss", "Median tokens/s", "Median MFU", "&quot;zero_optimization&quot;",
        "&lt;script&gt;x.json", "slow: rank 1 in 10", "best "}) {
    EXPECT_NE(html.find(s), std::string::npos) << s;
  }
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_NE(html.find("Each rank&#39;s seconds per step"), std::string::npos);
  // No temporary directory is left beside the report.
  for (const auto& e : fs::directory_iterator(run)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  fs::remove_all(root);
}

// A mixture of experts' run gets the expert-load figure (a dense run does not: the test above
// counts its figures): one line per MoE layer, its busiest expert over the mean.
TEST(Report, ExpertLoadOfAMixtureOfExperts) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 30, 2);
  std::string rows;
  std::istringstream in(read_all(run / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    const double s = j["step"].get<double>();
    j["expert_tokens"] = {{"0", {100.0 + s, 100.0, 100.0 - s, 100.0}},
                          {"2", {400.0 - 10 * s, 0.0, 10 * s, 0.0}}};
    rows += j.dump() + "\n";
  }
  write(run / "metrics.jsonl", rows);
  const Written w = write_report(run.string(), "");
  EXPECT_EQ(w.files.size(), 8u);
  const fs::path p = run / "report" / "expert_load.png";
  ASSERT_TRUE(fs::exists(p));
  const PngStats st = png_stats(p);
  EXPECT_GT(st.luma_variance, 100.0);
  EXPECT_GT(st.saturated, 300u);
  const std::string html = read_all(run / "report" / "index.html");
  EXPECT_NE(html.find("<img src=\"expert_load.png\""), std::string::npos);
  fs::remove_all(root);
}

TEST(Report, ManyRanksAsBandMedianAndSlowest) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 20, 32);
  write_report(run.string(), "");
  const std::string html = read_all(run / "report" / "index.html");
  EXPECT_NE(html.find("Over 32 ranks"), std::string::npos);
  EXPECT_GT(png_stats(run / "report" / "rank_times.png").saturated, 300u);
  fs::remove_all(root);
}

TEST(Report, OlderStragglerRowsWithoutPerRankTimes) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 20, 4, true, false);
  write_report(run.string(), "");
  const std::string html = read_all(run / "report" / "index.html");
  EXPECT_NE(html.find("predates the per-rank times"), std::string::npos);
  EXPECT_GT(png_stats(run / "report" / "rank_times.png").saturated, 300u);
  fs::remove_all(root);
}

TEST(Report, SingleProcessSaysSo) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 8, 1);
  write_report(run.string(), "");
  const std::string html = read_all(run / "report" / "index.html");
  EXPECT_NE(html.find("single process: one rank, no per-rank times"), std::string::npos);
  EXPECT_NE(html.find("none (no validation data"), std::string::npos);  // 8 steps: no val row
  const PngStats st = png_stats(run / "report" / "rank_times.png");
  EXPECT_GT(st.luma_variance, 10.0);  // the note is drawn
  fs::remove_all(root);
}

TEST(Report, WithoutRunJsonNotesTheUnknownConfig) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 12, 2, false);
  const Written w = write_report(run.string(), "");
  ASSERT_EQ(w.notes.size(), 1u);
  EXPECT_NE(w.notes[0].find("no run.json"), std::string::npos);
  const std::string html = read_all(run / "report" / "index.html");
  EXPECT_NE(html.find("The config and layout of this run are unknown"), std::string::npos);
  EXPECT_NE(html.find("<img src=\"rank_times.png\""), std::string::npos);
  fs::remove_all(root);
}

TEST(Report, LastLineWithoutEndIsLeftOutWithANote) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 12, 1);
  write(run / "metrics.jsonl", metrics(12, 1) + "{\"step\": 13, \"lo");
  const Written w = write_report(run.string(), "");
  ASSERT_FALSE(w.notes.empty());
  EXPECT_NE(w.notes[0].find("line 13 has no end"), std::string::npos);
  EXPECT_NE(read_all(run / "report" / "index.html").find("12 rows"), std::string::npos);
  fs::remove_all(root);
}

TEST(Report, ReplacesAnEarlierReportWhole) {
  const std::string root = temp_dir();
  const fs::path run = make_run(root, "run", 12, 1);
  const fs::path out = fs::path(root) / "out";
  write_report(run.string(), out.string());
  write(out / "stale.png", "x");
  write_report(run.string(), out.string() + "/");
  EXPECT_FALSE(fs::exists(out / "stale.png"));
  EXPECT_TRUE(fs::exists(out / "index.html"));
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "run" || n == "out") << n;
  }
  fs::remove_all(root);
}

TEST(Report, BadInputNamesTheProblemAndWritesNothing) {
  const std::string root = temp_dir();
  EXPECT_NE(message_of("").find("give the run directory"), std::string::npos);
  EXPECT_NE(message_of(root + "/nope").find(root + "/nope does not exist"), std::string::npos);
  write(fs::path(root) / "file", "x");
  EXPECT_NE(message_of(root + "/file").find("is not a directory"), std::string::npos);
  fs::create_directories(fs::path(root) / "empty");
  EXPECT_NE(message_of(root + "/empty").find("no metrics.jsonl in " + root + "/empty"),
            std::string::npos);

  const fs::path run = make_run(root, "run", 6, 1);
  write(run / "metrics.jsonl", "\n");
  EXPECT_NE(message_of(run.string()).find("metrics.jsonl holds no step yet"), std::string::npos);
  std::string rows = metrics(6, 1);
  write(run / "metrics.jsonl",
        rows.substr(0, rows.find('\n') + 1) + "{\"step\": 2,\n" + rows.substr(rows.find('\n') + 1));
  EXPECT_NE(message_of(run.string()).find(run.string() + "/metrics.jsonl line 2: not JSON"),
            std::string::npos)
      << message_of(run.string());
  write(run / "metrics.jsonl", rows + "[1, 2]\n");
  EXPECT_NE(message_of(run.string()).find("metrics.jsonl line 7: not a JSON object"),
            std::string::npos);
  write(run / "metrics.jsonl", "{\"step\": \"one\"}\n" + rows);
  EXPECT_NE(message_of(run.string()).find("line 1: no integer \"step\""), std::string::npos);
  write(run / "metrics.jsonl", rows);
  write(run / "run.json", "{\"layout\": ");
  EXPECT_NE(message_of(run.string()).find(run.string() + "/run.json: not JSON"), std::string::npos);
  write(run / "run.json", run_json(1).dump());
  // An output directory that is not an earlier report is not replaced.
  const fs::path other = fs::path(root) / "other";
  fs::create_directories(other);
  write(other / "keep.txt", "mine");
  EXPECT_NE(message_of(run.string(), other.string()).find("holds files and no index.html"),
            std::string::npos);
  EXPECT_EQ(read_all(other / "keep.txt"), "mine");
  EXPECT_NE(message_of(run.string(), (other / "keep.txt").string()).find("is not a directory"),
            std::string::npos);
  // None of the failures left a report or a temporary directory.
  EXPECT_FALSE(fs::exists(run / "report"));
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace strata::report
