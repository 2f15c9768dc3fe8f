// make_figures (report.h): metrics.jsonl's columns as plot.h panels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "strata/core/memory.h"
#include "strata/report/plot.h"
#include "strata/report/report.h"

namespace strata::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Up to this many ranks get a line each in rank_times.png; above, the band, median and slowest.
constexpr size_t kMaxRankLines = 16;
// Straggler windows get a marker each up to this many.
constexpr size_t kMaxMarkers = 40;
// Runs of this many steps or more get the loss smoothed beside the raw one: a centred mean over
// 2·(steps / kSmoothFrom) + 1 steps.
constexpr size_t kSmoothFrom = 100;

std::vector<double> column(const RunData& run, const char* key, double scale = 1.0) {
  std::vector<double> v;
  for (const StepRow& r : run.steps) v.push_back(r.number(key) * scale);
  return v;
}

std::vector<double> steps_of(const RunData& run) {
  std::vector<double> x;
  for (const StepRow& r : run.steps) x.push_back(double(r.step));
  return x;
}

double median_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double d) { return !std::isfinite(d); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The mean of the finite values within `half` steps on either side of each (centred, so the curve
// does not lag the raw one as an exponential average does).
std::vector<double> moving_average(const std::vector<double>& y, size_t half) {
  std::vector<double> out(y.size(), kNaN);
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    double sum = 0;
    size_t n = 0;
    for (size_t k = i >= half ? i - half : 0; k <= std::min(y.size() - 1, i + half); ++k) {
      if (std::isfinite(y[k])) sum += y[k], ++n;
    }
    out[i] = sum / double(n);
  }
  return out;
}

Series line(std::string label, std::vector<double> x, std::vector<double> y, size_t color) {
  Series s;
  s.label = std::move(label), s.x = std::move(x), s.y = std::move(y), s.color = palette(color);
  return s;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

Panel step_panel(std::string title, std::string y_label) {
  Panel p;
  p.title = std::move(title), p.y_label = std::move(y_label), p.x_label = "step";
  p.note = "not in metrics.jsonl";
  return p;
}

FigureFile figure(std::string file, std::string caption, std::vector<Panel> panels,
                  int panel_height = 340) {
  Figure f;
  f.panels = std::move(panels);
  f.panel_height = panel_height;
  return {std::move(file), std::move(caption), render_png(f)};
}

FigureFile loss_figure(const RunData& run) {
  const std::vector<double> x = steps_of(run), loss = column(run, "loss");
  Panel p = step_panel("Loss", "cross-entropy (nats per token)");
  if (run.steps.size() >= kSmoothFrom) {
    Series raw = line("training, per step", x, loss, 0);
    raw.alpha = 0.3, raw.width = 1.2;
    p.series.push_back(raw);
    const size_t half = run.steps.size() / kSmoothFrom;
    p.series.push_back(line("training, mean of " + std::to_string(2 * half + 1) + " steps", x,
                            moving_average(loss, half), 0));
  } else {
    p.series.push_back(line("training", x, loss, 0));
  }
  std::vector<double> vx, vy;
  for (const StepRow& r : run.steps) {
    const double v = r.number("val_loss");
    if (std::isfinite(v)) vx.push_back(double(r.step)), vy.push_back(v);
  }
  if (!vy.empty()) {
    Series val = line("validation", vx, vy, 3);
    val.points = true;
    p.series.push_back(val);
  }
  std::string caption = "Training loss per step";
  caption += vy.empty() ? " (the run did not evaluate: no validation loss)."
                        : " and validation loss at the steps that evaluated.";
  return figure("loss.png", caption, {p});
}

FigureFile lr_figure(const RunData& run) {
  Panel p = step_panel("Learning rate", "learning rate");
  p.series.push_back(line("", steps_of(run), column(run, "lr"), 2));
  p.y_from_zero = true;
  return figure("lr.png", "Learning rate of each step (the scheduler's value).", {p}, 300);
}

FigureFile grad_norm_figure(const RunData& run) {
  Panel p = step_panel("Gradient norm", "global L2 norm");
  p.series.push_back(line("", steps_of(run), column(run, "grad_norm"), 4));
  p.y_from_zero = true;
  return figure("grad_norm.png",
                "Global gradient norm of each step (over every rank's gradients, before "
                "clipping).",
                {p}, 300);
}

FigureFile throughput_figure(const RunData& run) {
  const std::vector<double> x = steps_of(run);
  const std::vector<double> tps = column(run, "tokens_per_s"), mfu = column(run, "mfu", 100.0);
  Panel a = step_panel("Throughput", "tokens/s");
  a.series.push_back(line("per step", x, tps, 0));
  Panel b = step_panel("Model FLOPs utilization", "MFU (%)");
  b.series.push_back(line("per step", x, mfu, 1));
  for (auto [p, v, unit] : {std::tuple{&a, &tps, ""}, std::tuple{&b, &mfu, "%"}}) {
    const double m = median_of(*v);
    if (!std::isfinite(m)) continue;
    Series s = line("median " + fmt(m >= 100 ? "%.0f" : "%.3g", m) + unit, {x.front(), x.back()},
                    {m, m}, 7);
    s.dashed = true, s.width = 1.2;
    p->series.push_back(s);
    p->y_from_zero = true;
  }
  return figure("throughput.png",
                "Tokens per second of the whole job and MFU (model FLOPs over the machine's "
                "peak) per step; the first steps include warm-up.",
                {a, b}, 300);
}

FigureFile memory_figure(const RunData& run) {
  const std::vector<double> x = steps_of(run);
  // MiB, or GiB from 4 GiB a step on.
  double most = 0;
  for (const StepRow& r : run.steps) {
    double total = 0;
    for (int c = 0; c < kNumMemCategories; ++c) {
      const double b = r.number("peak_bytes", mem_category_name(MemCategory(c)));
      total += std::isfinite(b) ? b : 0.0;
    }
    most = std::max(most, total);
  }
  const bool gib = most >= 4.0 * (1 << 30);
  const double unit = gib ? double(1 << 30) : double(1 << 20);
  Panel p = step_panel("Peak memory by category (rank 0)", gib ? "GiB" : "MiB");
  p.stacked = true;
  p.y_from_zero = true;
  size_t color = 0;
  for (int c = 0; c < kNumMemCategories; ++c) {
    const char* name = mem_category_name(MemCategory(c));
    std::vector<double> y;
    bool nonzero = false;
    for (const StepRow& r : run.steps) {
      y.push_back(r.number("peak_bytes", name) / unit);
      nonzero = nonzero || (std::isfinite(y.back()) && y.back() > 0);
    }
    if (nonzero) p.series.push_back(line(name, x, y, color));
    ++color;
  }
  p.note = "no peak_bytes in metrics.jsonl";
  return figure("memory.png",
                "Rank 0's peak bytes per memory category in each step (strata's tracking "
                "allocator), stacked: the top is the sum of the categories' peaks.",
                {p});
}

// One straggler window: its last step and the per-rank seconds per step (empty without them).
struct Window {
  double end = 0;
  std::vector<double> step_s, busy_s;
  double min[2], median[2], max[2];  // per_step: step_s, busy_s
};

std::vector<double> numbers(const nlohmann::json& a) {
  std::vector<double> v;
  if (!a.is_array()) return v;
  for (const nlohmann::json& e : a) v.push_back(e.is_number() ? e.get<double>() : kNaN);
  return v;
}

std::vector<Window> windows_of(const RunData& run) {
  std::vector<Window> out;
  for (const StepRow& r : run.steps) {
    const auto it = r.row.find("stragglers");
    if (it == r.row.end() || !it->is_object()) continue;
    Window w;
    w.end = double(r.step);
    if (const auto pr = it->find("per_rank"); pr != it->end() && pr->is_object()) {
      w.step_s = numbers(pr->value("step_time_s", nlohmann::json()));
      w.busy_s = numbers(pr->value("busy_s", nlohmann::json()));
    }
    const nlohmann::json per_step = it->value("per_step", nlohmann::json::object());
    const char* phases[2] = {"step_s", "busy_s"};
    for (int k = 0; k < 2; ++k) {
      const nlohmann::json ph = per_step.value(phases[k], nlohmann::json::object());
      auto get = [&](const char* key) {
        const auto v = ph.find(key);
        return v != ph.end() && v->is_number() ? v->get<double>() : kNaN;
      };
      w.min[k] = get("min"), w.median[k] = get("median"), w.max[k] = get("max");
    }
    out.push_back(std::move(w));
  }
  return out;
}

int world_size(const RunData& run) {
  if (!run.run) return 0;
  const nlohmann::json layout = run.run->value("layout", nlohmann::json::object());
  const auto it = layout.find("world_size");
  return it != layout.end() && it->is_number_integer() ? it->get<int>() : 0;
}

// Step time and busy time per rank over the straggler windows.
FigureFile rank_figure(const RunData& run) {
  const std::vector<Window> ws = windows_of(run);
  Panel a = step_panel("Step time per rank (average over each straggler window)", "seconds");
  Panel b = step_panel("Busy time per rank (the step less its waits on other ranks)", "seconds");
  a.x_label = b.x_label = "step (end of window)";
  a.y_from_zero = b.y_from_zero = true;
  const int world = world_size(run);
  std::string caption;
  if (ws.empty()) {
    a.note = world == 1 ? "single process: one rank, no per-rank times"
                        : "no straggler windows in metrics.jsonl (one process, "
                          "train.straggler_interval 0, or fewer steps than one window)";
    b.note = a.note;
    caption = "Per-rank step times: " + a.note + ".";
    return figure("rank_times.png", caption, {a}, 240);
  }
  const size_t ranks = ws.back().step_s.size();
  const bool per_rank = ranks > 0 && std::all_of(ws.begin(), ws.end(), [&](const Window& w) {
                          return w.step_s.size() == ranks && w.busy_s.size() == ranks;
                        });
  std::vector<double> x;
  for (const Window& w : ws) x.push_back(w.end);
  for (int k = 0; k < 2; ++k) {
    Panel& p = k == 0 ? a : b;
    auto value = [&](const Window& w, size_t r) { return (k == 0 ? w.step_s : w.busy_s)[r]; };
    if (per_rank && ranks <= kMaxRankLines) {
      for (size_t r = 0; r < ranks; ++r) {
        std::vector<double> y;
        for (const Window& w : ws) y.push_back(value(w, r));
        Series s = line("rank " + std::to_string(r), x, y, r);
        s.points = ws.size() <= kMaxMarkers, s.width = 1.5;
        p.series.push_back(s);
      }
      continue;
    }
    Band band;
    band.label = "min - max over ranks";
    band.color = palette(0);
    std::vector<double> med;
    for (const Window& w : ws) {
      band.x.push_back(w.end), band.lo.push_back(w.min[k]), band.hi.push_back(w.max[k]);
      med.push_back(w.median[k]);
    }
    p.bands.push_back(band);
    Series m = line("median rank", x, med, 0);
    m.points = ws.size() <= kMaxMarkers;
    p.series.push_back(m);
    if (!per_rank) continue;
    // The rank slowest on average over the windows (by busy time: step times are near equal).
    size_t slowest = 0;
    double worst = -1;
    for (size_t r = 0; r < ranks; ++r) {
      double sum = 0;
      for (const Window& w : ws) sum += std::isfinite(w.busy_s[r]) ? w.busy_s[r] : 0.0;
      if (sum > worst) worst = sum, slowest = r;
    }
    std::vector<double> y;
    for (const Window& w : ws) y.push_back(value(w, slowest));
    Series s = line("rank " + std::to_string(slowest) + " (slowest busy)", x, y, 3);
    s.points = ws.size() <= kMaxMarkers;
    p.series.push_back(s);
  }
  if (!per_rank) {
    caption =
        "Min, median and max over the ranks per straggler window (this run's metrics.jsonl "
        "predates the per-rank times).";
  } else if (ranks <= kMaxRankLines) {
    caption =
        "Each rank's seconds per step, averaged over each straggler window "
        "(train.straggler_interval steps); the busy time is the step less its waits on "
        "other ranks, where a straggler shows.";
  } else {
    caption = "Over " + std::to_string(ranks) +
              " ranks: the min-max band, the median rank and the rank slowest in busy time on "
              "average, per straggler window.";
  }
  return figure("rank_times.png", caption, {a, b}, 300);
}

}  // namespace

// A mixture of experts' routing (metrics.jsonl's expert_tokens): each MoE layer's busiest expert
// over the mean per step (1: balanced; the number of experts over top_k: all tokens on top_k
// experts), and the last step's tokens per expert. Absent for a dense model.
std::optional<FigureFile> expert_load_figure(const RunData& run) {
  std::vector<std::string> layers;
  for (const StepRow& r : run.steps) {
    const auto it = r.row.find("expert_tokens");
    if (it == r.row.end() || !it->is_object()) continue;
    for (const auto& [layer, tokens] : it->items()) {
      if (std::find(layers.begin(), layers.end(), layer) == layers.end()) layers.push_back(layer);
    }
  }
  if (layers.empty()) return std::nullopt;
  std::sort(layers.begin(), layers.end(),
            [](const std::string& a, const std::string& b) { return std::stoi(a) < std::stoi(b); });
  Panel load = step_panel("Expert load", "busiest expert / mean");
  load.y_from_zero = true;
  Panel last = step_panel("Tokens per expert, last step", "tokens routed");
  last.x_label = "expert";
  last.y_from_zero = true;
  const nlohmann::json* final_row = nullptr;
  for (const StepRow& r : run.steps) {
    if (r.row.contains("expert_tokens")) final_row = &r.row["expert_tokens"];
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<double> x, y;
    for (const StepRow& r : run.steps) {
      const nlohmann::json* t = r.row.contains("expert_tokens") ? &r.row["expert_tokens"] : nullptr;
      double sum = 0, most = 0, n = 0;
      if (t != nullptr && t->contains(layers[i]) && (*t)[layers[i]].is_array()) {
        for (const nlohmann::json& v : (*t)[layers[i]]) {
          const double d = v.is_number() ? v.get<double>() : 0.0;
          sum += d, most = std::max(most, d), n += 1;
        }
      }
      x.push_back(double(r.step));
      y.push_back(sum > 0 ? most * n / sum : kNaN);
    }
    load.series.push_back(line("layer " + layers[i], x, y, i));
    std::vector<double> ex, ey;
    if (final_row != nullptr && final_row->contains(layers[i])) {
      for (const nlohmann::json& v : (*final_row)[layers[i]]) {
        ex.push_back(double(ex.size()));
        ey.push_back(v.is_number() ? v.get<double>() : kNaN);
      }
    }
    Series s = line("layer " + layers[i], ex, ey, i);
    s.points = true;
    last.series.push_back(s);
  }
  return figure("expert_load.png",
                "Routing of the mixture of experts: each MoE layer's busiest expert over the mean "
                "expert per step (1 is balanced), and the tokens each expert took in the last "
                "step.",
                {load, last});
}

std::vector<FigureFile> make_figures(const RunData& run) {
  std::vector<FigureFile> out;
  out.push_back(loss_figure(run));
  out.push_back(throughput_figure(run));
  out.push_back(lr_figure(run));
  out.push_back(grad_norm_figure(run));
  out.push_back(memory_figure(run));
  out.push_back(rank_figure(run));
  if (std::optional<FigureFile> f = expert_load_figure(run)) out.push_back(std::move(*f));
  return out;
}

}  // namespace strata::report
