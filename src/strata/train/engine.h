// The training engine: the only place that knows the order of a step (DESIGN.md §3). It builds
// the parts that do the work and calls them in that order: the pipeline executor runs the
// schedule (pipeline/executor.h), ZeRO finishes the reductions (zero/zero_sync.h), the clipper
// takes the global norm, clips and steps the optimizer (optim/grad_clip.h); it keeps the
// checkpoints, the evaluation and the step's metrics.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/monitor/step_metrics.h"
#include "strata/optim/grad_clip.h"
#include "strata/optim/loss_scaler.h"
#include "strata/optim/optimizer.h"
#include "strata/pipeline/executor.h"
#include "strata/pipeline/fault_injection.h"
#include "strata/pipeline/partition.h"
#include "strata/pipeline/schedule.h"

namespace strata {

namespace data {
class TokenDataset;
class Sampler;
}  // namespace data
namespace comm {
class Communicator;
}  // namespace comm
class ZeroSync;
namespace data {
struct SamplerOptions;
}  // namespace data

// The sampler's options for a run's data (data.packing, data.document_mask, data.eod_mask_loss).
data::SamplerOptions sampler_options(const DataConfig& d, const data::TokenDataset& dataset);

// The checks the engine runs on a layout before it builds anything, from the sizes alone, so
// that the planner (planner/search.h) refuses exactly what train refuses. ZeRO is in effect
// when a stage is asked for and the run has a data-parallel group (any run of several ranks).
bool zero_in_effect(const Config& cfg, bool dp_group);
// The ZeRO shard group's size over dp data-parallel ranks (MiCS: zero_optimization.
// mics_shard_size), 1 without ZeRO; an InputError for a size that does not divide dp.
int shard_group_size(const Config& cfg, int dp, bool dp_group);
// The pipeline schedule's own checks (every ZeRO stage composes with every schedule).
void check_pipeline_layout(const Config& cfg, int stages);
// The model spec of tensor-parallel rank tp_rank of stage `stage`: its slices of the units that
// stage holds (all of them for one stage; the vocabulary units too on the last stage with tied
// embeddings), padded for a shard group of `shard` ranks. `plan` receives every global chunk's
// units.
// ep_rank: the rank's place in its expert-parallel group (parallelism.expert; the model.moe
// experts it holds).
ModelSpec stage_model_spec(const Config& cfg, int shard, int tp, int tp_rank, int stages, int stage,
                           pipeline::StagePlan& plan, int ep_rank = 0);
// The executor's options for stage `stage` of `stages` (one stage: no pipeline).
pipeline::ExecutorOptions executor_options(const Config& cfg, int stage, int stages);

class Engine {
 public:
  // cfg must be resolved (resolve_batch) for the data-parallel size: dp's size, or 1 without dp.
  // The dataset, dp and tp, when given, must outlive the engine; without a dataset, only
  // train_batch_on() can train. tp: the tensor-parallel group (parallelism.tensor ranks; every
  // rank of it reads the same samples), or nullptr for one rank. pp: the pipeline group (this
  // rank's stage is its rank there), or nullptr for one stage.
  // cp: the context-parallel group (parallelism.context ranks splitting every sequence), or
  // nullptr for none; with one, dp must be the group of dp × cp ranks (ProcessGroups::dp_cp):
  // gradients are summed and ZeRO shards over it, while the data is split over dp alone.
  Engine(const Config& cfg, const data::TokenDataset* dataset, comm::Communicator* dp = nullptr,
         comm::Communicator* tp = nullptr, comm::Communicator* pp = nullptr,
         comm::Communicator* cp = nullptr);
  ~Engine();

  // One optimizer step over the next global batch of the dataset.
  StepMetrics train_batch();
  // One optimizer step over this rank's part of a global batch: inputs, targets
  // (micro-batch × accumulation steps, seq_len) — the whole global batch at dp = 1. The loss is
  // the mean over train_batch_size · seq_len targets (a target of -1 adds nothing to the sum).
  StepMetrics train_batch_on(const int32_t* inputs, const int32_t* targets);
  // The same with document masking's starts (local samples × seq_len, or nullptr) and the loss's
  // denominator: the trained targets (not -1) of the whole global batch, every rank's.
  StepMetrics train_batch_on(const int32_t* inputs, const int32_t* targets,
                             const int32_t* doc_begin, int64_t trained_tokens);

  const ModelSpec& spec() const { return spec_; }
  const Config& config() const { return cfg_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  // The training data's windows (nullptr without a dataset).
  const data::Sampler* sampler() const { return sampler_.get(); }
  // The current parameters (param dtype), flat in ModelSpec order. nullptr under ZeRO stage 3,
  // which holds no whole copy: gather_params() assembles one (a collective). Under tensor
  // parallelism, this rank's slices (ModelSpec::params say which).
  const void* params() const { return params_.data(); }
  void gather_params(void* out);
  // ZeRO (stages 1-3 with a data-parallel communicator), or nullptr: stage 0.
  ZeroSync* zero() { return shard_ != nullptr ? sync_.get() : nullptr; }
  // The first of this stage's model chunks (the whole model without a pipeline).
  Transformer& model() { return *pipe_->chunks().front(); }
  // This rank's actions in a step (pipeline/schedule.h): without a pipeline F0 B0 F1 B1 … over
  // the accumulation steps.
  const std::vector<pipeline::Action>& schedule() const { return pipe_->schedule(); }
  int stage() const { return stage_; }
  // Tracing: while on, each step records when each of this rank's actions started and ended, in
  // seconds of the host's steady clock (one clock for every rank of a host); the last step's.
  using ActionSpan = pipeline::ActionSpan;
  void set_tracing(bool on) { pipe_->set_tracing(on); }
  const std::vector<ActionSpan>& last_trace() const { return pipe_->trace(); }
  // Fault injection (tests, `train --fault` and `--slow`; pipeline/fault_injection.h): what this
  // rank's injector does before the schedule's actions, at the reduction, the optimizer step and
  // the checkpoint save (an error, a kill, a hang, slowness).
  using KillPhase = pipeline::KillPhase;
  void set_faults(const pipeline::FaultInjector& f) { faults_ = f; }
  // Runs forward and backward of one micro-batch without stepping (golden tests): returns the
  // mean loss; gradients are left in grads() (scaled by the loss scale, fp16 only). Needs the
  // flat buffers: not under ZeRO stages 2-3 (an error).
  double forward_backward(const int32_t* inputs, const int32_t* targets);
  const void* grads() const { return grads_.data(); }
  DType grad_dtype() const { return grad_dtype_; }
  void zero_grads();

  // Layout-independent checkpoints (DESIGN.md §7, ckpt/store.h). save_checkpoint writes the
  // current state — fp32 master weights, optimizer moments, step, consumed samples, the
  // optimizer's steps, the loss scaler, the seed — as <root>/step_<step>, each element once (by
  // the rank owning it: ZeRO's partition owner, tp rank 0 of replicated elements, the first
  // stage of a tied embedding), atomically, then points <root>/latest at it. A collective over
  // every rank of the engine; an error on any rank fails the save on all of them, leaving the
  // previous checkpoint as latest.
  void save_checkpoint(const std::string& root);
  // Loads a checkpoint saved from any layout (a step directory, or a root whose latest is
  // read) into this engine's layout: the next step continues the saved run. A collective;
  // InputError on a damaged checkpoint or one of another model, on every rank; the engine's
  // state is then partly overwritten (chunks are read into place): load another checkpoint or
  // build a new engine. Returns notes for the user (e.g. a different seed); a checkpoint
  // without moments (an import, or into another optimizer) starts the optimizer afresh.
  struct Resumed {
    std::string dir, layout;  // the step directory; the layout it was saved from
    int64_t step = 0, consumed_samples = 0;
    std::vector<std::string> notes;
    double read_s = 0;  // checks and reads (the rest: publishing and ZeRO's re-gathering)
  };
  Resumed load_checkpoint(const std::string& path);
  int64_t step() const { return step_; }

  // Validation (Megatron's evaluate; engine_eval.cc). set_validation takes the held-out set
  // (which must outlive the engine): InputError when it has fewer than seq_len + 1 tokens or an
  // id >= model.vocab. evaluate() returns the mean loss over the trained targets of `iters`
  // batches of train_batch_size, read in order, not in the training permutation: batch i holds
  // windows [i·GBS, (i+1)·GBS) of the set (seq_len + 1 tokens at w·seq_len, data/sampler.h),
  // modulo its windows (val_windows()). Each data-parallel rank forwards its slice as
  // micro-batches through this layout: tensor slices, pipeline stages in turn (a schedule of
  // forwards), ZeRO-3's gathers. A collective over every rank; the parameters, the training
  // sampler, consumed_samples and the step are untouched, and nothing is allocated.
  void set_validation(const data::TokenDataset& val);
  bool has_validation() const { return val_sampler_ != nullptr; }
  int64_t val_windows() const;
  double evaluate(int64_t iters);

 private:
  Config cfg_;
  pipeline::StagePlan plan_;  // the units of every global model chunk (set with spec_)
  ModelSpec spec_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<data::Sampler> val_sampler_;  // windows read in order (evaluate)
  DType grad_dtype_ = DType::F32;  // fp32 unless mixed precision with grad_accum_dtype set
  Buffer params_, grads_;
  std::vector<double> recompute_block_s_;  // the last step's recompute seconds per block (profile)
  // A mixture of experts: the MoE layers, and the last step's tokens per (layer, expert) over the
  // global batch (all layers while summing, then the MoE layers' rows packed in order).
  std::vector<int> expert_layers_;
  std::vector<double> expert_tokens_;
  std::vector<float> expert_sum_;  // the sum's buffer
  // The sigmoid router's expert bias (layers · experts; the dense layers' rows unused), the same
  // on every rank; moved once per step by update_expert_bias (model.moe.expert_bias_update_rate).
  std::vector<float> expert_bias_;
  void update_expert_bias();
  std::unique_ptr<Optimizer> optimizer_;
  LossScaler scaler_;
  Buffer inputs_, targets_;     // this rank's token ids of a global batch (local samples, seq_len)
  Buffer doc_begin_;            // their document starts (data.document_mask; else empty)
  int64_t trained_tokens_ = 0;  // the step's global batch's trained targets
  comm::Communicator* dp_ = nullptr;  // dp × cp under context parallelism
  int dp_rank_ = 0, dp_size_ = 1;
  // Context parallelism: the group, this rank's place in it, the data-parallel rank and size
  // (of the samples: dp alone), and this rank's rows of the batch's sequences.
  comm::Communicator* cp_comm_ = nullptr;
  int cp_rank_ = 0, cp_size_ = 1, data_rank_ = 0, data_size_ = 1;
  std::vector<int32_t> context_pos_;
  Buffer context_inputs_, context_targets_;
  // This rank's rows (context_pos_) of every sequence of inputs and targets; them unchanged
  // without context parallelism.
  std::pair<const int32_t*, const int32_t*> context_rows(const int32_t* inputs,
                                                         const int32_t* targets);
  comm::Communicator* tp_comm_ = nullptr;
  std::unique_ptr<comm::Communicator> kv_comm_;  // ranks sharing key/value heads (kv_heads < tp)
  // Expert parallelism (parallelism.expert > 1): the group this rank's MoE layers dispatch over,
  // and the expert-data-parallel group that holds the same experts (both inside dp_, or with
  // whole experts inside stage_comm_, the stage's tp × dp × cp ranks; edp_comm_ then also at
  // ep 1).
  std::unique_ptr<comm::Communicator> stage_comm_, ep_comm_, edp_comm_;
  std::unique_ptr<tp::Group> tp_;
  std::vector<ReplicatedRange> replicated_;  // counted once in the gradient norm
  comm::Communicator* pp_comm_ = nullptr;    // the pipeline group (null for one stage)
  int stage_ = 0, stages_ = 1;
  GradClipper clipper_;  // the global norm over dp × tp × pp, clipping, the optimizer step
  pipeline::FaultInjector faults_;
  std::unique_ptr<pipeline::Executor> pipe_;  // this stage's chunks, actions and transfers
  // The step's phases (train_batch_on), one call each. The gradients of the step: begun (ZeRO's
  // step state); reduced (every reduction done, the tied embedding's gradient summed over the
  // first and last stage); the update (the global norm, clipping, the optimizer step on what this
  // rank owns, the parameters published, the gradients zeroed for the next step).
  void begin_gradients();
  struct Reduced {
    double comm_exposed_s = 0, gather_exposed_s = 0;  // ZeRO's waits for reductions and gathers
    double stage_sum_s = 0;  // waiting for the other stages in the sums over the pipeline
    double loss_sum = 0;     // the global batch's summed loss
    double aux_loss = 0;     // a mixture of experts' balancing and z-losses (in loss_sum)
  };
  Reduced reduce_gradients(double local_loss_sum);
  void sum_expert_tokens();
  struct Update {
    ClipDecision clip;
    float lr = 0, loss_scale = 1;
  };
  Update update_parameters();
  // Where the step is, for the flight recorder (a hang names it) and fault injection (a fault
  // fires there): the debugging hooks of a phase.
  void enter_phase(KillPhase phase, int64_t step, const char* activity);
  // What a step measures of itself: wall time, the bytes each group put on the wire and the
  // memory peaks from its start, the tensor-parallel and recompute seconds of its chunks.
  struct Probe {
    std::chrono::steady_clock::time_point t0;
    uint64_t bytes0 = 0, tp_bytes0 = 0, cross0 = 0;
  };
  Probe begin_probe();
  StepMetrics step_metrics(const Probe& probe, const pipeline::Executor::Pass& pass,
                           const Reduced& reduced, const Update& update,
                           std::chrono::steady_clock::time_point update_start);
  void sum_tied_embeddings();
  double sum_over_pp_dp(double local);
  // ZeRO: the groups the states are sharded over and (MiCS) replicated across (shard_ is null
  // at stage 0).
  std::unique_ptr<comm::Communicator> shard_comm_, replica_comm_;
  comm::Communicator* shard_ = nullptr;
  // Data parallelism at every stage (null for one process without ZeRO): the model's hook.
  std::unique_ptr<ZeroSync> sync_;
  int64_t consumed_samples_ = 0;
  int64_t step_ = 0;
  double flops_per_token_ = 0.0;
  uint64_t wire_bytes() const;
  uint64_t tp_wire_bytes() const;
  // Checkpoints (engine_checkpoint.cc): this rank's place in the world, and a collective AND of
  // `ok` over every rank (the tp, dp and pp groups in turn).
  int world_id() const;
  bool all_ok(bool ok);
  std::string layout_name() const;
};

}  // namespace strata
