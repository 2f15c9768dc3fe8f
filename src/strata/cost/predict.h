// The memory and communication model of a layout (DESIGN.md §4, §5): the bytes of model states
// a rank holds and the bytes its tensor-parallel collectives put on the wire, from the layout and
// this rank's ModelSpec alone, before anything is allocated or sent. The tests hold the engine's
// measured figures to them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/core/memory.h"
#include "strata/cost/layout.h"
#include "strata/model/param_spec.h"

namespace strata::cost {

// Per-rank bytes of each memory category the model states take (params, master, grads,
// optimizer state) for the layout's ZeRO stage partitioned over shard ranks (shard 0: ZeRO is
// not in effect, e.g. one process without a data-parallel group: stage 0); what the tracker
// reads after the engine is built. `formula` is the ZeRO paper's figure for the same dtypes with
// Ψ = the padded parameter count; `buffers` what ZeRO adds beyond it (per-unit gradient buffers,
// gathered-unit buffers, persistent units).
struct MemoryPrediction {
  std::array<size_t, kNumMemCategories> bytes{};
  size_t model_states = 0, formula = 0, buffers = 0;
};
MemoryPrediction predict_memory(const Layout& l, const ModelSpec& spec, int shard);
std::string describe_memory(const MemoryPrediction& m);

// An input error when the predicted model states of the host's l.local_ranks ranks exceed its
// physical memory.
void check_fits_in_memory(const Layout& l, const ModelSpec& spec, int shard);

// Bytes one rank of a tensor-parallel group puts on the wire in one training step (as
// Communicator::wire_bytes counts them), from the model's collectives: per micro-batch, without
// sequence parallelism 2 all-reduces of the (B·T, C) activations per block forward and 2 in
// backward, the embedding's all-reduce and the head's (fp32) one; with it, an all-gather and a
// reduce-scatter per sublayer forward, two all-gathers (the output gradient, the input re-gathered
// for the weight gradient) and a reduce-scatter per sublayer backward, and the all-reduces of the
// replicated parameters' partial gradients; the vocabulary-parallel cross-entropy's two
// reductions; the gradient norm's; each fully recomputed block's forward collectives again (and
// its partitioned checkpoint's all-gather). 0 at tp = 1. Without pipeline parallelism (a stage's
// blocks and the pipeline transfers' re-gathering are not counted).
uint64_t predict_tp_bytes(const Layout& l, const ModelSpec& spec);

}  // namespace strata::cost
