// Which parameters weight decay applies to (optimizer.weight_decay_exclude), as Megatron-LM's
// get_param_groups decides by default: every matrix decays (the attention, MLP and output
// projections, and the token and position embeddings); biases and norm gains (1-D) do not.
// The decision is per parameter, so it holds in every layout: a ZeRO partition that cuts across
// parameters steps each piece with its parameter's flag (ParamRange::decay).
#pragma once

#include <string>

#include "strata/model/param_spec.h"
#include "strata/optim/optim_config.h"

namespace strata {

// The group a parameter belongs to: "weight", "bias", "norm" or "embedding".
const char* weight_decay_group(ParamRole role);
// Whether weight decay applies to a parameter of that role under the config.
bool weight_decay_applies(const OptimizerConfig& o, ParamRole role);
// Sets every parameter's decay flag from the config.
void set_weight_decay(const OptimizerConfig& o, ModelSpec& spec);
// The start-up line: "weight decay 0.01 on N parameters (...), not on M (...)"; "" when the
// weight decay is 0. spec: the whole model (no tensor or pipeline split).
std::string weight_decay_summary(const OptimizerConfig& o, const ModelSpec& spec);

}  // namespace strata
