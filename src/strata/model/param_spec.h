// Every parameter of a model, named globally, grouped into units: the pieces ZeRO gathers and
// reduces one at a time. A unit's parameters are contiguous in one flat buffer, in the order
// listed here, so a collective or a ZeRO partition is a flat range. Each block is two units (its
// attention and its MLP sublayer); the (V, C) vocabulary matrices (token embedding, untied output
// projection) are cut into units of whole rows no larger than the largest sublayer, so no buffer
// sized by a unit is ever sized by the vocabulary. Initialisation is a pure function of
// (seed, parameter name, element index): any shard can generate exactly its slice.
//
// Tensor parallelism (Megatron's layout, ../shared/reference/megatron.md §1). A spec is built for
// one rank of a tensor-parallel group: every parameter keeps its global name and shape and says
// which slice of it the rank holds (split axis and the global index ranges along it); the flat
// buffer holds only those slices. QKV and the MLP's up (gate|up) are split by output rows
// (column-parallel), the attention output and the MLP's down projection by input columns
// (row-parallel), the (V, C) vocabulary matrices by rows (vocab-parallel, the vocabulary padded to
// a multiple of tp with rows that are zero, never trained and never counted); norms, the position
// table and the row-parallel biases are replicated. The fused weights are laid out so that a rank's
// slice is one contiguous block of rows for every tp:
//   QKV rows, per key/value group g: its rep = heads/kv_heads query heads, its key head, its value
//     head (hd rows each). With kv_heads >= tp a rank holds kv_heads/tp whole groups; with fewer
//     it holds heads/tp query heads of one group plus that group's key and value heads, which
//     tp/kv_heads ranks then hold alike (their gradients are summed over those ranks).
//   llama's gate|up rows interleave: row 2f is gate f, row 2f+1 is up f; so do each expert's, the
//     experts' blocks of 2F rows one after another, each split over tp as a dense MLP's is.
// Initial values are drawn at the element's index in the canonical (Hugging Face) layout — QKV as
// [all queries | all keys | all values], gate|up as [gate | up] — so neither the fused layout nor
// tp changes a weight.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/tensor.h"
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
  OutputW,        // (V, C) untied output projection
  QNormW,         // the query heads' RMSNorm gain: (hd), qk_norm "head"; (heads·hd), "whole"
  KNormW,         // the key heads': (hd) or (kv_heads·hd)
  PostAttnNormW,  // (C) the norm of the attention's output (norm_placement sandwich, post)
  PostMlpNormW,   // (C) the norm of the MLP's output
  // A mixture-of-experts MLP (model_config.h MoeConfig; E experts of F units, a shared one of Fs):
  RouterW,        // (E, C)
  ExpertGateUpW,  // (E·2F, C) each expert's gate|up rows interleaved, expert after expert
  ExpertDownW,    // (E·C, F) each expert's down projection, expert after expert
  SharedFcW,      // (2Fs, C) the shared expert's gate|up, interleaved
  SharedFc2W,     // (C, Fs)
  SharedGateW,    // (1, C) the shared expert's sigmoid gate
};
constexpr int kNumParamRoles = int(ParamRole::SharedGateW) + 1;

// The fused weights whose rows are not in the canonical order (see above).
enum class Fused : uint8_t { None, Qkv, GateUp };

// Global indices [begin, begin + count) along a parameter's split axis held by this rank, and how
// many ranks of the tensor-parallel group hold them (1: split; > 1: replicated, e.g. the key and
// value heads of a group when kv_heads < tp).
struct TpRange {
  int64_t begin = 0, count = 0;
  int replicas = 1;
};

struct ParamSpec {
  std::string name;                   // global name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;         // this rank's shape, weights [out_features, in_features]
  std::vector<int64_t> global_shape;  // the whole tensor's shape
  // -1: the whole tensor on every rank of the group (replicated); 0 or 1: split along that axis,
  // the rank holding `ranges` in local order. Local indices along the axis past the ranges' total
  // are padding (the vocabulary's).
  int split_axis = -1;
  std::vector<TpRange> ranges;
  // split_axis 1 of the routed experts' down projection under expert parallelism: the rank holds
  // shape[0] consecutive global rows from row0 (its experts'); 0 and every row elsewhere.
  int64_t row0 = 0;
  int replicas = 1;  // split_axis -1: the ranks holding the whole tensor (the tp size)
  Fused fused = Fused::None;
  std::array<int64_t, 3> fused_dims{};  // Qkv: heads, kv_heads, hd; GateUp: ffn_hidden, experts
                                        // (0: one MLP's)
  bool held = true;  // false: on another pipeline stage (no elements in this flat buffer)
  ParamRole role = ParamRole::TokenEmbedding;
  int layer = -1;  // block parameters: the layer
  InitKind init = InitKind::Normal;
  float std = 0.02f;   // for Normal
  bool decay = true;   // weight decay applies (matrices yes; biases and norm gains no)
  int64_t offset = 0;  // element offset in the model's flat buffer
  int64_t numel() const;
};

// Units in flat-buffer order: Vocab pieces, Position (gpt2), then per layer Attention and Mlp
// (and Experts after a MoE layer's Mlp), then FinalNorm and (untied) Output pieces. A MoE layer's
// Mlp unit holds its norm, router and shared expert; its Experts unit the routed experts this
// rank holds, which expert parallelism places on different ranks (ZeRO reduces and shards it
// over the expert-data-parallel group).
enum class UnitKind : uint8_t { Vocab, Position, Attention, Mlp, Experts, FinalNorm, Output };

struct UnitSpec {
  std::string name;               // "embedding.0", "position", "block.3.attn", "block.3.mlp",
                                  // "block.3.experts", "final_norm", "output.0"
  int64_t offset = 0, numel = 0;  // the unit's range in the flat buffer, padding included
  std::vector<int> params;        // indices into ModelSpec::params (a vocabulary matrix spans
                                  // several units)
  UnitKind kind = UnitKind::Vocab;
  int layer = -1;                      // Attention/Mlp/Experts: the block
  int64_t row_begin = 0, row_end = 0;  // Vocab/Output: the matrix rows the unit holds
  bool held = true;                    // false: on another pipeline stage (numel 0 here)
};

// This rank's place in the tensor-parallel group and the model's local dimensions there.
struct TpLayout {
  int size = 1, rank = 0;
  int heads = 0;               // query heads held here (heads / tp)
  int groups = 0, rep = 0;     // key/value groups held here and query heads per group held here
  int64_t qkv_rows = 0;        // groups·(rep+2)·hd
  int64_t ffn = 0;             // ffn_hidden / tp
  int64_t vocab_padded = 0;    // vocab rounded up to a multiple of tp
  int64_t vocab_rows = 0;      // vocab_padded / tp: rows of each vocabulary matrix held here
  int64_t vocab_begin = 0;     // global id of the first row held here
  int64_t vocab_valid = 0;     // rows held here that exist (the rest are padding)
  bool kv_replicated = false;  // kv_heads < tp
};

// This rank's place in the expert-parallel group (parallelism.expert) and the routed experts it
// holds: `experts` of them from global expert `first`.
struct ExpertLayout {
  int size = 1, rank = 0;
  int64_t experts = 0, first = 0;
  // The dispatch (config.h ParallelismConfig::expert_dispatch): all-gather, or all-to-all.
  bool all_gather = false;
  bool overlap = false;  // ParallelismConfig::expert_overlap
  // Whole experts beside tensor parallelism (expert_tensor 1, tp > 1): each expert unsplit, the
  // group drawn from the stage's tp × dp × cp ranks, each rank routing its own sequence-parallel
  // rows; otherwise each expert is split over tp as a dense MLP is.
  bool whole = false;
};

struct ModelSpec {
  ModelConfig config;
  TpLayout tp;
  ExpertLayout ep;
  std::vector<ParamSpec> params;
  std::vector<UnitSpec> units;
  int64_t numel = 0;               // elements of the flat buffer, padding included
  int64_t param_numel = 0;         // parameter elements held here (numel without unit padding)
  int64_t global_param_numel = 0;  // the whole model's parameter count
  int64_t align = 1;               // every unit's numel is a multiple of this
  const ParamSpec& param(const std::string& name) const;  // throws if absent
  // Indices into units of each kind, in flat order.
  std::vector<int> units_of(UnitKind kind) const;
};

// align: every unit is padded at its end with unused elements (zero, never initialised or
// updated) up to a multiple of align, so that ZeRO can split each unit into `align` equal
// contiguous chunks (align = the data-parallel size). align 1 is the unpadded layout. A vocabulary
// piece holds a multiple of 8 rows (and of align/gcd(align, C), so that no padding falls inside
// the matrix); the pieces are the same for every power-of-two align when C is a multiple of 8.
// tp_size, tp_rank: the tensor-parallel group (tp_size must divide heads and ffn_hidden, and
// kv_heads or be a multiple of it: validated with the config). ep_size, ep_rank: the
// expert-parallel group (ep_size divides moe.experts): the rank holds experts/ep_size consecutive
// experts of each MoE layer, each split over tp as a dense MLP is, or whole (whole_experts, with
// tp_size > 1); expert_align: the Experts units are padded to a multiple of it too (the
// expert-data-parallel group ZeRO shards them over, when that does not divide align).
ModelSpec build_model_spec(const ModelConfig& m, int64_t align = 1, int tp_size = 1,
                           int tp_rank = 0, int ep_size = 1, int ep_rank = 0,
                           bool whole_experts = false, int64_t expert_align = 1);

// A pipeline stage's spec: the same units and parameters (same indices, so every unit keeps its
// name and place in the model), but only the units `held` marks take space in the flat buffer,
// packed in model order; the others keep numel 0 and are marked not held (as are parameters
// none of whose units are held). Every vocabulary unit is held or none is.
ModelSpec hold_units(const ModelSpec& spec, const std::vector<bool>& held);

// Writes elements [begin, begin+count) of this rank's slice of parameter `p`'s initial value
// (flattened row-major in the local shape; padding rows are zero).
void init_param_slice(float* out, const ParamSpec& p, uint64_t seed, int64_t begin, int64_t count);
// The same into device memory: out holds the count fp32 elements on their device; generated on
// the host in bounded pieces and copied there (kernels/ops.h).
void init_param_slice(Tensor out, const ParamSpec& p, uint64_t seed, int64_t begin);

// The row of the canonical (Hugging Face) layout that global row `row` of p is (identity but for
// the fused QKV and gate|up weights and the QKV bias).
int64_t canonical_row(const ParamSpec& p, int64_t row);
// A whole (tp = 1) tensor `in` of p in strata's row order rewritten in the canonical order.
void to_canonical(const ParamSpec& p, const float* in, float* out);

// Flat ranges of the buffer whose elements `replicas` > 1 ranks of the tensor-parallel group hold
// alike: a global sum over the group (a gradient norm) counts them once by weighting 1/replicas.
struct ReplicatedRange {
  int64_t offset = 0, numel = 0;
  int replicas = 1;
};
std::vector<ReplicatedRange> replicated_ranges(const ModelSpec& spec);

// Matmul FLOPs of one training step (forward + backward) per token of the whole model (all tp
// ranks), the peers' convention: 6·N + 12·L·C·T with N all parameters (padding excluded) (as
// ../peers counts, so MFU figures compare); of a mixture of experts, those a token passes through
// (the router, top_k of each MoE layer's experts and the shared expert: its active parameters).
double train_flops_per_token(const ModelSpec& spec);

}  // namespace strata
