// strata ckpt: describe, verify, export and import checkpoints (DESIGN.md §7), and the logits of
// a checkpoint's model for comparing it with another implementation (bench/hf_compare.py).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "strata/ckpt/hf.h"
#include "strata/ckpt/manifest.h"
#include "strata/ckpt/store.h"
#include "strata/config/config.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/ops.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

struct CkptArgs {
  std::string path, out, format = "hf", dtype = "fp32", config, tokens;
  int batch = 1;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A tensor's whole fp32 master weights.
std::vector<float> whole(ckpt::Reader& rd, const ParamSpec& p) {
  std::vector<float> out(size_t(numel_of(p.global_shape)));
  rd.read(ckpt::kMaster, p.name, 0, int64_t(out.size()), out.data());
  return out;
}

void info(const CkptArgs& a) {
  ckpt::Reader rd(ckpt::resolve_checkpoint(a.path));
  const ckpt::Manifest& m = rd.manifest();
  const ModelConfig& mc = m.model;
  int64_t params = 0, bytes = 0;
  for (const auto& [name, shape] : m.tensors) params += numel_of(shape);
  for (const ckpt::Manifest::File& f : m.files) bytes += f.bytes;
  std::set<std::string> kinds;
  for (const ckpt::Chunk& c : m.chunks) kinds.insert(c.kind);
  std::string stored;
  for (const std::string& k : kinds) stored += (stored.empty() ? "" : ", ") + k;
  std::printf("checkpoint %s (format %d)\n", rd.dir().c_str(), m.format);
  std::printf(
      "model: %s, %d layers, hidden %d, %d heads (%d kv), ffn %d, vocab %d, seq_len %d%s: "
      "%lld parameters in %zu tensors\n",
      mc.family.c_str(), mc.layers, mc.hidden, mc.heads, mc.kv_heads, mc.ffn_hidden, mc.vocab,
      mc.seq_len, mc.tied_embeddings ? ", tied embeddings" : "", static_cast<long long>(params),
      m.tensors.size());
  std::printf(
      "training: step %lld (%lld optimizer steps), %lld samples consumed, seed %llu, "
      "optimizer %s, loss scale %g\n",
      static_cast<long long>(m.step), static_cast<long long>(m.optimizer_steps),
      static_cast<long long>(m.consumed_samples), static_cast<unsigned long long>(m.seed),
      m.optimizer.empty() ? "(none: weights only)" : m.optimizer.c_str(), m.scaler.scale);
  std::printf("saved from: %s\n", m.layout.c_str());
  std::printf("stored: %s; %zu chunks in %zu files, %s\n", stored.c_str(), m.chunks.size(),
              m.files.size(), format_bytes(size_t(bytes)).c_str());
}

void verify(const CkptArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  ckpt::Reader rd(ckpt::resolve_checkpoint(a.path));
  const int64_t bytes = rd.verify_all();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "ok: %s: the manifest is consistent, every tensor is covered once, each data file's "
      "safetensors header agrees with it and all %zu chunks match their checksums (%s in "
      "%.2f s)\n",
      rd.dir().c_str(), rd.manifest().chunks.size(), format_bytes(size_t(bytes)).c_str(), s);
}

void export_checkpoint(const CkptArgs& a) {
  STRATA_INPUT_CHECK(a.format == "hf", "ckpt export --format ", a.format,
                     ": the only format is hf (Hugging Face safetensors + config.json)");
  STRATA_INPUT_CHECK(a.dtype == "fp32" || a.dtype == "bf16", "ckpt export --dtype ", a.dtype,
                     ": use fp32 or bf16");
  ckpt::Reader rd(ckpt::resolve_checkpoint(a.path));
  const ModelSpec spec = build_model_spec(rd.manifest().model);
  ckpt::export_hf(
      spec, [&](const ParamSpec& p) { return whole(rd, p); },
      a.dtype == "bf16" ? DType::BF16 : DType::F32, a.out);
  std::printf("exported %s (step %lld) to %s/model.safetensors and config.json\n", rd.dir().c_str(),
              static_cast<long long>(rd.manifest().step), a.out.c_str());
}

// A weights-only checkpoint (step 0, no optimizer state) from a Hugging Face model: `strata train
// --resume OUT` starts training from it.
void import_checkpoint(const CkptArgs& a) {
  ModelConfig model;
  if (!a.config.empty()) {
    model = load_config(a.config).model;
    STRATA_INPUT_CHECK(model.layers > 0, a.config,
                       " has no model block; give one, or drop "
                       "--config to read the model from config.json");
  } else {
    model = ckpt::model_config_from_hf(a.path);
  }
  const ModelSpec spec = build_model_spec(model);
  std::map<std::string, std::vector<float>> tensors = ckpt::import_hf(a.path, spec);
  fs::create_directories(a.out);
  const std::string name = ckpt::step_dir_name(0);
  const fs::path tmp = fs::path(a.out) / ("." + name + ".tmp");
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  ckpt::Manifest m;
  m.model = model;
  m.layout = "imported from " + a.path;
  std::vector<ckpt::PendingChunk> chunks;
  for (const ParamSpec& p : spec.params) {
    const std::vector<float>& t = tensors.at(p.name);
    m.tensors[p.name] = p.global_shape;
    ckpt::PendingChunk c;
    c.meta.kind = ckpt::kMaster, c.meta.tensor = p.name, c.meta.numel = int64_t(t.size());
    c.meta.runs = {{0, int64_t(t.size()), 1, 0}};
    c.data = t.data();
    chunks.push_back(std::move(c));
  }
  const std::string file = ckpt::rank_file_name(0);
  m.files = {{file, ckpt::write_rank_file((tmp / file).string(), chunks)}};
  for (ckpt::PendingChunk& c : chunks) m.chunks.push_back(std::move(c.meta));
  ckpt::write_file_atomic((tmp / "manifest.json").string(), ckpt::to_json(m));
  ckpt::commit(a.out, tmp.string(), name);
  std::printf("imported %s (%s, %d layers, hidden %d) as %s/%s: train from it with --resume %s\n",
              a.path.c_str(), model.family.c_str(), model.layers, model.hidden, a.out.c_str(),
              name.c_str(), a.out.c_str());
}

// The logits of the checkpoint's model (fp32, one process) for int32 token ids: B·T·V floats.
void logits(const CkptArgs& a) {
  ckpt::Reader rd(ckpt::resolve_checkpoint(a.path));
  const ModelConfig& mc = rd.manifest().model;
  const ModelSpec spec = build_model_spec(mc);
  std::vector<float> params(size_t(spec.numel), 0.0f);
  for (const ParamSpec& p : spec.params) {
    const std::vector<float> t = whole(rd, p);
    std::copy(t.begin(), t.end(), params.begin() + p.offset);
  }
  std::ifstream in(a.tokens, std::ios::binary | std::ios::ate);
  STRATA_INPUT_CHECK(in.good(), "cannot read --tokens ", a.tokens);
  const int64_t bytes = in.tellg();
  const int64_t n = bytes / 4;
  STRATA_INPUT_CHECK(bytes % 4 == 0 && a.batch > 0 && n > 0 && n % a.batch == 0, a.tokens,
                     " holds ", bytes, " bytes: expected --batch ", a.batch,
                     " rows of int32 token ids");
  const int T = int(n / a.batch);
  STRATA_INPUT_CHECK(T <= mc.seq_len, a.tokens, " has rows of ", T,
                     " tokens, more than the "
                     "model's seq_len ",
                     mc.seq_len);
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n), -1);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens.data()), bytes);
  for (int32_t t : tokens) {
    STRATA_INPUT_CHECK(t >= 0 && t < mc.vocab, a.tokens, " has token id ", t, " outside the ",
                       mc.vocab, "-word vocabulary");
  }
  auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), nullptr, a.batch, T);
  model->forward(tokens.data(), targets.data(), 1.0f, false);
  const Tensor l = model->logits(0);
  const int64_t V = spec.tp.vocab_rows;
  // The logits live in device memory: read back through the kernel interface.
  std::vector<float> host(size_t(l.numel()));
  ops::copy_to_host(host.data(), l);
  AtomicFile out(a.out, IoError::input);
  for (int64_t r = 0; r < n; ++r) {
    out.write(host.data() + r * V, sizeof(float) * size_t(mc.vocab));
  }
  out.commit();
  std::printf("logits of %s: %d x %d tokens x %d vocabulary (float32) -> %s\n", rd.dir().c_str(),
              a.batch, T, mc.vocab, a.out.c_str());
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto a = std::make_shared<CkptArgs>();
  CLI::App* cmd = app.add_subcommand("ckpt", "Describe, verify, export and import checkpoints");
  cmd->require_subcommand(1);
  CLI::App* i = cmd->add_subcommand("info", "Describe a checkpoint (a step directory or a root)");
  i->add_option("path", a->path, "checkpoint")->required();
  i->callback([a] { info(*a); });
  CLI::App* v = cmd->add_subcommand(
      "verify", "Check a checkpoint: manifest, coverage of every tensor, every chunk's checksum");
  v->add_option("path", a->path, "checkpoint")->required();
  v->callback([a] { verify(*a); });
  CLI::App* e = cmd->add_subcommand(
      "export", "Write a checkpoint's weights as one Hugging Face safetensors file + config.json");
  e->add_option("path", a->path, "checkpoint")->required();
  e->add_option("--format", a->format, "hf")->capture_default_str();
  e->add_option("--out,-o", a->out, "output directory")->required();
  e->add_option("--dtype", a->dtype, "fp32 or bf16")->capture_default_str();
  e->callback([a] { export_checkpoint(*a); });
  CLI::App* m = cmd->add_subcommand(
      "import", "Make a weights-only checkpoint from a Hugging Face model (train --resume it)");
  m->add_option("path", a->path, "model.safetensors or its directory (with config.json)")
      ->required();
  m->add_option("--out,-o", a->out, "checkpoint root to create")->required();
  m->add_option("--config,-c", a->config,
                "strata config whose model block to use "
                "(default: the model config.json describes)");
  m->callback([a] { import_checkpoint(*a); });
  CLI::App* l = cmd->add_subcommand(
      "logits", "The logits of a checkpoint's model for token ids (float32, B x T x vocab)");
  l->add_option("path", a->path, "checkpoint")->required();
  l->add_option("--tokens", a->tokens, "int32 token ids, B rows of T")->required();
  l->add_option("--batch,-b", a->batch, "rows B")->capture_default_str();
  l->add_option("--out,-o", a->out, "output file")->required();
  l->callback([a] { logits(*a); });
}

}  // namespace strata::cli
