// The optimizer, LR-schedule and loss-scaling blocks of the config, with DeepSpeed's defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct OptimizerConfig {
  std::string type = "adamw";  // "adam" | "adamw" | "sgd" (lower-cased)
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;  // adamw: decoupled; adam: L2 added to the gradient
  bool adam_w_mode = true;     // DeepSpeed's "adam" with adam_w_mode true behaves as AdamW
  float momentum = 0.0f;       // sgd
  bool nesterov = false;       // sgd
  // optimizer.weight_decay_exclude: the parameter groups weight decay does not apply to, of
  // "bias" (linear layers' biases), "norm" (norm gains and biases), "embedding" (token and
  // position embeddings). Megatron's default: biases and norm gains; matrices always decay.
  std::vector<std::string> weight_decay_exclude = {"bias", "norm"};
};

struct SchedulerConfig {
  std::string type;  // "" (constant lr) | "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"
  float warmup_min_lr = 0.0f, warmup_max_lr = 1e-3f;  // WarmupLR / WarmupDecayLR
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR (required there)
  float cos_min_ratio = 1e-4f, warmup_min_ratio = 0.0f;  // WarmupCosineLR
};

struct Fp16Config {
  bool enabled = false;
  float loss_scale = 0.0f;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  float min_loss_scale = 1.0f;
};

}  // namespace strata
