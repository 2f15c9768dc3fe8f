// Cutting a model's units (param_spec.h) into pipeline model chunks: stages × virtual stages of
// them, global chunk g on stage g % p (schedule.h). A chunk holds whole blocks (a block's attention
// and MLP units stay together); the vocabulary and position units go with the first global chunk,
// the final norm and the output units with the last.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/model/param_spec.h"

namespace strata::pipeline {

enum class PartitionMethod : uint8_t {
  Uniform,     // blocks evenly; the remainder one each to the middle chunks, then the first
  Parameters,  // balance the parameters held (the embedding on the first; the output, or with tied
               // embeddings the vocabulary's copy, on the last)
  Time,        // balance estimated forward FLOPs per sequence (chunk_flops)
  Explicit,    // the number of blocks of each chunk, given
};

// "uniform" | "parameters" | "time" | "explicit"; InputError naming parallelism.partition and the
// valid values otherwise.
PartitionMethod parse_partition(std::string_view name);
const char* partition_name(PartitionMethod m);

struct StagePlan {
  std::vector<std::pair<int, int>> chunks;  // per global chunk: unit range [begin, end) in units
  std::vector<int> layers_begin;            // per global chunk: its first block
  std::vector<int> blocks;                  // per global chunk: how many blocks it holds
  std::vector<int64_t> params;              // per global chunk: elements of its units (this rank's)
  std::vector<double> flops;  // per global chunk: estimated forward FLOPs per sequence
};

// Forward FLOPs of one sequence of model.seq_len tokens T on this tensor-parallel rank: 2·numel·T
// per attention, MLP and final-norm unit, plus 4·T²·(heads held·head dim) per block's attention
// scores and values, plus the logits 2·(vocabulary rows held)·C·T on the head (tied or not). The
// vocabulary and position units are lookups and count 0.
struct UnitFlops {
  std::vector<double> block;  // per block
  double embedding = 0, head = 0;
};
UnitFlops unit_flops(const ModelSpec& spec);

// chunks = stages × virtual stages. Uniform, Parameters and Time give every chunk at least one
// block: more chunks than blocks is an InputError naming parallelism.pipeline and
// parallelism.virtual_stages. Parameters and Time split the blocks contiguously minimising the
// largest chunk's cost (exactly, by dynamic programming), then, among those splits, the sum of
// squared chunk costs; the embedding's cost is added to the first chunk, the head's to the last.
// Explicit: explicit_blocks has one count per global chunk, summing to model.layers; the first and
// the last chunk may hold 0 blocks (the embedding, resp. the head, alone), every other at least 1.
// Errors name parallelism.partition and what to change.
StagePlan partition(const ModelSpec& spec, int chunks, PartitionMethod method,
                    const std::vector<int>& explicit_blocks = {});

}  // namespace strata::pipeline
