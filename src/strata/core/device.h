// Where memory lives and kernels run (DESIGN.md §10): the host CPU, or a CUDA device.
#pragma once

#include <cstdint>

namespace strata {

enum class Device : uint8_t { CPU, CUDA };

}  // namespace strata
