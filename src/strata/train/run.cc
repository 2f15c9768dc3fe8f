#include "strata/train/run.h"

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

#include "strata/ckpt/store.h"
#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/comm/heartbeat.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/config/elasticity.h"
#include "strata/config/weight_decay.h"
#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/core/text.h"
#include "strata/cost/layout.h"
#include "strata/cost/predict.h"
#include "strata/data/prepare.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/ops.h"
#include "strata/monitor/metrics.h"
#include "strata/monitor/monitors.h"
#include "strata/monitor/stragglers.h"
#include "strata/train/engine.h"
#include "strata/train/run_record.h"
#include "strata/train/trace.h"

namespace strata {

namespace {

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

// The run's config: the file with the overrides. --resume auto becomes checkpoint.dir's latest
// checkpoint ("" before the first). Without a model block, a resumed run takes the model the
// checkpoint holds (an import records the Hugging Face one): the config is read again with it as
// the model block, so that every check of the layout against the model (heads over tp, blocks
// over stages, ...) sees this model. `overrides` gets that block.
Config load_run_config(const RunOptions& o, std::vector<std::string>& overrides,
                       std::string& resume, bool rank0) {
  // On a resume, `--set model.<field>=...` without a model block in the file changes that field
  // of the checkpoint's model (e.g. a shorter seq_len): read first without those.
  std::vector<std::string> model_sets, rest;
  for (const std::string& s : overrides) {
    (s.rfind("model.", 0) == 0 && !resume.empty() ? model_sets : rest).push_back(s);
  }
  Config cfg = load_config(o.config, rest);
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
  if (cfg.given_model || resume.empty()) {
    return model_sets.empty() ? cfg : load_config(o.config, overrides);
  }
  const ckpt::Reader rd(ckpt::resolve_checkpoint(resume));
  rest.push_back("model=" + model_block_json(rd.manifest().model).dump());
  rest.insert(rest.end(), model_sets.begin(), model_sets.end());
  overrides = rest;
  cfg = load_config(o.config, overrides);
  if (rank0) {
    std::printf("note: no model block: the model of %s (%s, %d layers, hidden %d, seq_len %d)\n",
                rd.dir().c_str(), cfg.model.family.c_str(), cfg.model.layers, cfg.model.hidden,
                cfg.model.seq_len);
  }
  return cfg;
}

// "dp D tp T pp P on HOST" of every rank, on rank 0 (the straggler watch and run.json name ranks
// so); collective over the world.
std::vector<std::string> rank_names(const comm::RankGrid& grid, int world, bool rank0) {
  std::vector<std::string> names;
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::vector<char> hosts(rank0 ? size_t(world) * sizeof host : 0);
  MPI_Gather(host, sizeof host, MPI_CHAR, hosts.data(), sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
  for (int r = 0; rank0 && r < world; ++r) {
    const comm::GridCoord c = grid.coord(r);
    names.push_back("dp " + std::to_string(c.dp) + " tp " + std::to_string(c.tp) + " pp " +
                    std::to_string(c.pp) + " on " +
                    std::string(hosts.data() + size_t(r) * sizeof host));
  }
  return names;
}

// The flight recorder: on a hang every rank's last operations go to <run_dir>/flight, for `strata
// doctor`; a previous run's records are kept beside it (flight.1, flight.2, ...). Turned off at
// the end of a run that ends without an error (on an error abort_job writes this rank's record).
struct FlightRecording {
  FlightRecording(const comm::ProcessGroups& groups, const Config& cfg, bool rank0) {
    const std::filesystem::path dir = std::filesystem::path(cfg.train.run_dir) / "flight";
    std::error_code ec;
    if (rank0 && !std::filesystem::is_empty(dir, ec) && !ec) {
      int n = 1;
      while (std::filesystem::exists(dir.string() + "." + std::to_string(n))) ++n;
      std::filesystem::rename(dir, dir.string() + "." + std::to_string(n), ec);
    }
    const comm::GridCoord c = groups.coord();
    comm::flight::enable(dir.string(), std::chrono::seconds(cfg.parallelism.timeout_s),
                         "dp " + std::to_string(c.dp) + " tp " + std::to_string(c.tp) + " pp " +
                             std::to_string(c.pp) + " on " + comm::host_name());
  }
  ~FlightRecording() {
    if (std::uncaught_exceptions() == 0) comm::flight::disable();
  }
  FlightRecording(const FlightRecording&) = delete;
  FlightRecording& operator=(const FlightRecording&) = delete;
};

// The line that says what trains: the model, the batch and the data.
std::string model_line(const Config& cfg, const Engine& engine, const comm::RankGrid& grid,
                       const data::TokenDataset& dataset) {
  const std::string name = cfg.model.preset.empty() ? cfg.model.family : cfg.model.preset;
  std::string line(512 + dataset.source().size(), '\0');
  line.resize(size_t(std::snprintf(
      line.data(), line.size(),
      "model %s: %lld parameters (%s), %d layers, hidden %d | batch %lld = micro %lld x "
      "accumulation %lld x dp %d (tp %d, pp %d) | data %s (%lld tokens)",
      name.c_str(), static_cast<long long>(engine.spec().global_param_numel),
      dtype_name(cfg.param_dtype()), cfg.model.layers, cfg.model.hidden,
      static_cast<long long>(cfg.train_batch_size),
      static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
      static_cast<long long>(cfg.gradient_accumulation_steps), grid.dp(), grid.tp(), grid.pp(),
      dataset.source().c_str(), static_cast<long long>(dataset.num_tokens()))));
  return line;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0's view of a run's steps: the metrics log, the monitors, the progress lines.
struct Reporting {
  std::unique_ptr<MetricsLog> log;
  std::unique_ptr<RunMonitors> monitors;
  EtaClock eta;
  double peak = 0;  // the machine's GFLOP/s, for MFU

  void step(const Config& cfg, const StepMetrics& s, int64_t steps, int64_t consumed,
            const std::optional<double>& val_loss, const std::optional<StragglerReport>& window) {
    log->write(s, peak, val_loss, window ? &window->stats : nullptr);
    if (window) {
      for (const std::string& line : window->named) log_line(line);
    }
    monitors->write(s, consumed, peak, val_loss);
    eta.step_done(s.step, s.seconds);
    const double left = eta.eta_s(steps);
    const bool print = cfg.steps_per_print > 0 &&
                       (s.step % cfg.steps_per_print == 0 || s.step == 1 || s.step == steps);
    if (print) log_line(progress_line(s, steps, peak, cfg.wall_clock_breakdown, left));
    if (s.step == 1) log_line("memory (measured, step 1): " + describe_peaks(s));
    status_line(live_line(s, steps, peak, left));
  }
};

}  // namespace

void run_training(const RunOptions& o) {
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");  // ISO 8601
  const int world = comm::initialized() ? comm::world_size() : 1;
  const int rank = comm::initialized() ? comm::world_rank() : 0;
  const bool rank0 = rank == 0;
  split_cores_between_local_ranks();
  comm::start_heartbeat(rank, world);
  // A bad STRATA_BF16_MATMUL is an input error on every rank before anything is built.
  kernels::bf16_matmul_path();
  std::vector<std::string> overrides = o.overrides;
  std::string resume = o.resume;
  Config cfg = load_run_config(o, overrides, resume, rank0);
  select_device(cfg.train.device, rank0);
  const comm::RankGrid grid(world, cfg.parallelism.tensor, cfg.parallelism.pipeline,
                            cfg.parallelism.order, cfg.parallelism.context);
  apply_elastic_batch(cfg, world);
  resolve_batch(cfg, grid.dp());
  if (rank0) {
    for (const std::string& line : config_notices(cfg, world))
      std::printf("note: %s\n", line.c_str());
  }
  std::unique_ptr<comm::ProcessGroups> groups;
  if (world > 1) {
    groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
    for (comm::Communicator* c : {&groups->world(), &groups->dp(), &groups->tp(), &groups->pp(),
                                  &groups->cp(), &groups->dp_cp()}) {
      c->set_timeout(std::chrono::seconds(cfg.parallelism.timeout_s));
    }
  }
  const MPI_Comm world_comm = groups ? MPI_COMM_WORLD : MPI_COMM_NULL;

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
  nlohmann::json resumed;
  if (!resume.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const Engine::Resumed r = engine.load_checkpoint(resume);
    resumed = {{"step", r.step}, {"from", r.dir}};
    if (rank0) {
      std::printf(
          "resumed from %s: step %lld, %lld samples consumed (saved as %s) (read %.2f s) "
          "(%.2f s)\n",
          r.dir.c_str(), static_cast<long long>(r.step), static_cast<long long>(r.consumed_samples),
          r.layout.c_str(), r.read_s, seconds_since(t0));
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
  const MachinePeak machine = measure_machine_peak(world_comm);
  const std::string line = model_line(cfg, engine, grid, dataset);
  const std::string cpu = kernels::describe_cpu();
  if (rank0) {
    std::printf("%s\n", line.c_str());
    std::printf("cpu: %s\nMFU against the machine's %s\n", cpu.c_str(), machine.describe().c_str());
  }
  // Model-state memory per rank, predicted from the layout (ZeRO formula + buffers); the step
  // lines and metrics.jsonl give the measured peaks.
  const int shard = engine.zero() != nullptr ? int(engine.spec().align) : 0;
  const cost::MemoryPrediction predicted =
      cost::predict_memory(cost::layout_of(engine.config()), engine.spec(), shard);
  if (rank0) std::printf("memory (predicted): %s\n", cost::describe_memory(predicted).c_str());
  const std::string decay = weight_decay_summary(cfg.optimizer, build_model_spec(cfg.model));
  if (rank0 && !decay.empty()) std::printf("%s\n", decay.c_str());
  // Only rank 0 reports: every rank holds the same loss, norm and parameters after a step.
  Reporting report;
  report.peak = machine.gflops();
  if (rank0) {
    report.log = std::make_unique<MetricsLog>(cfg.train.run_dir, engine.step());
    report.monitors = std::make_unique<RunMonitors>(cfg, engine.consumed_samples());
    if (report.monitors->any()) std::printf("monitors: %s\n", report.monitors->describe().c_str());
  }
  engine.set_faults(pipeline::FaultInjector::for_rank(o.faults, rank));
  const std::vector<std::string> names =
      groups ? rank_names(grid, world, rank0) : std::vector<std::string>{};
  std::optional<FlightRecording> flight;
  if (groups) flight.emplace(*groups, cfg, rank0);
  if (rank0) {
    nlohmann::json data = {{"train", list_files(splits.train_files)},
                           {"tokens", dataset.num_tokens()}};
    if (eval_iters > 0) data["val"] = list_files(splits.val_files);
    write_run_json({cfg, grid, engine, line, cpu, machine.describe(), resumed, names, o.config,
                    started, apply_overrides(read_config_json(o.config), overrides), data,
                    o.version, o.command_line});
  }
  // Stragglers: every rank takes part in each window's gather; rank 0 names the slow ones.
  StragglerWatch stragglers({cfg.train.straggler_interval, cfg.train.straggler_threshold,
                             cfg.train.straggler_patience, cfg.parallelism.timeout_s},
                            world_comm, names);
  StepTrace trace(world_comm, rank0, groups ? groups->coord() : comm::GridCoord{});
  const std::string& ckpt_dir = cfg.checkpoint.dir;
  for (int64_t i = engine.step(); i < steps; ++i) {
    const bool traced = i + 1 >= o.trace_first && i + 1 <= o.trace_last;
    engine.set_tracing(traced);
    const StepMetrics s = engine.train_batch();
    comm::heartbeat_step(s.step);
    if (traced) trace.gather(engine.last_trace());
    // Validation every eval_interval steps and at the last (Megatron's schedule), by the step
    // number: a resumed run evaluates at the steps an uninterrupted one would.
    const int64_t every = cfg.train.eval_interval;
    std::optional<double> val_loss;
    if (eval_iters > 0 && ((every > 0 && s.step % every == 0) || s.step == steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      val_loss = engine.evaluate(eval_iters);
      if (rank0) log_line(val_line(s.step, *val_loss, seconds_since(t0)));
    }
    const std::optional<StragglerReport> window = stragglers.step_done(s);
    if (rank0) report.step(cfg, s, steps, engine.consumed_samples(), val_loss, window);
    const int64_t interval = cfg.checkpoint.interval;
    if (!ckpt_dir.empty() && ((interval > 0 && s.step % interval == 0) || s.step == steps)) {
      const auto t0 = std::chrono::steady_clock::now();
      engine.save_checkpoint(ckpt_dir);
      if (rank0) {
        char secs[32];
        std::snprintf(secs, sizeof secs, " (%.2f s)", seconds_since(t0));
        log_line("checkpoint: " +
                 (std::filesystem::path(ckpt_dir) / ckpt::step_dir_name(s.step)).string() + secs);
      }
    }
  }
  if (rank0) end_status_line();
  if (rank0 && o.trace_last >= o.trace_first) {
    const std::string path = (std::filesystem::path(cfg.train.run_dir) / "trace.json").string();
    trace.write(path);
    std::printf("trace of steps %lld-%lld (every rank's actions): %s\n",
                static_cast<long long>(o.trace_first),
                static_cast<long long>(std::min(o.trace_last, steps)), path.c_str());
  }
  if (rank0) {
    std::printf("done: %lld steps, metrics in %s\n", static_cast<long long>(steps),
                report.log->path().c_str());
  }
  comm::heartbeat_done();
}

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

}  // namespace strata
