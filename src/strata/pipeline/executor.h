// The pipeline executor (DESIGN.md §6): one stage's model chunks, its list of actions and the
// transfers between stages, run as pipeline/schedule.h says (sends never block, a receive waits
// for its message). Without a pipeline it runs one chunk of every unit over F0 B0 F1 B1 … (the
// accumulation steps). It knows the model only through Transformer and its UnitHook, and
// nothing of the run's configuration: train/ builds its options.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/pipeline/fault_injection.h"
#include "strata/pipeline/partition.h"
#include "strata/pipeline/schedule.h"

namespace strata::comm {
class Communicator;
class PeerExchange;
}  // namespace strata::comm

namespace strata::pipeline {

struct ExecutorOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;  // the generator, with stages > 1
  int stages = 1, stage = 0;
  int virtual_stages = 1;                 // model chunks per stage (1 without a pipeline)
  int micro_batches = 1;                  // per step: the gradient accumulation steps
  int micro_batch = 1;                    // B: sequences per micro-batch
  int64_t seq_len = 1, hidden = 1;        // seq_len: this rank's rows of a sequence (T/cp)
  ContextOptions context;                 // context parallelism (the model chunks' attention)
  comm::Communicator* experts = nullptr;  // expert parallelism's group (ChunkOptions::experts)
  DType param_dtype = DType::F32, grad_dtype = DType::F32;
  RecomputeOptions recompute;
  int timeout_s = 600;  // how long a receive waits for its message (parallelism.timeout_s)
  // The first and the last stage both hold the vocabulary units (the output projection reads
  // the embedding): their gradients are summed between the two (sum_tied_grads).
  bool tied_embeddings = false;
};

// What a stage's schedule asks of each of its chunks: activation slots (micro-batches whose
// forward ran and whose weight gradients have not), input slots (whose input gradient has not),
// and whether weight gradients are deferred (the schedule has BackwardInput actions).
struct ChunkSlots {
  std::vector<int> slots, input_slots;
  bool defer_weight = false;
};
ChunkSlots chunk_slots(const std::vector<Action>& stage_schedule, int virtual_stages);
// The send buffers a stage's PeerExchange holds (each pipeline_message_bytes): every send its
// peers may not yet have received.
int send_ring_slots(const ChunkSlots& s);
// One pipeline message: a micro-batch's hidden states, (B·T, C) in the parameter dtype, B·T/tp
// rows under sequence parallelism. A stage also holds 2 × virtual_stages of them (one receive
// buffer per direction and chunk) besides the send ring.
size_t pipeline_message_bytes(const ExecutorOptions& o, int tp, bool sequence_parallel);

// Runs this stage's chunks dry (kernels/ops.h DryRun: no kernel or collective touches memory)
// over one token per micro-batch, with `hook` placing every unit: train, the compute actions of
// its schedule in order (each forward, backward, input- and weight-gradient backward of every
// micro-batch and chunk); else one micro-batch forward only, the chunks in global order (as
// forward_only). The hook hears every begin_pass and acquire the executor's run() or
// forward_only() makes, in the same order: ZeRO stage 3's gather order of a step.
void dry_run_stage(const ExecutorOptions& o, const StagePlan& plan, const ModelSpec& spec,
                   UnitHook& hook, bool train);

// When one action ran, in seconds of the host's steady clock (one clock for every rank of a
// host).
struct ActionSpan {
  Action action;
  double start_s = 0, end_s = 0;
};

class Executor {
 public:
  // spec: this rank's (its stage's units, its tensor-parallel slices); plan: the units of every
  // global chunk. params, grads: the flat buffers the chunks read and accumulate into (nullptr
  // where the hook places every unit: ZeRO). pp: the pipeline group (this stage is its rank),
  // nullptr for one stage. tp, pp and faults outlive the executor. Allocates the chunks'
  // activations and the transfer buffers; with tied embeddings splits pp (a collective).
  Executor(const ExecutorOptions& o, const StagePlan& plan, const ModelSpec& spec, void* params,
           void* grads, tp::Group& tp, comm::Communicator* pp, const FaultInjector& faults);
  ~Executor();

  struct Pass {
    double loss_sum = 0.0;  // summed token losses (the last stage's; 0 elsewhere)
    double forward_s = 0.0, backward_s = 0.0;
    double recv_wait_s = 0.0;  // in receives: waiting for the neighbouring stages
  };
  // Runs this stage's actions for the step numbered `step` (1-based, for the fault injector):
  // inputs, targets (micro_batches × micro_batch, seq_len); each micro-batch's dlogits carry
  // dloss. hook (nullptr: none) places the units and hears of each micro-batch's backward.
  // doc_begin (micro_batches × micro_batch, seq_len·context.size), or nullptr: document masking's
  // starts of every whole sequence (Transformer::forward).
  Pass run(const int32_t* inputs, const int32_t* targets, float dloss, UnitHook* hook, int64_t step,
           const int32_t* doc_begin = nullptr);
  // The micro-batches forward only (evaluation): per micro-batch, this stage's chunks in global
  // order, each after receiving its input from the previous chunk's stage and before sending its
  // output to the next (sends never block: a stage runs ahead by at most its chunks, within the
  // ring the training schedule bounds); after_forward (when set) runs after each chunk's forward.
  // Returns the summed token losses (the last stage's; 0 elsewhere).
  double forward_only(const int32_t* inputs, const int32_t* targets, UnitHook* hook,
                      const std::function<void()>& after_forward,
                      const int32_t* doc_begin = nullptr);

  // Elements of the vocabulary units at the start of the flat buffer that another stage holds
  // too (tied embeddings, on the first and the last stage), 0 where none.
  int64_t tied_numel() const { return tied_numel_; }
  // Sums the first n gradients (the grad dtype) in place between the first and the last stage
  // (Megatron's embedding group), so both copies stay equal. Only where tied_numel() > 0.
  void sum_tied_grads(void* grads, int64_t n);

  const std::vector<Action>& schedule() const { return schedule_; }
  int stage() const { return o_.stage; }
  // This stage's model chunks, local order.
  const std::vector<std::unique_ptr<Transformer>>& chunks() const { return chunks_; }
  // While on, run() records each action's span (into storage reserved for the schedule: no
  // allocation); the last run's.
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<ActionSpan>& trace() const { return trace_; }

 private:
  ExecutorOptions o_;
  tp::Group& tp_;
  comm::Communicator* pp_;
  const FaultInjector& faults_;
  std::vector<Action> schedule_;
  std::vector<std::unique_ptr<Transformer>> chunks_;
  std::vector<int> chunk_global_;  // local chunk -> global chunk
  std::unique_ptr<comm::PeerExchange> peers_;
  Buffer pipe_;  // per chunk: a received activation, a received gradient
  std::vector<void*> recv_act_, recv_grad_;
  std::vector<Tensor> last_dx_;  // per chunk: the input gradient its last backward returned
  bool split_ = false;           // transfers carry this tp rank's block of rows (tp_part)
  bool tracing_ = false;
  std::vector<ActionSpan> trace_;
  std::unique_ptr<comm::Communicator> embed_comm_;  // the first and the last stage
  int64_t tied_numel_ = 0;
  int last_chunk() const;  // the last global chunk
  // Messages are tagged by (micro-batch, receiving global chunk, activation 0 | gradient 1).
  int tag(int micro, int g, int kind) const { return (micro * (last_chunk() + 1) + g) * 2 + kind; }
  Tensor tp_part(const Tensor& t) const;
};

}  // namespace strata::pipeline
