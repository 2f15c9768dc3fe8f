// The rotary embedding's frequencies of a model's layer, from its RoPE settings, as transformers
// computes them (modeling_rope_utils.py: the default, linear, llama3 and yarn types).
#pragma once

#include "strata/kernels/ops.h"
#include "strata/model/model_config.h"

namespace strata {

// The frequencies RoPE uses on every layer that applies it (ModelConfig::rope): over all of the
// head's hd values, base m.rope_theta, scaled by m.rope_scaling.
ops::Rope rope_table(const ModelConfig& m);

}  // namespace strata
