// Engine::save_checkpoint and load_checkpoint: each rank writes the elements it owns under their
// global indices, and reads back, from whatever layout saved them, exactly the elements its own
// layout needs (ckpt/slices.h). The optimizer's ranges are the unit of both: the ranges it steps
// are the elements this rank holds master weights and moments for.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "strata/ckpt/manifest.h"
#include "strata/ckpt/slices.h"
#include "strata/ckpt/store.h"
#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/core/check.h"
#include "strata/kernels/ops.h"
#include "strata/train/engine.h"
#include "strata/zero/zero_sync.h"

namespace strata {

namespace fs = std::filesystem;
using ckpt::Chunk;
using ckpt::Segment;

int Engine::world_id() const {
  const int tp = tp_comm_ != nullptr ? tp_comm_->size() : 1;
  const int tr = tp_comm_ != nullptr ? tp_comm_->rank() : 0;
  return (stage_ * dp_size_ + dp_rank_) * tp + tr;
}

bool Engine::all_ok(bool ok) {
  float failed = ok ? 0.0f : 1.0f;
  for (comm::Communicator* c : {tp_comm_, dp_, pp_comm_}) {
    if (c != nullptr && c->size() > 1) c->all_reduce(&failed, 1, DType::F32, DType::F32);
  }
  return failed == 0.0f;
}

std::string Engine::layout_name() const {
  const int tp = tp_comm_ != nullptr ? tp_comm_->size() : 1;
  const ParallelismConfig& p = cfg_.parallelism;
  std::string s = "dp " + std::to_string(data_size_);
  if (cp_size_ > 1) s += " x cp " + std::to_string(cp_size_) + " (" + p.context_impl + ")";
  s += " x tp " + std::to_string(tp) + " x pp " + std::to_string(stages_);
  if (spec_.ep.size > 1) s += " x ep " + std::to_string(spec_.ep.size);
  if (stages_ > 1) s += " (" + p.schedule + ", virtual " + std::to_string(p.virtual_stages) + ")";
  s += ", ZeRO " + std::to_string(shard_ != nullptr ? cfg_.zero.stage : 0) + ", micro-batch " +
       std::to_string(cfg_.train_micro_batch_size_per_gpu) + " x " +
       std::to_string(cfg_.gradient_accumulation_steps);
  return s;
}

namespace {

// The parameter holding optimizer range r (ranges are in flat order, within one parameter).
struct RangeParams {
  const ModelSpec& spec;
  size_t pi = 0;
  const ParamSpec& of(const ParamRange& r) {
    while (!spec.params[pi].held || spec.params[pi].offset + spec.params[pi].numel() <= r.offset) {
      ++pi;
    }
    return spec.params[pi];
  }
};

const char* const kAdamKinds[2] = {ckpt::kExpAvg, ckpt::kExpAvgSq};
const char* const kSgdKinds[2] = {ckpt::kMomentum, nullptr};

// Runs a collective step: every rank's exception becomes an error on all of them, of one kind: a
// runtime Error (exit 1, which the elastic supervisor retries) when any rank's was one (a disk
// that failed), else an InputError (exit 2).
template <typename F>
void on_every_rank(Engine& e, bool (Engine::*all_ok)(bool), const char* what, F&& f) {
  std::string error;
  bool input = true;
  try {
    f();
  } catch (const InputError& x) {
    error = x.what();
  } catch (const std::exception& x) {
    error = x.what(), input = false;
  }
  if ((e.*all_ok)(error.empty())) return;
  // Every rank gets here, so the second reduction is collective too.
  const bool all_input = (e.*all_ok)(error.empty() || input);
  if (error.empty()) error = std::string(what) + " failed on another rank (its error says why)";
  if (all_input) throw InputError(error);
  STRATA_RUNTIME_FAIL(error);
}

}  // namespace

void Engine::save_checkpoint(const std::string& root) {
  comm::flight::set_activity(step_, "checkpoint save");
  const std::string name = ckpt::step_dir_name(step_);
  const fs::path tmp = fs::path(root) / ("." + name + ".tmp");
  const int id = world_id();
  on_every_rank(*this, &Engine::all_ok, "saving the checkpoint", [&] {
    if (id != 0) return;
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directory(tmp);
  });

  ckpt::Manifest m;
  m.model = cfg_.model;
  m.optimizer = cfg_.optimizer.type;
  m.step = step_;
  m.optimizer_steps = optimizer_->steps_taken();
  m.consumed_samples = consumed_samples_;
  m.seed = cfg_.train.seed;
  const LossScaler::State sc = scaler_.state();
  m.scaler = {sc.scale, sc.iter, sc.last_overflow_iter, sc.hysteresis_left};
  m.layout = layout_name();
  for (int l = 0; l < cfg_.model.layers && !expert_bias_.empty(); ++l) {
    if (!cfg_.model.moe_layer(l)) continue;
    const float* b = expert_bias_.data() + size_t(l) * size_t(cfg_.model.moe.experts);
    m.expert_bias[l].assign(b, b + cfg_.model.moe.experts);
  }
  for (const ParamSpec& p : spec_.params) {
    if (p.held) m.tensors[p.name] = p.global_shape;
  }

  const auto write_part = [&] {
    // One writer per element: ZeRO's owner (the first replica group's under MiCS), dp rank 0
    // without ZeRO; tp rank 0 of replicated elements; the first stage of a tied embedding.
    // Expert parallelism without ZeRO: the first rank of each expert-data-parallel group writes
    // its experts.
    const bool writer =
        shard_ != nullptr ? replica_comm_ == nullptr || replica_comm_->rank() == 0 : dp_rank_ == 0;
    const bool expert_writer =
        shard_ != nullptr || edp_comm_ == nullptr ? writer : edp_comm_->rank() == 0;
    if (!writer && !expert_writer) return;
    const int tr = tp_comm_ != nullptr ? tp_comm_->rank() : 0;
    const bool tied_copy = stages_ > 1 && stage_ == stages_ - 1 && cfg_.model.tied_embeddings;
    const char* const* moments = cfg_.optimizer.type == "sgd" ? kSgdKinds : kAdamKinds;
    std::vector<ckpt::PendingChunk> chunks;
    RangeParams params{spec_};
    for (const ParamRange& r : optimizer_->ranges()) {
      const ParamSpec& p = params.of(r);
      if (tied_copy && p.role == ParamRole::TokenEmbedding) continue;
      const bool expert = p.role == ParamRole::ExpertGateUpW || p.role == ParamRole::ExpertDownW;
      if (!(expert ? expert_writer : writer)) continue;
      const int64_t begin = r.offset - p.offset;
      const std::vector<Segment> segs = ckpt::global_segments(p, begin, r.numel);
      // Chunks of consecutive written segments (a replicated segment another rank writes
      // breaks one).
      for (size_t s0 = 0; s0 < segs.size();) {
        if (tr % segs[s0].replicas != 0) {
          ++s0;
          continue;
        }
        size_t s1 = s0 + 1;
        while (s1 < segs.size() && tr % segs[s1].replicas == 0 &&
               segs[s1].local == segs[s1 - 1].local + segs[s1 - 1].len) {
          ++s1;
        }
        const std::vector<Segment> part(segs.begin() + long(s0), segs.begin() + long(s1));
        const int64_t local = part.front().local;
        int64_t numel = 0;
        for (const Segment& s : part) numel += s.len;
        const float* sources[3] = {optimizer_->master_of(r), optimizer_->moment_of(0, r),
                                   optimizer_->moment_of(1, r)};
        const char* kinds[3] = {ckpt::kMaster, moments[0], moments[1]};
        for (int k = 0; k < 3; ++k) {
          if (sources[k] == nullptr || kinds[k] == nullptr) continue;
          ckpt::PendingChunk c;
          c.meta.kind = kinds[k], c.meta.tensor = p.name, c.meta.numel = numel;
          c.meta.runs = ckpt::compress(part);
          c.data = sources[k] + local;
          chunks.push_back(std::move(c));
        }
        s0 = s1;
      }
    }
    if (chunks.empty()) return;
    const std::string file = ckpt::rank_file_name(id);
    const int64_t bytes = ckpt::write_rank_file((tmp / file).string(), chunks);
    ckpt::Manifest part = m;
    part.files = {{file, bytes}};
    for (ckpt::PendingChunk& c : chunks) part.chunks.push_back(std::move(c.meta));
    ckpt::write_file_atomic((tmp / (file + ".json")).string(), ckpt::to_json(part));
  };
  on_every_rank(*this, &Engine::all_ok, "saving the checkpoint", [&] {
    write_part();
    faults_.at(KillPhase::Save, step_);  // before every rank has written: nothing is committed
  });

  on_every_rank(*this, &Engine::all_ok, "saving the checkpoint", [&] {
    if (id != 0) return;
    // Every writer's chunks into one manifest; then the directory becomes the checkpoint.
    std::vector<fs::path> parts;
    for (const fs::directory_entry& e : fs::directory_iterator(tmp)) {
      if (e.path().extension() == ".json") parts.push_back(e.path());
    }
    std::sort(parts.begin(), parts.end());
    for (const fs::path& p : parts) {
      std::ifstream in(p);
      std::stringstream text;
      text << in.rdbuf();
      ckpt::Manifest part = ckpt::parse_manifest(text.str(), p.string());
      const int file = int(m.files.size());
      m.files.push_back(part.files.at(0));
      for (ckpt::Chunk& c : part.chunks) {
        c.file = file;
        m.chunks.push_back(std::move(c));
      }
      for (auto& [tensor, shape] : part.tensors) m.tensors[tensor] = shape;
    }
    ckpt::write_file_atomic((tmp / "manifest.json").string(), ckpt::to_json(m));
    for (const fs::path& p : parts) fs::remove(p);
    ckpt::commit(root, tmp.string(), name);
  });
}

Engine::Resumed Engine::load_checkpoint(const std::string& path) {
  comm::flight::set_activity(step_, "checkpoint load");
  Resumed out;
  const auto t0 = std::chrono::steady_clock::now();
  on_every_rank(*this, &Engine::all_ok, "loading the checkpoint", [&] {
    out.dir = ckpt::resolve_checkpoint(path);
    ckpt::Reader rd(out.dir);
    const ckpt::Manifest& m = rd.manifest();
    // Fine-tuning at a shorter seq_len than the checkpoint's: the same model but for the
    // position table, whose first rows are read (GPT-2's wpe; Llama's RoPE has none).
    ModelConfig at_saved_len = cfg_.model;
    at_saved_len.seq_len = m.model.seq_len;
    const bool shorter = cfg_.model.seq_len < m.model.seq_len &&
                         ckpt::model_difference(m.model, at_saved_len).empty();
    const std::string diff = ckpt::model_difference(m.model, cfg_.model);
    if (!diff.empty() && !shorter) {
      STRATA_INPUT_FAIL("the checkpoint ", out.dir, " holds a different model (", diff,
                        "); load it with the model it was saved with (a shorter seq_len is the "
                        "one difference allowed), or drop the model block to take the "
                        "checkpoint's");
    }
    if (shorter) {
      out.notes.push_back("model.seq_len " + std::to_string(cfg_.model.seq_len) +
                          " is shorter than the checkpoint's " + std::to_string(m.model.seq_len) +
                          (cfg_.model.gpt2_block()
                               ? ": the position table's first rows are loaded"
                               : ": RoPE has no position table, nothing is cut"));
    }
    auto prefix_rows = [&](const ParamSpec& p, const std::vector<int64_t>& saved) {
      return shorter && p.role == ParamRole::PositionEmbedding && saved.size() == 2 &&
             p.global_shape.size() == 2 && saved[0] >= p.global_shape[0] &&
             saved[1] == p.global_shape[1];
    };
    for (const ParamSpec& p : spec_.params) {
      const auto t = m.tensors.find(p.name);
      if (p.held &&
          (t == m.tensors.end() || (t->second != p.global_shape && !prefix_rows(p, t->second)))) {
        STRATA_INPUT_FAIL("the checkpoint ", out.dir, " has no tensor ", p.name, " of shape ",
                          p.global_shape.size() > 1 ? std::to_string(p.global_shape[0]) + "x" +
                                                          std::to_string(p.global_shape[1])
                                                    : std::to_string(p.global_shape[0]),
                          ": it is a checkpoint of another model");
      }
    }
    const char* const* moments = cfg_.optimizer.type == "sgd" ? kSgdKinds : kAdamKinds;
    bool with_moments = false;
    for (const char* k : {ckpt::kExpAvg, ckpt::kExpAvgSq, ckpt::kMomentum}) {
      with_moments |= rd.has(k);
    }
    if (with_moments && m.optimizer != cfg_.optimizer.type) {
      STRATA_INPUT_FAIL("the checkpoint ", out.dir, " holds ", m.optimizer,
                        " optimizer state; this run's optimizer.type is ", cfg_.optimizer.type);
    }
    // SGD without momentum keeps no moments, only its step count: its own checkpoint resumes it
    // (the learning rate schedule continues) rather than counting as weights only.
    with_moments |= cfg_.optimizer.type == "sgd" && cfg_.optimizer.momentum == 0.0f &&
                    m.optimizer == cfg_.optimizer.type;
    auto fill = [&](const char* kind, const ParamSpec& p, int64_t begin, int64_t n, float* dst) {
      const std::vector<Segment> segs = ckpt::global_segments(p, begin, n);
      int64_t covered = 0;
      for (const Segment& s : segs) covered += s.len;
      if (covered < n) ops::fill_zero(Tensor(dst, DType::F32, {n}));  // padding stays zero
      rd.plan(kind, p.name, segs, dst);
    };
    RangeParams params{spec_};
    for (const ParamRange& r : optimizer_->ranges()) {
      const ParamSpec& p = params.of(r);
      const int64_t begin = r.offset - p.offset;
      fill(ckpt::kMaster, p, begin, r.numel, optimizer_->master_of(r));
      for (int k = 0; k < 2; ++k) {
        float* dst = optimizer_->moment_of(k, r);
        if (dst == nullptr || moments[k] == nullptr) continue;
        if (with_moments) {
          fill(moments[k], p, begin, r.numel, dst);
        } else {
          ops::fill_zero(Tensor(dst, DType::F32, {r.numel}));
        }
      }
    }
    rd.run();  // every planned chunk, in file order
    optimizer_->set_steps_taken(with_moments ? m.optimizer_steps : 0);
    // A run without fp16 saved the disabled scaler (scale 1, never updated): keep this run's
    // initial scale then.
    // A static fp16.loss_scale in this run's config wins over the saved scale (DeepSpeed would
    // reload the saved scaler; a static scale asked for at resume is taken as meant).
    const bool saved_scaler = m.scaler.iter > 0 || m.scaler.scale != 1.0f;
    if (cfg_.fp16.enabled && saved_scaler && scaler_.dynamic()) {
      scaler_.restore(
          {m.scaler.scale, m.scaler.iter, m.scaler.last_overflow_iter, m.scaler.hysteresis_left});
    } else if (cfg_.fp16.enabled && saved_scaler && m.scaler.scale != scaler_.scale()) {
      std::ostringstream note;
      note << "fp16.loss_scale=" << scaler_.scale()
           << " is static: it replaces the checkpoint's loss scale " << m.scaler.scale
           << (m.scaler.iter > 0 ? " (dynamic)" : "");
      out.notes.push_back(note.str());
    }
    // The sigmoid router's bias: the checkpoint's where it has one, else 0 (an import, or a
    // checkpoint of a softmax router: the same model but for how it routes).
    std::fill(expert_bias_.begin(), expert_bias_.end(), 0.0f);
    for (const auto& [layer, bias] : m.expert_bias) {
      if (expert_bias_.empty()) break;
      std::copy(bias.begin(), bias.end(),
                expert_bias_.begin() + int64_t(layer) * cfg_.model.moe.experts);
    }
    step_ = m.step;
    consumed_samples_ = m.consumed_samples;
    out.step = m.step, out.consumed_samples = m.consumed_samples, out.layout = m.layout;
    if (!with_moments) {
      out.notes.push_back("the checkpoint holds weights only: the optimizer starts afresh");
    }
    if (with_moments && m.seed != cfg_.train.seed) {
      out.notes.push_back("the checkpoint was trained with train.seed " + std::to_string(m.seed) +
                          ", this run uses " + std::to_string(cfg_.train.seed) +
                          ": the data order after the resume differs from the saved run's");
    }
  });
  out.read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  optimizer_->publish();
  if (shard_ != nullptr) sync_->after_step();
  return out;
}

}  // namespace strata
