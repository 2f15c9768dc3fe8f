#include "strata/monitor/monitors.h"

#include <chrono>
#include <cmath>
#include <filesystem>

namespace strata {

std::string monitor_dir(const MonitorConfig& m, const std::string& run_dir) {
  const std::filesystem::path base = m.output_path.empty() ? run_dir : m.output_path;
  return (base / m.job_name).string();
}

monitor::Scalars step_scalars(const StepMetrics& s, double peak_gflops,
                              std::optional<double> val_loss) {
  const std::string p = "Train/Samples/";
  monitor::Scalars v = {{p + "train_loss", s.loss},
                        {p + "lr", s.lr},
                        {p + "loss_scale", s.loss_scale},
                        {p + "grad_norm", s.grad_norm}};
  if (s.moe_aux_loss >= 0) v.push_back({p + "moe_aux_loss", s.moe_aux_loss});
  if (s.moe_dropped >= 0) v.push_back({p + "moe_dropped", s.moe_dropped});
  // Each MoE layer's load: its busiest expert's tokens over the mean, and each expert's tokens.
  for (size_t i = 0; i < s.expert_layers.size(); ++i) {
    const std::string layer = p + "moe/layer_" + std::to_string(s.expert_layers[i]) + "/";
    const auto row = s.expert_tokens.subspan(i * size_t(s.experts), size_t(s.experts));
    double sum = 0, most = 0;
    for (size_t e = 0; e < row.size(); ++e) {
      sum += row[e], most = std::max(most, row[e]);
      v.push_back({layer + "expert_" + std::to_string(e) + "_tokens", row[e]});
    }
    if (sum > 0) v.push_back({layer + "max_over_mean", most * double(row.size()) / sum});
  }
  if (val_loss) {
    v.push_back({p + "val_loss", *val_loss});
    v.push_back({p + "val_ppl", std::exp(*val_loss)});
  }
  v.push_back({p + "tokens_per_s", s.tokens_per_s});
  v.push_back({p + "trained_tokens_per_s", s.trained_tokens_per_s});
  if (peak_gflops > 0 && s.seconds > 0) {
    v.push_back({p + "mfu", s.flops / s.seconds / 1e9 / peak_gflops});
  }
  v.push_back({p + "step_time_s", s.seconds});
  v.push_back({p + "comm_exposed_s", s.comm_exposed_s});
  v.push_back({p + "gather_exposed_s", s.gather_exposed_s});
  v.push_back({p + "tp_comm_s", s.tp_comm_s});
  if (s.ep_comm_s >= 0) v.push_back({p + "ep_comm_s", s.ep_comm_s});
  for (int c = 0; c < kNumMemCategories; ++c) {
    v.push_back({p + "memory/" + mem_category_name(MemCategory(c)) + "_bytes",
                 double(s.peak_bytes[size_t(c)])});
  }
  return v;
}

RunMonitors::RunMonitors(const Config& cfg, int64_t resumed_samples) {
  if (cfg.tensorboard.enabled) {
    // START just past the samples a resumed run keeps (a fresh run: past none): TensorBoard
    // drops what earlier files logged from there on, as metrics.jsonl and the CSV files do.
    tb_ = std::make_unique<monitor::TensorBoardWriter>(
        monitor_dir(cfg.tensorboard, cfg.train.run_dir), resumed_samples + 1);
  }
  if (cfg.csv_monitor.enabled) {
    csv_ = std::make_unique<monitor::CsvMonitor>(monitor_dir(cfg.csv_monitor, cfg.train.run_dir),
                                                 resumed_samples);
  }
}

void RunMonitors::write(const StepMetrics& s, int64_t samples, double peak_gflops,
                        std::optional<double> val_loss) {
  if (!any()) return;
  const monitor::Scalars v = step_scalars(s, peak_gflops, val_loss);
  if (tb_) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    tb_->write(samples, v, now);
    tb_->flush();
  }
  if (csv_) csv_->write(samples, v);
}

std::string RunMonitors::describe() const {
  std::string r;
  if (tb_) r += "tensorboard: " + tb_->path();
  if (csv_) r += std::string(r.empty() ? "" : ", ") + "csv_monitor: " + csv_->dir();
  return r;
}

}  // namespace strata
