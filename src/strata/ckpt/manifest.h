// A checkpoint's manifest.json (DESIGN.md §7): the format version, the model and the training
// state, the layout it was saved from, the global shape of every tensor, and for each stored
// chunk its file, byte offset, fp32 element count, CRC-32C and the global indices its elements
// go to. Parsing validates everything a loader relies on (types, ranges, bounds against the
// files' sizes and the tensors' shapes), so a hostile or damaged manifest is an InputError,
// never a crash or a read out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/ckpt/slices.h"
#include "strata/model/model_config.h"

namespace strata::ckpt {

inline constexpr int kFormatVersion = 1;

// What is stored per parameter element: the fp32 master weights (the parameters themselves in
// fp32 training) and the optimizer's moments.
inline constexpr const char* kMaster = "master";
inline constexpr const char* kExpAvg = "exp_avg";       // Adam's first moment
inline constexpr const char* kExpAvgSq = "exp_avg_sq";  // Adam's second moment
inline constexpr const char* kMomentum = "momentum";    // SGD's momentum buffer
bool known_kind(const std::string& kind);

struct Chunk {
  std::string kind, tensor;
  int file = 0;           // index into Manifest::files
  int64_t offset = 0;     // bytes from the file's start
  int64_t numel = 0;      // fp32 elements
  uint32_t crc32c = 0;    // of the chunk's bytes
  std::vector<Run> runs;  // where its elements go in the global tensor, in order
};

struct ScalerState {
  float scale = 1.0f;
  int64_t iter = 0, last_overflow_iter = -1;
  int hysteresis_left = 1;
};

struct Manifest {
  int format = kFormatVersion;
  ModelConfig model;
  std::string optimizer;        // optimizer.type: which moments exist
  int64_t step = 0;             // optimizer steps attempted (the engine's step)
  int64_t optimizer_steps = 0;  // steps the optimizer took (skipped fp16 steps excluded)
  int64_t consumed_samples = 0;
  uint64_t seed = 0;  // train.seed: the sampler's and initialisation's
  ScalerState scaler;
  std::string layout;  // the layout it was saved from, in words ("dp 2 x tp 2 x pp 2, …")
  // The sigmoid router's expert bias (model.moe.router "sigmoid"), by MoE layer: state that is not
  // a parameter (no optimizer moments), the same on every rank. Empty for other models.
  std::map<int, std::vector<float>> expert_bias;
  std::map<std::string, std::vector<int64_t>> tensors;  // global shapes by parameter name
  struct File {
    std::string name;
    int64_t bytes = 0;
  };
  std::vector<File> files;
  std::vector<Chunk> chunks;
};

std::string to_json(const Manifest& m);
// what: the file, for messages.
Manifest parse_manifest(const std::string& text, const std::string& what);

// The model fields that must agree for a checkpoint to load (every tensor's shape follows).
// Returns "" when they do, else what differs ("hidden 512 in the checkpoint, 768 here").
std::string model_difference(const ModelConfig& saved, const ModelConfig& here);

}  // namespace strata::ckpt
