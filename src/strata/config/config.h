// The run configuration: DeepSpeed's JSON keys (with DeepSpeed's meaning and defaults) plus
// strata's own blocks (model, parallelism, data, train). Parsing is strict: an unknown key
// anywhere is an InputError naming the nearest valid key; a wrong type or value names the key
// and what is allowed.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/model_config.h"
#include "strata/model/transformer.h"
#include "strata/optim/optim_config.h"
#include "strata/zero/partition.h"

namespace strata {

struct ParallelismConfig {
  int tensor = 1, pipeline = 1, virtual_stages = 1;
  std::string schedule = "1f1b";  // "gpipe" | "1f1b" | "interleaved" | "zero_bubble"
  bool sequence_parallel = false;
  std::string order = "tp-dp-pp";  // a permutation of tp, dp, pp (and cp: after tp if not named)
  // Context parallelism: each sequence split over `context` ranks (the cp axis), attention
  // computed across them by "ulysses" (all-to-all between the sequence and the heads) or "ring"
  // (keys and values passed around the ring, zig-zag chunks for causal balance).
  int context = 1;
  std::string context_impl = "ulysses";
  // Expert parallelism (model.moe): the routed experts of every MoE layer placed over `expert`
  // ranks of a stage (Megatron's parallel folding), the tokens dispatched to them by all-to-all;
  // expert parameters are summed and sharded over the expert-data-parallel group (the ranks
  // holding the same experts). expert_tensor: the ranks each expert is split over; the
  // tensor-parallel size (each expert split as a dense MLP; ep then divides dp × cp, the groups
  // of ranks with one tensor coordinate), or 1: whole experts, over groups of the stage's
  // tp × dp × cp ranks (ep divides that product), each rank routing its own sequence-parallel
  // rows (so tensor > 1 needs sequence_parallel).
  int expert = 1;
  int expert_tensor = 0;  // 0: not given (the tensor-parallel size)
  // Whole experts beside tensor-parallel attention (expert_tensor 1, tensor > 1).
  bool whole_experts() const { return tensor > 1 && expert_tensor == 1; }
  // The ranks of a stage the experts are placed over, given its data × context-parallel size.
  int expert_ranks(int dp_cp) const { return whole_experts() ? dp_cp * tensor : dp_cp; }
  // How the tokens reach the experts' ranks: "all_to_all" (each rank's routed rows to the ranks
  // of their experts and the outputs back; Megatron's alltoall dispatcher), or "all_gather"
  // (every rank's tokens and routing gathered on every rank of the group, each rank's experts'
  // outputs weighted and summed back by a reduce-scatter; Megatron's allgather dispatcher, which
  // sends each token once however many experts it chooses).
  std::string expert_dispatch = "all_to_all";
  // The shared expert (model.moe.shared_ffn_hidden) computed while the dispatch is in flight
  // (Megatron's moe_shared_expert_overlap), the dispatch's collectives issued before it and
  // waited for after. Off by default: on CPU ranks that share their cores the communication
  // thread takes the compute's core (bench/moe_expert_parallel.sh: slower on 2 cores).
  bool expert_overlap = false;
  // How the blocks are cut into pipeline chunks: "uniform" | "parameters" | "time" | "explicit"
  // (partition_blocks: the blocks of each chunk, stages × virtual_stages counts).
  std::string partition = "uniform";
  std::vector<int> partition_blocks;
  // Watchdog: a collective waiting longer than this aborts the job naming the rank (0 = never).
  int timeout_s = 600;
};

struct DataConfig {
  std::string path;             // "" = the built-in demo corpus
  std::string format = "auto";  // "auto" | "llmc" | "megatron"
  std::string val_path;         // validation data; "" = the val split of path, if any (open_splits)
  // Windows (data/sampler.h): "first_fit" packs whole documents into windows of seq_len,
  // "none" cuts the token stream into consecutive windows, "auto" packs when document_mask is on
  // or the data has a loss mask (conversations from data prepare --jsonl).
  std::string packing = "auto";
  // Documents in a window do not see each other: attention is block-diagonal and positions
  // restart at each document (also set by Megatron's reset_attention_mask, reset_position_ids).
  bool document_mask = false;
  bool eod_mask_loss = false;  // Megatron's: a target that opens a document is not trained
  bool pack(bool has_loss_mask) const {
    return packing == "first_fit" || (packing == "auto" && (document_mask || has_loss_mask));
  }
};

struct TrainConfig {
  int64_t steps = 200;  // optimizer steps of the run in all (>= 1)
  uint64_t seed = 1234;
  std::string run_dir = "runs/default";
  // Validation (Megatron's --eval-interval, --eval-iters): every eval_interval steps (0: only at
  // the last step) and at the last, eval_iters batches of train_batch_size (0: no validation).
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  // Where each rank computes: "cpu", or "cuda" (one GPU per rank: local rank modulo the visible
  // GPUs, so several ranks may share one).
  std::string device = "cpu";
  // Stragglers (monitor/stragglers.h): every straggler_interval steps (0: never) each rank's phase
  // times are gathered; a rank whose busy time per step exceeds the median's by more than
  // straggler_threshold (a fraction) in straggler_patience windows in a row is named in the log.
  int64_t straggler_interval = 20;
  double straggler_threshold = 0.2;
  int64_t straggler_patience = 2;
};

struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;
  bool immediate_grad_update = false;
  bool bf16_master_weights_and_grads = false;  // needs ZeRO 1-3
  bool bf16_optimizer_states = false;          // needs bf16_master_weights_and_grads
};

// zero_optimization.offload_param / offload_optimizer. Keys of the other block are rejected.
struct OffloadConfig {
  std::string device = "none";  // "none" | "cpu" | "nvme"
  std::string nvme_path;
  int buffer_count = 4;             // offload_param: 5, offload_optimizer: 4
  int64_t buffer_size = 100000000;  // offload_param only
  int64_t max_in_cpu = 1000000000;  // offload_param only
  bool pin_memory = true;
  bool pipeline_read = false, pipeline_write = false, fast_init = false;  // offload_optimizer
  double ratio = 1.0;  // offload_optimizer; < 1 needs stage 3
};

struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = false;  // DeepSpeed: unset means true iff stage 3
  bool contiguous_gradients = true;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool reduce_scatter = true;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  // strata's (as torchtitan's reshard_after_forward): true releases a unit after each use (kept
  // only while stage3_max_reuse_distance and the gather buffers allow); false keeps every unit
  // gathered from its first use in the step to its last (one gather per unit per step under a
  // pipeline, a buffer for every unit of the stage).
  bool stage3_reshard_after_forward = true;
  bool allgather_partitions = true;
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t sub_group_size = 1000000000;
  bool round_robin_gradients = false;
  // MiCS / hybrid sharding: states sharded within groups of this many consecutive data-parallel
  // ranks (a host) and replicated across groups; -1 shards over the whole group.
  int64_t mics_shard_size = -1;
  bool mics_hierarchical_params_gather = false;  // accepted; gathers stay inside a group anyway
  OffloadConfig offload_param = [] {
    OffloadConfig o;
    o.buffer_count = 5;
    return o;
  }();
  OffloadConfig offload_optimizer;
};

// activation_checkpointing: in effect from the config alone (DeepSpeed needs the model to call
// deepspeed.checkpointing.configure); recompute_options() maps it to the model's RecomputeOptions.
struct ActivationCheckpointingConfig {
  bool enabled = false;  // the block is present (even {}); recompute_granularity "none" still
                         // turns recomputation off
  // "full": blocks keep only their input and rerun their forward in backward; "selective":
  // every block recomputes its attention core (Megatron's); "none": nothing is recomputed.
  std::string recompute_granularity = "full";
  // Which number_checkpoints blocks are fully recomputed: "uniform" (spread evenly) | "block"
  // (the first ones).
  std::string recompute_method = "uniform";
  bool partition_activations = false;  // needs parallelism.tensor > 1, no sequence parallelism
  bool cpu_checkpointing = false;
  // Unset: not given. strata always keeps every checkpoint in one preallocated buffer.
  std::optional<bool> contiguous_memory_optimization;
  std::optional<int> number_checkpoints;  // blocks fully recomputed; unset: every block
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;  // read by the engine: recompute times per block
};

struct CheckpointConfig {
  std::string dir;                      // "" = no checkpoints
  int64_t interval = 0;                 // steps between saves; 0 = only when asked
  std::string tag_validation = "Warn";  // "Ignore" | "Warn" | "Fail"
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;  // parallel_write.pipeline_stage
};

struct ElasticityConfig {
  bool enabled = false;
  int64_t max_train_batch_size = 0;
  std::vector<int64_t> micro_batch_sizes;
  int min_gpus = 1, max_gpus = 10000;
  int64_t min_time = 0;
  double version = 0.2;
  bool ignore_non_elastic_batch_info = false;
  bool prefer_larger_batch = true;
  int num_gpus_per_node = 1;
  int model_parallel_size = 1;
};

// tensorboard / csv_monitor blocks (DeepSpeed's monitor config).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct WandbConfig {
  bool enabled = false;
  std::string group, team;
  std::string project = "deepspeed";
};

// DeepSpeed's comet block: read to note that it needs a network service strata does not reach.
struct CometConfig {
  bool enabled = false;
  int64_t samples_log_interval = 100;
  std::string project, workspace, api_key, experiment_name, experiment_key, mode;
  bool online_set = false;  // online: DeepSpeed's default is None (Comet decides)
};

// DeepSpeed blocks and keys read only to check them: they change nothing in strata's training (a
// printout, DeepSpeed's own data loader, NVMe I/O tuning, a check on a client optimizer strata
// does not have), so config_notices names the ones set away from DeepSpeed's default. What would
// change training (data_efficiency's sampling or routing enabled) is refused instead.
struct DeepSpeedExtrasConfig {
  bool flops_profiler = false;                   // flops_profiler.enabled
  std::vector<std::string> flops_profiler_keys;  // its other keys that are given
  bool comms_logger = false;                     // comms_logger.enabled
  std::vector<std::string> comms_logger_keys;
  bool torch_autocast = false;  // torch_autocast.enabled (only where the model already runs in
                                // its dtype; otherwise refused)
  std::vector<std::string> torch_autocast_keys;
  std::vector<std::string> aio_keys;  // aio's keys that are given
  bool dataloader_drop_last = false;
  bool zero_force_ds_cpu_optimizer = true;
  bool data_efficiency = false;                   // data_efficiency.enabled (its features all off)
  std::vector<std::string> data_efficiency_keys;  // its other keys that are given
  bool elastic_checkpoint = false;                // zero_optimization.elastic_checkpoint
  bool cpu_offload_use_pin_memory = false;        // zero_optimization's legacy pin_memory switch
  bool communication_data_type_bfp16 = false;     // given as older DeepSpeed's "bfp16"
};

struct Config {
  // The batch triangle, resolved for a data-parallel size (see resolve_batch).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;

  float gradient_clipping = 1.0f;  // 0 disables
  int64_t steps_per_print = 10;    // 0 = never
  bool wall_clock_breakdown = false;
  std::optional<DType> communication_data_type;  // unset: fp16/bf16/fp32 from precision
  // data_types.grad_accum_dtype: fp32 or the parameter dtype. Unset stays fp32, unlike DeepSpeed
  // (where None means the model dtype); the engine and its memory test rely on fp32.
  DType grad_accum_dtype = DType::F32;
  bool prescale_gradients = false;
  float gradient_predivide_factor = 1.0f;
  bool zero_allow_untested_optimizer = false;  // SGD under ZeRO needs it, as in DeepSpeed
  // DeepSpeed keys of the fp16 and optimizer blocks whose structs live in optim/.
  bool fp16_auto_cast = false;                 // fp16.auto_cast
  bool fp16_master_weights_and_grads = false;  // fp16.fp16_master_weights_and_grads (ZeRO 1-3)
  bool optimizer_torch_adam = false;           // optimizer.params.torch_adam: same math

  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  ElasticityConfig elasticity;
  MonitorConfig tensorboard, csv_monitor;
  WandbConfig wandb;
  CometConfig comet;
  DeepSpeedExtrasConfig extras;

  ModelConfig model;  // no "model" block: the "demo" preset
  ParallelismConfig parallelism;
  DataConfig data;
  TrainConfig train;

  // Which of the three batch keys the user gave (0 = not given). parse_config leaves the three
  // resolved fields above at 0; resolve_batch fills them.
  int64_t given_train_batch_size = 0, given_micro_batch = 0, given_grad_accum = 0;
  // DeepSpeed's sequence_parallel_size (DeepSpeed-Ulysses' degree), 0 when absent: the
  // parallelism block's context with context_impl "ulysses".
  int ds_sequence_parallel_size = 0;
  bool given_model = false;  // a model block was given (else the demo model, or a checkpoint's)

  DType param_dtype() const {
    return bf16.enabled ? DType::BF16 : fp16.enabled ? DType::F16 : DType::F32;
  }
  // Gradients accumulate in data_types.grad_accum_dtype under bf16 or fp16, in fp32 otherwise.
  DType grad_dtype() const { return fp16.enabled || bf16.enabled ? grad_accum_dtype : DType::F32; }
  DType comm_dtype() const { return communication_data_type.value_or(param_dtype()); }
};

// The deepest nesting of objects and arrays a config may have (its own blocks nest at most 4).
inline constexpr int kMaxConfigDepth = 64;

// The config file's JSON (parse_json_strict); an InputError naming the path when it cannot be
// read or parsed.
nlohmann::json read_config_json(const std::string& path);
// Parses and validates a whole config. `overrides` are "a.b.c=value" strings applied to the JSON
// before validation (value parsed as JSON, else taken as a string). Throws InputError.
Config parse_config(const nlohmann::json& j, const std::vector<std::string>& overrides = {});
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The JSON parse_config reads for (j, overrides): j with each "a.b.c=value" applied, as given
// (keys not given stay absent; nothing resolved). train records it in <run_dir>/run.json.
nlohmann::json apply_overrides(nlohmann::json j, const std::vector<std::string>& overrides);
// Parses JSON text strictly: a duplicate key anywhere is an InputError naming its path; invalid
// JSON names the line and column; nesting deeper than kMaxConfigDepth (objects and arrays) is
// refused before it is built. `origin` (a file name) starts the messages.
nlohmann::json parse_json_strict(std::string_view text, std::string_view origin);

// Resolves the batch triangle for a data-parallel size as DeepSpeed does (floor division when
// one key is missing; gradient_accumulation_steps=1 when two are); throws InputError naming all
// three values when they are inconsistent, or when parallelism.sequence_parallel cannot split the
// micro-batch's token rows evenly over parallelism.tensor ranks.
void resolve_batch(Config& c, int dp_size);
// parallelism.expert against the data × context-parallel ranks of a stage (dp_cp; times tensor
// with whole experts): an InputError naming the key when it does not divide them.
void check_expert_grid(const Config& c, int dp_cp);

// Model presets: "gpt2-124M", "gpt2-350M", "bench-23M", "llama-tiny", "gpt2-tiny", "llama-1B"...
ModelConfig model_preset(const std::string& name);  // throws InputError listing the presets
std::vector<std::string> model_preset_names();
// The description m.family gives its block (biases, q/k norms, ...: model_config.h), set on m.
void family_defaults(ModelConfig& m);
// Fills derived fields (kv_heads = heads, ffn_hidden = 4*hidden or Llama's 8/3 rounded) and
// checks consistency (hidden % heads, heads % kv_heads, even head dim for RoPE, ...).
void finalize_model(ModelConfig& m);

// Features that exist in the config but are not in effect at this layout/version: one line each,
// printed at startup ("zero_optimization.stage=3 is honoured trivially at 1 process", ...). Every
// key set to a value other than its default either changes what strata does or has a line here.
std::vector<std::string> config_notices(const Config& c, int world_size);

// What each model block keeps and recomputes under c.activation_checkpointing (deepspeed.md §1,
// megatron.md §6). Granularity "full": `full` has model.layers entries, set for the
// number_checkpoints blocks recompute_method chooses ("uniform": floor(k·layers/n) for k < n;
// "block": the first n) or for every block; partition where it acts (parallelism.tensor > 1
// without sequence parallelism), host, synchronize. "selective": `selective` and synchronize
// only (no checkpoints to shard or move). No block or "none": the defaults, nothing recomputed.
RecomputeOptions recompute_options(const Config& c);

// ZeRO's options for a run of c, the one place zero_optimization's keys become what ZeroSync,
// ParamCache and zero_buffers() take (the stage 3 gather orders are the engine's to record):
// dtypes as param_dtype(), grad_dtype() and comm_dtype(), recompute_full from recompute_options.
ZeroOptions zero_options(const Config& c);

// Every key the config accepts, as the dotted path of a value ("zero_optimization.stage",
// "checkpoint.parallel_write.pipeline_stage"): blocks are expanded into their keys, the legacy
// "bfloat16" block is listed beside "bf16". In schema order.
std::vector<std::string> config_schema_keys();

}  // namespace strata
