// Where memory lives and kernels run (DESIGN.md §10): the host CPU, or a CUDA device.
#pragma once

#include <cstdint>

namespace strata {

enum class Device : uint8_t { CPU, CUDA };

const char* device_name(Device d);  // "cpu" | "cuda"

// The device this process computes on (one process, one device: a rank per GPU): where a Buffer
// and a Tensor live unless told otherwise. The CPU until a run on a GPU selects it (the engine,
// after ops::init_device); tests that hold views on both devices name each view's device.
Device default_device();
void set_default_device(Device d);

}  // namespace strata
