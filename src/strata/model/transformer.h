// A decoder-only Transformer (GPT-2 or Llama family), or a chunk of one, over flat parameter and
// gradient buffers laid out by ModelSpec for one tensor-parallel rank. Activations for the
// micro-batches in flight are allocated once, at construction; forward and backward allocate
// nothing. Every computation goes through kernels/ops.h on views of the chunk's device.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/tensor.h"
#include "strata/model/param_spec.h"
#include "strata/tensor_parallel/mappings.h"

namespace strata {

// Where a unit's parameters and gradients live during a step, and when its gradients are final.
// Units are ModelSpec::units (param_spec.h). Without a hook, or where a method returns nullptr,
// the model uses its own flat buffers; ZeRO stages 2-3 hand out a gradient buffer per unit, stage
// 3 gathers each unit's parameters just before they are read.
//
// The calls come in a static order that depends only on the model (param_trace() learns it), so
// every data-parallel rank makes the same ones: forward acquires the vocabulary units, the position
// unit, each block's attention and MLP units (and a MoE block's experts after its MLP unit is
// released), the final norm and the output units (with tied embeddings: the vocabulary units
// again); backward acquires the output units in reverse, the final norm, then each block's
// (experts,) MLP and attention units from the last block down — the embedding's backward reads no
// parameters. Each acquire is paired with a release once the model
// is done reading. Backward asks grads_for() before it accumulates (+=) into a unit and reports
// unit_done() right after, in descending flat offsets among final reports: output units, final
// norm, blocks, position, vocabulary units. A tied vocabulary unit is reported twice: after the
// output projection added its part (final = false) and after the embedding added the rest
// (final = true); grads_for() is asked before each.
class UnitHook {
 public:
  enum class Pass { Forward, Backward };
  virtual ~UnitHook() = default;
  // Before each micro-batch's backward work: `boundary` for the last micro-batch of the
  // accumulation, whose gradients are final (ZeRO may reduce them).
  virtual void begin_micro(bool /*boundary*/) {}
  virtual void begin_pass(Pass) {}
  // The unit's parameters (its first element, padding layout as ModelSpec), or nullptr.
  virtual const void* acquire_params(int /*unit*/) { return nullptr; }
  virtual void release_params(int /*unit*/) {}
  // Where backward accumulates the unit's gradients (its first element), or nullptr.
  virtual void* grads_for(int /*unit*/) { return nullptr; }
  // The gradients asked for last are added; final: no more will be added in this backward.
  virtual void unit_done(int /*unit*/, bool /*final*/) {}
};

// Activation checkpointing (DESIGN.md §3; ../shared/reference/megatron.md §6, deepspeed.md §1):
// what a chunk keeps of each block between forward and backward, and what it recomputes.
struct RecomputeOptions {
  // By model block (empty: none): full recompute. The block keeps only its input (the
  // checkpoint); backward reruns its forward from it (up to the MLP's activation: the last
  // projection's output is not needed) before its backward.
  std::vector<char> full;
  // Every other block recomputes its attention core (the softmax probabilities, Megatron's
  // selective recompute) from the kept QKV instead of keeping the (B, heads, T, T) tensor.
  bool selective = false;
  // partition_activations: each checkpoint is sharded over the tensor-parallel group (each rank
  // keeps 1/tp of its elements) and all-gathered before the recompute. Without sequence
  // parallelism and with tp > 1 only: otherwise a checkpoint is already this rank's own.
  bool partition = false;
  // cpu_checkpointing: the checkpoints live in a pool in host memory, counted as
  // MemCategory::HostCheckpoints; otherwise in the chunk's device memory, counted as
  // CheckpointedActivations. Either pool is one preallocated buffer for every checkpoint of the
  // chunk's slots (contiguous_memory_optimization, always). The CPU backend's device memory is
  // the host's, so its blocks read host checkpoints in place; a device backend would stage them
  // (none is built: a CUDA chunk is refused).
  bool host = false;
  // synchronize_checkpoint_boundary: the device is synchronised before and after each
  // checkpointed block's forward and recompute.
  bool synchronize = false;
  bool any_full() const {
    for (char f : full) {
      if (f) return true;
    }
    return false;
  }
  bool is_full(int block) const { return block < int(full.size()) && full[size_t(block)] != 0; }
};

// The units acquire_params() sees, in order, in a forward or a backward pass of `spec` (the whole
// model as one chunk): learned by running the model's passes dry (kernels/ops.h DryRun) with a
// recording hook, so that the order is written once, in the code that runs. A fully recomputed
// block's backward acquires its attention and MLP units for the recompute first, then its MLP
// and attention units for the backward.
std::vector<int> param_trace(const ModelSpec& spec, UnitHook::Pass pass,
                             const RecomputeOptions& recompute = {});

// Context parallelism (DESIGN.md §5; ../shared/reference/megatron.md): every sequence of T
// positions is split over the `size` ranks of a context-parallel group, each holding T/size rows
// of it through every layer; only attention looks across the split. "ulysses" (DeepSpeed
// Ulysses): an all-to-all turns this rank's rows of every head into every row of 1/size of the
// heads (whole key/value groups), attention runs as usual, a second all-to-all turns it back.
// "ring" (ring attention): each rank keeps its queries and passes its keys and values around the
// ring, combining the blocks' results by their log-sum-exp; its rows are two zig-zag chunks of
// T/(2·size) (chunk `rank` and chunk 2·size−1−rank), so every rank does the same causal work.
struct ContextOptions {
  enum class Impl { Ulysses, Ring };
  int size = 1, rank = 0;
  Impl impl = Impl::Ulysses;
  comm::Communicator* comm = nullptr;  // the group (nullptr: sizing and dry runs)
  bool on() const { return size > 1; }
  // The positions, in a sequence of T, of this rank's T/size rows, in the order it holds them.
  std::vector<int32_t> positions(int T) const;
};

// Where a chunk sits in the model and how much it keeps.
struct ChunkOptions {
  int unit_begin = 0, unit_end = -1;  // the chunk's units [begin, end); end -1: to the last unit.
                                      // Boundaries fall between blocks: a block's attention and
                                      // MLP units are in one chunk, the embedding's units
                                      // (vocabulary, position) in the first, the final norm and
                                      // output units in the last.
  int slots = 1;              // micro-batches whose activations are held at once (forward done,
                              // weight-gradient backward not yet)
  bool defer_weight = false;  // backward_input() leaves the weight gradients to backward_weight()
                              // (each slot then also keeps the output gradients they need)
  Device device = default_device();  // where the parameters, gradients and activations live
  // Micro-batches between forward and input-gradient backward (0: slots). What only that
  // backward reads (attention probabilities, QKV, MLP pre-activations) lives in a pool of this
  // many slots, freed by backward_input: with deferred weight gradients fewer than `slots`.
  int input_slots = 0;
  RecomputeOptions recompute = {};
  ContextOptions context = {};  // with context parallelism the chunk's T is this rank's rows
  // Expert parallelism (the spec's ExpertLayout): the group the MoE layers dispatch their tokens
  // over (nullptr: sizing and dry runs, or one rank).
  comm::Communicator* experts = nullptr;
};

// A model chunk: a contiguous range of units (DESIGN.md §3, §6) on one rank of a tensor-parallel
// group. It runs micro-batches through forward, input-gradient backward and weight-gradient
// backward, each identified by the caller's micro-batch id; activations live in one of `slots`
// preallocated slots from forward until the weight-gradient backward; nothing is allocated after
// construction.
//
// Rows: a micro-batch is B·T token rows. Hidden states between chunks are (rows, C) in the
// parameter dtype, with rows = B·T, or B·T/tp (this rank's block of rows) under sequence
// parallelism.
class Transformer {
 public:
  virtual ~Transformer() = default;

  // Forward of micro-batch `mb` into a free slot. The first chunk reads `tokens` (B·T int32);
  // every other chunk reads `hidden`, the previous chunk's output (copied). The last chunk
  // reads `targets` (B·T, < 0 ignored) and returns the sum of per-token losses over counted
  // tokens; with `train` it keeps the logits' gradient scaled by `dloss` (1/tokens of the global
  // batch × loss scale) for backward. Other chunks return 0; output(mb) is their result.
  // doc_begin (host, B × seq_len: every position of each whole sequence, under context
  // parallelism too), or nullptr for one document per sequence: document masking
  // (ops::AttentionShape::doc_begin), kept with mb's slot for its backward and recomputation.
  virtual double forward(int mb, const int32_t* tokens, Tensor hidden, const int32_t* targets,
                         float dloss, bool train, UnitHook* hook = nullptr,
                         const int32_t* doc_begin = nullptr) = 0;
  // A non-last chunk's output for mb, valid until mb's backward_input.
  virtual Tensor output(int mb) const = 0;
  // The shape of the hidden states between chunks, (rows, C) in the parameter dtype on the
  // chunk's device, over memory p (a transfer buffer).
  virtual Tensor hidden_view(void* p) const = 0;
  // Input-gradient backward of mb: dout is the gradient of output(mb) (ignored by the last
  // chunk). Returns the gradient of the chunk's input hidden states (empty for the first chunk),
  // valid until the next backward call. Without defer_weight the weight gradients are computed
  // too and the slot is freed.
  virtual Tensor backward_input(int mb, Tensor dout, UnitHook* hook = nullptr) = 0;
  // Weight-gradient backward of mb (defer_weight): accumulates (+=) mb's parameter gradients,
  // reports each unit done, frees the slot.
  virtual void backward_weight(int mb, UnitHook* hook = nullptr) = 0;

  // The logits (rows B·T, this rank's vocabulary columns) of the last forward of mb, in the
  // parameter dtype; valid until mb's backward (a training forward overwrites them with their
  // gradient).
  virtual Tensor logits(int mb) const = 0;
  virtual int64_t counted_tokens(int mb) const = 0;
  // Seconds the chunk spent in tensor-parallel collectives since the last call.
  virtual double take_tp_seconds() = 0;
  // Seconds its MoE layers spent in expert-parallel all-to-alls (the counts, the rows to the
  // experts and back, forward and backward; all exposed) since the last call.
  virtual double take_ep_seconds() = 0;
  // Seconds spent recomputing since the last call, added into per_block (indexed by model block,
  // resized to the model's blocks) when given; returns their sum.
  virtual double take_recompute_seconds(std::vector<double>* per_block = nullptr) = 0;
  virtual bool defers_weight() const = 0;
  // Mixture of experts (model_config.h MoeConfig): the balancing and z-losses' gradient weight
  // per sequence (the loss scale over the global batch's sequences), which each training forward
  // keeps for its backward.
  virtual void set_aux_scale(float per_sequence) = 0;
  // Their value over the training forwards since the last call: weighted by their coefficients,
  // summed over the sequences (the balancing losses on the first rank of a context-parallel group
  // only, the z-loss over this rank's rows): summed over the pipeline and data-parallel ranks and
  // divided by the global batch's sequences, the step's addition to the mean token loss.
  virtual double take_aux_loss() = 0;
  // The rows each MoE layer of the chunk routed to each expert in its training forwards since the
  // last call, added into tokens[layer · experts + expert] (sized layers · experts).
  virtual void take_expert_tokens(std::vector<double>& tokens) = 0;
  // The sigmoid router's expert bias, bias[layer · experts + expert] on the host (nullptr: 0),
  // read by every forward from now on; it must outlive them.
  virtual void set_expert_bias(const float* bias) = 0;

  // One micro-batch through the whole chunk list of one process (pp = 1): forward, then
  // backward. Convenience for the single-chunk model.
  double forward(const int32_t* inputs, const int32_t* targets, float dloss, bool train,
                 UnitHook* hook = nullptr, const int32_t* doc_begin = nullptr) {
    return forward(0, inputs, Tensor(), targets, dloss, train, hook, doc_begin);
  }
  void backward(UnitHook* hook = nullptr) {
    backward_input(0, Tensor(), hook);
    if (defers_weight()) backward_weight(0, hook);
  }
};

// The bytes make_transformer's chunk would allocate for its arenas (MemCategory Activations,
// Workspace, and CheckpointedActivations, or HostCheckpoints with recompute.host), computed by
// the same layout code without allocating anything: the planner's and the start-up prediction's
// figure for a chunk of this rank's spec (its tp slices) under sequence parallelism or not.
struct ArenaBytes {
  size_t activations = 0, workspace = 0, checkpoints = 0;
  bool host_checkpoints = false;
};
ArenaBytes transformer_arena_bytes(const ModelSpec& spec, DType param_dtype, DType grad_dtype,
                                   int B, int T, const ChunkOptions& chunk, bool sequence_parallel);

// params: flat buffer of spec.numel elements of `param_dtype`; grads: the same in `grad_dtype`.
// Both must outlive the model. Either may be nullptr when every pass gets a hook that places all
// units (ZeRO stage 3 has no full parameter buffer; stages 2-3 no full gradient buffer). B, T:
// micro-batch size and sequence length (T <= seq_len). tp: the tensor-parallel group of the rank
// spec was built for (one rank by default).
std::unique_ptr<Transformer> make_transformer(const ModelSpec& spec, DType param_dtype,
                                              DType grad_dtype, void* params, void* grads, int B,
                                              int T, const ChunkOptions& chunk = {},
                                              tp::Group* tp = nullptr);

}  // namespace strata
