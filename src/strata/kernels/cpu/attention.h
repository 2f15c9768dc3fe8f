// Causal self-attention, multi-head and grouped-query, scale 1/sqrt(hd) unless AttentionScores
// says otherwise. S: storage type (float, bf16, f16). The four products per direction go through
// the strided batched matmul (oneDNN), reading q, k and v in place inside qkv; softmax runs in
// fp32 between them.
// For bf16/f16 the pre-softmax scores are rounded to S in `att` before the softmax, as PyTorch's
// eager attention under autocast does.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "strata/core/dtype.h"

namespace strata::kernels {

// The CPU's two attention paths: tiled (attention_tiled.h: keeps each query row's log-sum-exp,
// memory linear in T) and materialized (this file: keeps the probabilities (B,NH,T,T)).
enum class AttentionPath { Tiled, Materialized };

// The path every CPU attention call of sequence length T on storage type `act` takes; what
// ops::attention_saved sizes and what the forward and backward run all follow it.
// STRATA_ATTENTION=tiled|materialized in the environment decides for every call; unset, the
// default is the faster path as measured (attention.cc gives the numbers).
AttentionPath attention_path(int T, DType act);
// Forces a path for this process from now on (tests); nullopt goes back to the environment's or
// the default. Buffers sized before the change no longer match (the ops' checks say so).
void set_attention_path(std::optional<AttentionPath> path);
const char* attention_path_name(AttentionPath path);  // "tiled" | "materialized"

// What a model family changes in how the scores are formed and which keys a query sees (every CPU
// attention kernel takes one; ops::AttentionShape's scale, softcap, window and pos). The defaults
// are plain causal attention with scale 1/sqrt(hd), bit for bit.
struct AttentionScores {
  float scale = 0.0f;    // scores q·k times this; 0: 1/sqrt(hd)
  float softcap = 0.0f;  // > 0: a score s becomes softcap·tanh(s/softcap), before the mask
  // > 0: the query at position i sees the keys at positions j with i − window < j (as well as
  // j ≤ i, the causal mask, which is on rows); 0: every earlier key.
  int window = 0;
  // The positions of a sequence's rows, increasing; nullptr: row t is position t. The ring's
  // blocks (attention_ring.h) read pos for the rows of qkv and kv_pos for the rows of kv.
  const int32_t* pos = nullptr;
  const int32_t* kv_pos = nullptr;
  // Document masking, or nullptr: (B, seq) of each sequence b's document starts by absolute
  // position p (ops::AttentionShape::doc_begin): the query at p sees only keys at positions
  // >= doc_begin[b·seq + p], as well as the rules above. seq: the whole sequence's length.
  const int32_t* doc_begin = nullptr;
  int seq = 0;
  float scale_for(int hd) const { return scale != 0.0f ? scale : 1.0f / std::sqrt(float(hd)); }
  // Sequence b's document starts by position (seq of them), or nullptr: one document.
  const int32_t* docs(int b) const {
    return doc_begin != nullptr ? doc_begin + int64_t(b) * seq : nullptr;
  }
};

// qkv (B,T,KVH·(rep+2)·hd) in the grouped layout, rep = NH/KVH query heads per kv head: per row,
// for each kv group g, the group's rep query heads, then its key head, then its value head.
// out (B,T,NH·hd) with query heads in order h = g·rep + r; att (B,NH,T,T) softmax probabilities
// saved for backward (masked part 0). NH must be a multiple of KVH. A softcap caps the scores in
// `att` (in S) before the softmax. out nullptr: the probabilities only.
template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int B, int T, int NH, int KVH, int hd,
                       const AttentionScores& sc = {});

// Floats of scratch attention_backward needs (with a softcap, the recomputed raw scores as well).
size_t attention_backward_scratch_floats(int B, int T, int NH, int KVH, int hd,
                                         const AttentionScores& sc = {});

// dqkv (B,T,KVH·(rep+2)·hd) written; scratch (attention_backward_scratch_floats); dout
// (B,T,NH*hd); qkv and att as in (and from) the forward.
template <typename S>
void attention_backward(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, int B,
                        int T, int NH, int KVH, int hd, const AttentionScores& sc = {});

}  // namespace strata::kernels
