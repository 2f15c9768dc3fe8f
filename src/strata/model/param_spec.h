// Every parameter of a model, named globally, grouped into units: the pieces ZeRO gathers and
// reduces one at a time. A unit's parameters are contiguous in one flat buffer, in the order
// listed here, so a collective or a ZeRO partition is a flat range. Each block is two units (its
// attention and its MLP sublayer); the (V, C) vocabulary matrices (token embedding, untied output
// projection) are cut into units of whole rows no larger than the largest sublayer, so no buffer
// sized by a unit is ever sized by the vocabulary. Initialisation is a pure function of
// (seed, parameter name, element index): any shard can generate exactly its slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/model/model_config.h"

namespace strata {

enum class InitKind : uint8_t { Normal, Zeros, Ones };

// What a parameter is to the model: names are the checkpoint's (written once, in param_spec.cc);
// the model binds parameters by role.
enum class ParamRole : uint8_t {
  TokenEmbedding,     // (V, C)
  PositionEmbedding,  // (maxT, C)
  Norm1W,
  Norm1B,
  QkvW,  // (QKV, C)
  QkvB,
  ProjW,  // (C, NH·HD)
  ProjB,
  Norm2W,
  Norm2B,
  FcW,  // (F, C) gpt2; (2F, C) llama gate|up
  FcB,
  Fc2W,  // (C, F)
  Fc2B,
  FinalNormW,
  FinalNormB,
  OutputW,  // (V, C) untied output projection
};
constexpr int kNumParamRoles = int(ParamRole::OutputW) + 1;

struct ParamSpec {
  std::string name;            // global name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // global shape, weights [out_features, in_features]
  ParamRole role = ParamRole::TokenEmbedding;
  int layer = -1;  // block parameters: the layer
  InitKind init = InitKind::Normal;
  float std = 0.02f;   // for Normal
  bool decay = true;   // weight decay applies (matrices yes; biases and norm gains no)
  int64_t offset = 0;  // element offset in the model's flat buffer
  int64_t numel() const;
};

// Units in flat-buffer order: Vocab pieces, Position (gpt2), then per layer Attention and Mlp,
// then FinalNorm and (untied) Output pieces.
enum class UnitKind : uint8_t { Vocab, Position, Attention, Mlp, FinalNorm, Output };

struct UnitSpec {
  std::string name;               // "embedding.0", "position", "block.3.attn", "block.3.mlp",
                                  // "final_norm", "output.0"
  int64_t offset = 0, numel = 0;  // the unit's range in the flat buffer, padding included
  std::vector<int> params;        // indices into ModelSpec::params (a vocabulary matrix spans
                                  // several units)
  UnitKind kind = UnitKind::Vocab;
  int layer = -1;                      // Attention/Mlp: the block
  int64_t row_begin = 0, row_end = 0;  // Vocab/Output: the matrix rows the unit holds
};

struct ModelSpec {
  ModelConfig config;
  std::vector<ParamSpec> params;
  std::vector<UnitSpec> units;
  int64_t numel = 0;        // elements of the flat buffer, padding included
  int64_t param_numel = 0;  // parameter count (numel without padding)
  int64_t align = 1;        // every unit's numel is a multiple of this
  const ParamSpec& param(const std::string& name) const;  // throws if absent
  // Indices into units of each kind, in flat order.
  std::vector<int> units_of(UnitKind kind) const;
};

// align: every unit is padded at its end with unused elements (zero, never initialised or
// updated) up to a multiple of align, so that ZeRO can split each unit into `align` equal
// contiguous chunks (align = the data-parallel size). align 1 is the unpadded layout. A vocabulary
// piece holds a multiple of 8 rows (and of align/gcd(align, C), so that no padding falls inside
// the matrix); the pieces are the same for every power-of-two align when C is a multiple of 8.
ModelSpec build_model_spec(const ModelConfig& m, int64_t align = 1);

// Writes elements [begin, begin+count) of parameter `p`'s initial value (flattened row-major).
void init_param_slice(float* out, const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count);

// Matmul FLOPs of one training step (forward + backward) per token, the peers' convention:
// 6·N + 12·L·C·T with N all parameters (padding excluded) (as ../peers counts, so MFU figures
// compare).
double train_flops_per_token(const ModelSpec& spec);

}  // namespace strata
