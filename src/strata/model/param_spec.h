// Every parameter of a model, named globally, grouped into units (embedding, one per block,
// head). A unit's parameters are contiguous in one flat buffer, in the order listed here, so a
// collective or a ZeRO partition is a flat range. Initialisation is a pure function of
// (seed, parameter name, element index): any shard can generate exactly its slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/model/model_config.h"

namespace strata {

enum class InitKind : uint8_t { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;            // global name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // global shape, weights [out_features, in_features]
  InitKind init = InitKind::Normal;
  float std = 0.02f;   // for Normal
  bool decay = true;   // weight decay applies (matrices yes; biases and norm gains no)
  int64_t offset = 0;  // element offset in the model's flat buffer
  int64_t numel() const;
};

struct UnitSpec {
  std::string name;               // "embedding", "block.3", "head"
  int64_t offset = 0, numel = 0;  // the unit's range in the flat buffer, padding included
  std::vector<int> params;        // indices into ModelSpec::params
};

struct ModelSpec {
  ModelConfig config;
  std::vector<ParamSpec> params;
  std::vector<UnitSpec> units;
  int64_t numel = 0;        // elements of the flat buffer, padding included
  int64_t param_numel = 0;  // parameter count (numel without padding)
  int64_t align = 1;        // every unit's numel is a multiple of this
  const ParamSpec& param(const std::string& name) const;  // throws if absent
};

// align: every unit is padded at its end with unused elements (zero, never initialised or
// updated) up to a multiple of align, so that ZeRO can split each unit into `align` equal
// contiguous chunks (align = the data-parallel size). align 1 is the unpadded layout.
ModelSpec build_model_spec(const ModelConfig& m, int64_t align = 1);

// Writes elements [begin, begin+count) of parameter `p`'s initial value (flattened row-major).
void init_param_slice(float* out, const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count);

// Matmul FLOPs of one training step (forward + backward) per token, the peers' convention:
// 6·N + 12·L·C·T with N all parameters (padding excluded) (as ../peers counts, so MFU figures
// compare).
double train_flops_per_token(const ModelSpec& spec);

}  // namespace strata
