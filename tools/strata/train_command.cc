#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/ckpt/store.h"
#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/comm/heartbeat.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/data/prepare.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/ops.h"
#include "strata/pipeline/schedule.h"
#include "strata/plan/predict.h"
#include "strata/train/config.h"
#include "strata/train/elasticity.h"
#include "strata/train/engine.h"
#include "strata/train/metrics.h"
#include "strata/train/monitors.h"
#include "strata/train/stragglers.h"
#include "strata/train/weight_decay.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

constexpr int64_t kNoSteps = INT64_MIN;

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = kNoSteps;  // --steps, when given
  std::string run_dir;
  std::string data;
  std::string trace_steps;  // "A:B" (1-based, inclusive) or "A"
  std::string device;       // --device, when given
  std::string fault;        // "rank=R,step=S,action=N"
  std::string slow;         // "R:SECONDS" or "R:SECONDS:FROM_STEP"
  std::string resume;       // "auto" (checkpoint.dir's latest) or a checkpoint path
};

// --fault rank=R,step=S,action=N: world rank R throws before its action N of step S.
// --fault rank=R,step=S,phase=P: world rank R is killed (SIGKILL) in phase P of step S.
struct Fault {
  int rank = -1;
  int64_t step = 0, action = -1;
  Engine::KillPhase phase = Engine::KillPhase::None;
};
Fault parse_fault(const std::string& s) {
  Fault f;
  if (s.empty()) return f;
  const char* usage =
      ": expected rank=R,step=S,action=N or rank=R,step=S,phase=P (R, N >= 0, S >= 1; P one of "
      "forward, backward, reduce, optimizer, save, or hang, hang-forward, hang-backward: stop "
      "alive before the reduction, the first forward or the first backward)";
  const std::pair<const char*, Engine::KillPhase> phases[] = {
      {"forward", Engine::KillPhase::Forward},
      {"backward", Engine::KillPhase::Backward},
      {"reduce", Engine::KillPhase::Reduce},
      {"optimizer", Engine::KillPhase::Optimizer},
      {"save", Engine::KillPhase::Save},
      {"hang", Engine::KillPhase::Hang},
      {"hang-forward", Engine::KillPhase::HangForward},
      {"hang-backward", Engine::KillPhase::HangBackward}};
  bool rank = false, step = false;
  for (size_t at = 0; at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    const size_t eq = item.find('=');
    STRATA_INPUT_CHECK(eq != std::string::npos, "--fault ", s, usage);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "phase") {
      for (const auto& [name, p] : phases) {
        if (value == name) f.phase = p;
      }
      STRATA_INPUT_CHECK(f.phase != Engine::KillPhase::None, "--fault ", s, usage);
    } else {
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      const bool ok = !value.empty() && *end == '\0' && v >= 0;
      STRATA_INPUT_CHECK(ok && (key == "rank" || key == "step" || key == "action"), "--fault ", s,
                         usage);
      if (key == "rank") f.rank = int(v), rank = true;
      if (key == "step") f.step = v, step = true;
      if (key == "action") f.action = v;
    }
    at = comma + 1;
  }
  const bool one = (f.action >= 0) != (f.phase != Engine::KillPhase::None);
  STRATA_INPUT_CHECK(rank && step && f.step >= 1 && one, "--fault ", s, usage);
  return f;
}

// --trace-steps: the first and last step traced.
std::pair<int64_t, int64_t> parse_trace_steps(const std::string& s) {
  if (s.empty()) return {0, -1};
  const size_t colon = s.find(':');
  const std::string a = s.substr(0, colon),
                    b = colon == std::string::npos ? a : s.substr(colon + 1);
  char* end = nullptr;
  const long long first = std::strtoll(a.c_str(), &end, 10);
  const bool ok_a = !a.empty() && *end == '\0';
  const long long last = std::strtoll(b.c_str(), &end, 10);
  const bool ok_b = !b.empty() && *end == '\0';
  STRATA_INPUT_CHECK(ok_a && ok_b && first >= 1 && last >= first, "--trace-steps ", s,
                     ": give the first and last step to trace as A:B (1-based, A <= B), e.g. 3:5");
  return {first, last};
}

// Every rank's action spans of the last step, gathered to rank 0 as Chrome trace events: one
// thread per rank (its stage and tensor rank in the name), the step placed after the traced
// steps before it (`offset_us`, advanced past this step's end).
void gather_trace(const Engine& engine, MPI_Comm world, bool rank0, const comm::GridCoord& at,
                  nlohmann::json& events, double& offset_us) {
  std::vector<double> mine;
  for (const Engine::ActionSpan& e : engine.last_trace()) {
    mine.insert(mine.end(), {double(int(e.action.op)), double(e.action.micro),
                             double(e.action.chunk), double(e.action.peer), e.start_s, e.end_s,
                             double(at.pp), double(at.tp), double(at.dp)});
  }
  int n = int(mine.size()), ranks = 1, rank = 0;
  std::vector<double> all = mine;
  std::vector<int> counts(1, n), displs(1, 0);
  if (world != MPI_COMM_NULL) {
    MPI_Comm_size(world, &ranks);
    MPI_Comm_rank(world, &rank);
    counts.assign(size_t(ranks), 0);
    MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
    displs.assign(size_t(ranks), 0);
    for (int r = 1; r < ranks; ++r)
      displs[size_t(r)] = displs[size_t(r - 1)] + counts[size_t(r - 1)];
    all.assign(rank0 ? size_t(displs.back() + counts.back()) : 0, 0.0);
    MPI_Gatherv(mine.data(), n, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE, 0,
                world);
  }
  if (!rank0) return;
  // Aligned on the earliest action of the step over every rank (one host: one steady clock).
  double t0 = 1e300;
  for (size_t i = 0; i + 8 < all.size(); i += 9) t0 = std::min(t0, all[i + 4]);
  double end_us = offset_us;
  for (int r = 0; r < ranks; ++r) {
    for (int i = displs[size_t(r)]; i < displs[size_t(r)] + counts[size_t(r)]; i += 9) {
      const double* e = all.data() + i;
      const pipeline::Action a{pipeline::Op(int(e[0])), int(e[1]), int(e[2]), int(e[3])};
      const double ts = offset_us + 1e6 * (e[4] - t0), dur = 1e6 * (e[5] - e[4]);
      events.push_back({{"name", pipeline::action_name(a)},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", ts},
                        {"dur", dur}});
      end_us = std::max(end_us, ts + dur);
      if (i == displs[size_t(r)] && offset_us == 0.0) {
        events.push_back(
            {{"name", "thread_name"},
             {"ph", "M"},
             {"pid", 0},
             {"tid", r},
             {"args",
              {{"name", "rank " + std::to_string(r) + " (stage " + std::to_string(int(e[6])) +
                            ", tp " + std::to_string(int(e[7])) + ", dp " +
                            std::to_string(int(e[8])) + ")"}}}});
      }
    }
  }
  offset_us = end_us + 1000.0;  // a millisecond between steps
}

constexpr const char* kDemoCorpus = "/usr/share/common-licenses";

// With no data block the run trains on the licence texts every Debian system has, tokenized
// byte-level into <run_dir>/data once.
std::string demo_dataset(const std::string& run_dir) {
  std::string prefix = (std::filesystem::path(run_dir) / "data" / "demo").string();
  std::string shard = prefix + "_train.bin";
  if (!std::filesystem::exists(shard)) {
    std::filesystem::create_directories(std::filesystem::path(prefix).parent_path());
    data::PrepareResult r = data::prepare_text_dataset({kDemoCorpus}, prefix, "llmc", 0.0);
    std::printf("demo data: %lld documents, %lld tokens from %s -> %s\n",
                static_cast<long long>(r.documents), static_cast<long long>(r.train_tokens),
                kDemoCorpus, shard.c_str());
  }
  return shard;
}

// OpenMP threads per rank: the cores of this host shared by its ranks, unless OMP_NUM_THREADS
// says otherwise (ranks that each use every core slow each other down many-fold).
void split_cores_between_local_ranks() {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks = local ? std::max(1, std::atoi(local)) : 1;
  omp_set_num_threads(std::max(1, omp_get_num_procs() / ranks));
}

// "a, b, c" of at most 6 names, else the first 3, "...", the last 2 and the count.
std::string list_files(const std::vector<std::string>& files) {
  std::string out;
  const size_t n = files.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 6 && i == 3) {
      out += ", ...";
      i = n - 3;
      continue;
    }
    out += (i == 0 ? "" : ", ") + files[i];
  }
  if (n > 6) out += " (" + std::to_string(n) + " files)";
  return out;
}

// Which files are trained on and which validate, and when validation runs.
void print_data(const data::DataSplits& d, const Config& cfg, const Engine& engine) {
  std::printf("data: train on %s\n", list_files(d.train_files).c_str());
  if (!d.ignored_files.empty()) {
    std::printf("data: ignored (named neither train nor val): %s\n",
                list_files(d.ignored_files).c_str());
  }
  if (!d.val) {
    std::printf("data: no validation data (no val split beside data.path; set data.val_path)\n");
    return;
  }
  std::printf("data: validate on %s (%s)\n", list_files(d.val_files).c_str(), d.val_origin.c_str());
  const TrainConfig& t = cfg.train;
  if (t.eval_iters == 0) {
    std::printf("note: train.eval_iters=0: no validation\n");
    return;
  }
  const int64_t windows = engine.val_windows(), used = t.eval_iters * cfg.train_batch_size;
  std::printf("validation: %lld batches of %lld sequences (its first windows in order) ",
              static_cast<long long>(t.eval_iters), static_cast<long long>(cfg.train_batch_size));
  if (t.eval_interval > 0) {
    std::printf("every %lld steps and at the last\n", static_cast<long long>(t.eval_interval));
  } else {
    std::printf("at the last step\n");
  }
  if (used > windows) {
    std::printf(
        "note: the validation data holds %lld windows of seq_len+1 tokens, fewer than "
        "train.eval_iters x train_batch_size = %lld: windows repeat; lower "
        "train.eval_iters to %lld for each once\n",
        static_cast<long long>(windows), static_cast<long long>(used),
        static_cast<long long>(std::max<int64_t>(1, windows / cfg.train_batch_size)));
  }
}

// What <run_dir>/run.json records of a run besides its metrics (strata report shows it).
struct RunRecord {
  const Config& cfg;
  const comm::RankGrid& grid;
  const Engine& engine;
  std::string model_line, cpu, peak;
  nlohmann::json resumed;
  std::vector<std::string> rank_names;
  std::string config_path, started;
  nlohmann::json config, data;
};

// Rank 0 writes <run_dir>/run.json whole (core/atomic_file.h) once the run is set up: a resumed
// or restarted run rewrites it with its own layout and the step it resumed at.
void write_run_json(const RunRecord& r) {
  const Config& c = r.cfg;
  const ActivationCheckpointingConfig& ac = c.activation_checkpointing;
  std::string recompute = ac.enabled ? ac.recompute_granularity : "none";
  if (recompute == "full" && ac.number_checkpoints) {
    recompute += " (" + std::to_string(*ac.number_checkpoints) + " of " +
                 std::to_string(c.model.layers) + " blocks, " + ac.recompute_method + ")";
  }
  if (recompute != "none" && ac.cpu_checkpointing) recompute += ", checkpoints in host memory";
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json j;
  j["strata_version"] = STRATA_VERSION;
  j["command"] = command_line();
  j["started"] = r.started;
  j["host"] = host;
  if (!r.resumed.is_null()) j["resumed"] = r.resumed;
  j["config_file"] = r.config_path;
  j["config_origin"] =
      "The config file " + r.config_path +
      " with the command line's overrides applied (--set, --steps, --run-dir, --data, --device, "
      "and a checkpoint's model where the file has none), as given: keys it leaves out take "
      "their defaults (\"layout\" and \"model\" hold what was resolved from it).";
  j["config"] = r.config;
  j["steps"] = c.train.steps;
  j["layout"] = {{"world_size", r.grid.world()},
                 {"dp", r.grid.dp()},
                 {"tp", r.grid.tp()},
                 {"pp", r.grid.pp()},
                 {"virtual_stages", c.parallelism.virtual_stages},
                 {"schedule", c.parallelism.schedule},
                 {"order", c.parallelism.order},
                 {"zero_stage", c.zero.stage},
                 {"mics_shard_size", c.zero.mics_shard_size},
                 {"train_batch_size", c.train_batch_size},
                 {"micro_batch", c.train_micro_batch_size_per_gpu},
                 {"gradient_accumulation", c.gradient_accumulation_steps},
                 {"sequence_parallel", c.parallelism.sequence_parallel},
                 {"recompute", recompute},
                 {"device", c.train.device}};
  const ModelConfig& m = c.model;
  j["model"] = {{"name", m.preset.empty() ? m.family : m.preset},
                {"family", m.family},
                {"parameters", r.engine.spec().global_param_numel},
                {"layers", m.layers},
                {"hidden", m.hidden},
                {"heads", m.heads},
                {"kv_heads", m.kv_heads},
                {"ffn_hidden", m.ffn_hidden},
                {"vocab", m.vocab},
                {"seq_len", m.seq_len},
                {"dtype", dtype_name(c.param_dtype())}};
  j["data"] = r.data;
  j["cpu"] = r.cpu;
  j["peak"] = r.peak;
  j["model_line"] = r.model_line;  // as train printed it
  if (!r.rank_names.empty()) j["ranks"] = r.rank_names;
  const std::string path = (std::filesystem::path(c.train.run_dir) / "run.json").string();
  atomic_write(path, j.dump(2) + "\n", IoError::input);
}

void run_train(const TrainArgs& a) {
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");  // ISO 8601
  const int world = comm::initialized() ? comm::world_size() : 1;
  const bool rank0 = !comm::initialized() || comm::world_rank() == 0;
  split_cores_between_local_ranks();
  comm::start_heartbeat(comm::initialized() ? comm::world_rank() : 0, world);
  // A bad STRATA_BF16_MATMUL is an input error on every rank before anything is built.
  kernels::bf16_matmul_path();
  std::vector<std::string> overrides = a.overrides;
  if (a.steps != kNoSteps) {
    STRATA_INPUT_CHECK(a.steps >= 1, "--steps ", a.steps,
                       ": give the number of optimizer steps the run trains in all, at least 1");
    overrides.push_back("train.steps=" + std::to_string(a.steps));
  }
  if (!a.run_dir.empty()) overrides.push_back("train.run_dir=\"" + a.run_dir + "\"");
  if (!a.data.empty()) overrides.push_back("data.path=\"" + a.data + "\"");
  if (!a.device.empty()) overrides.push_back("train.device=\"" + a.device + "\"");
  Config cfg = load_config(a.config, overrides);
  // --resume: continue a saved run (from any layout) up to train.steps in all.
  std::string resume = a.resume;
  if (resume == "auto") {
    STRATA_INPUT_CHECK(!cfg.checkpoint.dir.empty(),
                       "--resume auto reads checkpoint.dir's latest checkpoint; set checkpoint.dir "
                       "(or give --resume a checkpoint directory)");
    resume = ckpt::latest_checkpoint(cfg.checkpoint.dir);
    if (resume.empty() && rank0) {
      std::printf("resume: no checkpoint in %s yet, starting at step 1\n",
                  cfg.checkpoint.dir.c_str());
    }
  }
  if (!cfg.given_model && !resume.empty()) {
    // No model block: the model the checkpoint holds (an import records the Hugging Face one).
    // The config is read again with it as the model block, so that every check of the layout
    // against the model (heads over tp, blocks over stages, ...) sees this model.
    const ckpt::Reader rd(ckpt::resolve_checkpoint(resume));
    const ModelConfig& m = rd.manifest().model;
    nlohmann::json block = {
        {"family", m.family},     {"layers", m.layers},     {"hidden", m.hidden},
        {"heads", m.heads},       {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden},
        {"vocab", m.vocab},       {"seq_len", m.seq_len},   {"tied_embeddings", m.tied_embeddings},
        {"norm_eps", m.norm_eps}, {"init_std", m.init_std}};
    if (m.family == "llama") block["rope_theta"] = m.rope_theta;
    overrides.push_back("model=" + block.dump());
    cfg = load_config(a.config, overrides);
    if (rank0) {
      std::printf("note: no model block: the model of %s (%s, %d layers, hidden %d, seq_len %d)\n",
                  rd.dir().c_str(), cfg.model.family.c_str(), cfg.model.layers, cfg.model.hidden,
                  cfg.model.seq_len);
    }
  }
  select_device(cfg.train.device, rank0);
  const comm::RankGrid grid(world, cfg.parallelism.tensor, cfg.parallelism.pipeline,
                            cfg.parallelism.order, cfg.parallelism.context);
  apply_elastic_batch(cfg, world);
  resolve_batch(cfg, grid.dp());
  if (rank0) {
    for (const std::string& line : config_notices(cfg, world)) {
      std::printf("note: %s\n", line.c_str());
    }
  }
  std::unique_ptr<comm::ProcessGroups> groups;
  if (world > 1) {
    groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
    for (comm::Communicator* c : {&groups->world(), &groups->dp(), &groups->tp(), &groups->pp(),
                                  &groups->cp(), &groups->dp_cp()}) {
      c->set_timeout(std::chrono::seconds(cfg.parallelism.timeout_s));
    }
  }

  // The demo corpus is prepared by rank 0 while the others wait, then found by all.
  std::string data_path = cfg.data.path;
  if (data_path.empty()) {
    if (rank0) data_path = demo_dataset(cfg.train.run_dir);
    if (groups) groups->world().barrier();
    if (!rank0) data_path = demo_dataset(cfg.train.run_dir);
  }
  data::DataSplits splits = data::open_splits(data_path, cfg.data.val_path, cfg.data.format);
  const data::TokenDataset& dataset = *splits.train;
  Engine engine(cfg, &dataset, groups ? &groups->dp_cp() : nullptr,
                groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                groups ? &groups->cp() : nullptr);
  const int64_t steps = cfg.train.steps;
  const int64_t eval_iters = splits.val ? cfg.train.eval_iters : 0;
  if (eval_iters > 0) engine.set_validation(*splits.val);
  if (rank0) print_data(splits, cfg, engine);
  nlohmann::json resumed;  // {"step", "from"} when this run continues a checkpoint
  if (!resume.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const Engine::Resumed r = engine.load_checkpoint(resume);
    resumed = {{"step", r.step}, {"from", r.dir}};
    if (rank0) {
      std::printf(
          "resumed from %s: step %lld, %lld samples consumed (saved as %s) (read %.2f s) "
          "(%.2f s)\n",
          r.dir.c_str(), static_cast<long long>(r.step), static_cast<long long>(r.consumed_samples),
          r.layout.c_str(), r.read_s,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
    }
    if (r.step >= steps) {
      if (rank0) {
        std::printf(
            "checkpoint is at step %lld >= train.steps=%lld: nothing to train; raise "
            "train.steps (or --steps)\n",
            static_cast<long long>(r.step), static_cast<long long>(steps));
      }
      comm::heartbeat_done();
      return;
    }
  }
  if (rank0 && cfg.checkpoint.dir.empty()) {
    std::printf("note: no checkpoint.dir: nothing will be saved\n");
  }
  comm::heartbeat_step(engine.step());
  const DType pt = cfg.param_dtype();
  const MachinePeak machine = measure_machine_peak(groups ? MPI_COMM_WORLD : MPI_COMM_NULL);
  const double peak = machine.gflops();
  const std::string model_name = cfg.model.preset.empty() ? cfg.model.family : cfg.model.preset;
  std::string model_line(512 + dataset.source().size(), '\0');
  model_line.resize(size_t(std::snprintf(
      model_line.data(), model_line.size(),
      "model %s: %lld parameters (%s), %d layers, hidden %d | batch %lld = micro %lld x "
      "accumulation %lld x dp %d (tp %d, pp %d) | data %s (%lld tokens)",
      model_name.c_str(), static_cast<long long>(engine.spec().global_param_numel), dtype_name(pt),
      cfg.model.layers, cfg.model.hidden, static_cast<long long>(cfg.train_batch_size),
      static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
      static_cast<long long>(cfg.gradient_accumulation_steps), grid.dp(), grid.tp(), grid.pp(),
      dataset.source().c_str(), static_cast<long long>(dataset.num_tokens()))));
  const std::string cpu = kernels::describe_cpu();
  if (rank0) {
    std::printf("%s\n", model_line.c_str());
    std::printf("cpu: %s\nMFU against the machine's %s\n", cpu.c_str(), machine.describe().c_str());
  }
  // Model-state memory per rank, predicted from the layout (ZeRO formula + buffers); the step
  // lines and metrics.jsonl give the measured peaks.
  const int shard = engine.zero() != nullptr ? int(engine.spec().align) : 0;
  const plan::MemoryPrediction predicted =
      plan::predict_memory(plan_layout(engine.config()), engine.spec(), shard);
  if (rank0) std::printf("memory (predicted): %s\n", plan::describe_memory(predicted).c_str());
  const std::string decay = weight_decay_summary(cfg.optimizer, build_model_spec(cfg.model));
  if (rank0 && !decay.empty()) std::printf("%s\n", decay.c_str());
  // Only rank 0 logs: every rank holds the same loss, norm and parameters after a step.
  std::unique_ptr<MetricsLog> log;
  std::unique_ptr<RunMonitors> monitors;
  if (rank0) {
    log = std::make_unique<MetricsLog>(cfg.train.run_dir, engine.step());
    monitors = std::make_unique<RunMonitors>(cfg, engine.consumed_samples());
    if (monitors->any()) std::printf("monitors: %s\n", monitors->describe().c_str());
  }
  const auto [trace_first, trace_last] = parse_trace_steps(a.trace_steps);
  const Fault fault = parse_fault(a.fault);
  if (fault.rank == (comm::initialized() ? comm::world_rank() : 0)) {
    if (fault.action >= 0) engine.inject_fault(fault.step, size_t(fault.action));
    engine.inject_kill(fault.step, fault.phase);
  }
  if (!a.slow.empty()) {
    int r = -1;
    double secs = -1.0;
    long long from = 1;
    char extra = 0;
    const int n = std::sscanf(a.slow.c_str(), "%d:%lf:%lld%c", &r, &secs, &from, &extra);
    STRATA_INPUT_CHECK((n == 2 || n == 3) && r >= 0 && secs >= 0 && secs <= 60 && from >= 1,
                       "--slow ", a.slow,
                       ": expected R:SECONDS or R:SECONDS:FROM_STEP (R >= 0, 0 <= SECONDS <= 60, "
                       "FROM_STEP >= 1), e.g. --slow 1:0.05");
    if (r == (comm::initialized() ? comm::world_rank() : 0)) engine.inject_slowness(from, secs);
  }
  // Stragglers: every rank takes part in each window's gather; rank 0 names the slow ones.
  std::vector<std::string> rank_names;
  if (groups) {
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    std::vector<char> hosts(rank0 ? size_t(world) * sizeof host : 0);
    MPI_Gather(host, sizeof host, MPI_CHAR, hosts.data(), sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 0; rank0 && r < world; ++r) {
      const comm::GridCoord c = grid.coord(r);
      rank_names.push_back("dp " + std::to_string(c.dp) + " tp " + std::to_string(c.tp) + " pp " +
                           std::to_string(c.pp) + " on " +
                           std::string(hosts.data() + size_t(r) * sizeof host));
    }
  }
  // Flight recorder: on a hang every rank's last operations go to <run_dir>/flight, for `strata
  // doctor`; a previous run's records are kept beside it (flight.1, flight.2, ...).
  struct FlightOff {
    ~FlightOff() {
      // On an error the recorder stays on: abort_job writes this rank's record.
      if (std::uncaught_exceptions() == 0) comm::flight::disable();
    }
  } flight_off;
  if (groups) {
    const std::filesystem::path dir = std::filesystem::path(cfg.train.run_dir) / "flight";
    std::error_code ec;
    if (rank0 && !std::filesystem::is_empty(dir, ec) && !ec) {
      int n = 1;
      while (std::filesystem::exists(dir.string() + "." + std::to_string(n))) ++n;
      std::filesystem::rename(dir, dir.string() + "." + std::to_string(n), ec);
    }
    const comm::GridCoord c = groups->coord();
    comm::flight::enable(dir.string(), std::chrono::seconds(cfg.parallelism.timeout_s),
                         "dp " + std::to_string(c.dp) + " tp " + std::to_string(c.tp) + " pp " +
                             std::to_string(c.pp) + " on " + comm::host_name());
  }
  if (rank0) {
    nlohmann::json data = {{"train", list_files(splits.train_files)},
                           {"tokens", dataset.num_tokens()}};
    if (eval_iters > 0) data["val"] = list_files(splits.val_files);
    const RunRecord rec{cfg,
                        grid,
                        engine,
                        model_line,
                        cpu,
                        machine.describe(),
                        resumed,
                        rank_names,
                        a.config,
                        started,
                        apply_overrides(read_config_json(a.config), overrides),
                        data};
    write_run_json(rec);
  }
  StragglerWatch stragglers({cfg.train.straggler_interval, cfg.train.straggler_threshold,
                             cfg.train.straggler_patience, cfg.parallelism.timeout_s},
                            groups ? MPI_COMM_WORLD : MPI_COMM_NULL, rank_names);
  EtaClock eta;
  nlohmann::json trace_events = nlohmann::json::array();
  double trace_offset_us = 0.0;
  const comm::GridCoord coord = groups ? groups->coord() : comm::GridCoord{};
  const std::string& ckpt_dir = cfg.checkpoint.dir;
  for (int64_t i = engine.step(); i < steps; ++i) {
    const bool traced = i + 1 >= trace_first && i + 1 <= trace_last;
    engine.set_tracing(traced);
    StepMetrics s = engine.train_batch();
    comm::heartbeat_step(s.step);
    if (traced) {
      gather_trace(engine, groups ? MPI_COMM_WORLD : MPI_COMM_NULL, rank0, coord, trace_events,
                   trace_offset_us);
    }
    // Validation every eval_interval steps and at the last (Megatron's schedule), by the step
    // number: a resumed run evaluates at the steps an uninterrupted one would.
    const int64_t every = cfg.train.eval_interval;
    std::optional<double> val_loss;
    if (eval_iters > 0 && ((every > 0 && s.step % every == 0) || s.step == steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      val_loss = engine.evaluate(eval_iters);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rank0) log_line(val_line(s.step, *val_loss, secs));
    }
    const std::optional<StragglerReport> window = stragglers.step_done(s);
    if (rank0) {
      log->write(s, peak, val_loss, window ? &window->stats : nullptr);
      if (window) {
        for (const std::string& line : window->named) log_line(line);
      }
      monitors->write(s, engine.consumed_samples(), peak, val_loss);
      eta.step_done(s.step, s.seconds);
      const double left = eta.eta_s(steps);
      const bool print = cfg.steps_per_print > 0 &&
                         (s.step % cfg.steps_per_print == 0 || s.step == 1 || s.step == steps);
      if (print) log_line(progress_line(s, steps, peak, cfg.wall_clock_breakdown, left));
      if (s.step == 1) log_line("memory (measured, step 1): " + describe_peaks(s));
      status_line(live_line(s, steps, peak, left));
    }
    const int64_t interval = cfg.checkpoint.interval;
    if (!ckpt_dir.empty() && ((interval > 0 && s.step % interval == 0) || s.step == steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      engine.save_checkpoint(ckpt_dir);
      if (rank0) {
        char secs[32];
        std::snprintf(secs, sizeof secs, " (%.2f s)",
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        log_line("checkpoint: " +
                 (std::filesystem::path(ckpt_dir) / ckpt::step_dir_name(s.step)).string() + secs);
      }
    }
  }
  if (rank0) end_status_line();
  if (rank0 && trace_last >= trace_first) {
    const std::string path = (std::filesystem::path(cfg.train.run_dir) / "trace.json").string();
    atomic_write(path, nlohmann::json{{"traceEvents", trace_events}}.dump(), IoError::input);
    std::printf("trace of steps %lld-%lld (every rank's actions): %s\n",
                static_cast<long long>(trace_first),
                static_cast<long long>(std::min(trace_last, steps)), path.c_str());
  }
  if (rank0) {
    std::printf("done: %lld steps, metrics in %s\n", static_cast<long long>(steps),
                log->path().c_str());
  }
  comm::heartbeat_done();
}

}  // namespace

void select_device(const std::string& device, bool rank0) {
  if (device != "cuda") {
    if (rank0 && ops::device_count(Device::CUDA) > 0) {
      std::printf(
          "note: a CUDA GPU is visible but train.device is \"cpu\": set train.device=cuda "
          "(or --device cuda) to train on it\n");
    }
    return;
  }
  const int gpus = ops::device_count(Device::CUDA);
  STRATA_INPUT_CHECK(gpus > 0, "train.device=\"cuda\" but no CUDA GPU is visible to this process",
                     " (a driver, a GPU, CUDA_VISIBLE_DEVICES, and strata built with nvcc found);",
                     " set train.device=\"cpu\" to run on the CPU");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local_rank = local != nullptr ? std::max(0, std::atoi(local)) : 0;
  ops::init_device(Device::CUDA, local_rank % gpus);
  set_default_device(Device::CUDA);
}

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a DeepSpeed-style JSON config");
  cmd->add_option("--config,-c", args->config, "config file (DeepSpeed JSON + strata blocks)")
      ->required();
  cmd->add_option("--set", args->overrides, "override a key: --set a.b.c=value (repeatable)");
  cmd->add_option("--steps", args->steps, "optimizer steps of the run in all, >= 1 (train.steps)");
  cmd->add_option("--run-dir", args->run_dir, "directory for metrics and data (train.run_dir)");
  cmd->add_option("--data", args->data, "dataset path (data.path)");
  cmd->add_option("--device", args->device, "cpu or cuda: where each rank computes (train.device)");
  cmd->add_option("--resume", args->resume,
                  "auto (checkpoint.dir's latest, if any) or a checkpoint directory: continue "
                  "that run, in this run's layout, up to train.steps");
  cmd->add_option("--fault", args->fault,
                  "rank=R,step=S,action=N: rank R fails before its action N of step S; "
                  "rank=R,step=S,phase=P: rank R is killed in phase P (forward, backward, reduce, "
                  "optimizer, save) of step S, or hangs alive before its reduction (hang), its "
                  "first forward (hang-forward) or first backward (hang-backward) (tests)");
  cmd->add_option("--slow", args->slow,
                  "R:SECONDS[:FROM_STEP]: rank R computes SECONDS longer before each forward, "
                  "from step FROM_STEP (default 1) on: a straggler on purpose (tests)");
  cmd->add_option("--trace-steps", args->trace_steps,
                  "A:B: write every rank's actions of steps A..B (1-based) as one Chrome trace, "
                  "<run_dir>/trace.json (opens in Perfetto)");
  cmd->callback([args] { run_train(*args); });
}

}  // namespace strata::cli
