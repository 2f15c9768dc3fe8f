// strata bench --calibrate: this machine measured into the device profile the layout planner
// divides by (device_profile.h); calibrate.cc says what is timed and how.
#pragma once

#include <optional>
#include <string>

#include "strata/model/model_config.h"

namespace strata::planner {

// Before half a minute of measuring: `path` (given as `flag`, for the messages) must be a file
// whose directory exists or can be made; an InputError naming it otherwise.
void check_profile_output(const std::string& path, const char* flag);

// Every rank of the job takes part; rank 0 writes the profile to `output`. `model`: the model
// whose shapes the GEMM curve and the block kernels follow (none: generic Transformer shapes).
// `device` "cuda" is an InputError for now.
void run_calibrate(const std::string& output, const std::optional<ModelConfig>& model,
                   const std::string& device);

}  // namespace strata::planner
