// clang-format off
// fuzz-sources: src/strata/ckpt/manifest.cc src/strata/model/model_config.cc src/strata/core/check.cc
// clang-format on
//
// A checkpoint's manifest.json parser (ckpt/manifest.h) on arbitrary text. An InputError is the
// expected answer to garbage; a finding is a crash, a sanitizer report (a signed overflow in the
// bounds arithmetic among them), any other exception, or an accepted manifest that breaks what
// parsing promises a loader: every chunk inside its file, every run inside its tensor, runs
// covering exactly the chunk's elements, plain file names — checked here in 128-bit arithmetic —
// and to_json giving a manifest that parses back to the same text. Seeds in
// fuzz/corpus/manifest/ are to_json output: the unit test's manifest, an SGD one with strided
// runs, a weights-only import.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "strata/ckpt/manifest.h"
#include "strata/core/check.h"

namespace {

using strata::ckpt::Chunk;
using strata::ckpt::Manifest;
using strata::ckpt::Run;

void require(bool ok, const char* promise) {
  if (!ok) {
    std::fprintf(stderr, "accepted manifest breaks its promise: %s\n", promise);
    std::abort();
  }
}

void check_manifest(const Manifest& m) {
  using I = __int128;
  require(m.format == strata::ckpt::kFormatVersion, "the format this strata reads");
  require(m.optimizer_steps >= 0 && m.optimizer_steps <= m.step, "optimizer steps within steps");
  require(m.consumed_samples >= 0, "consumed samples non-negative");
  require(std::isfinite(m.scaler.scale) && m.scaler.scale > 0.0f, "a positive finite scale");
  require(std::isfinite(m.model.norm_eps) && std::isfinite(m.model.rope_theta) &&
              std::isfinite(m.model.init_std),
          "finite model numbers");
  require(m.model.hidden >= 1 && m.model.heads >= 1 && m.model.vocab >= 1 && m.model.seq_len >= 1,
          "positive model dimensions");
  for (const Manifest::File& f : m.files) {
    require(!f.name.empty() && f.name[0] != '.' && f.name.find('/') == std::string::npos,
            "plain file names");
    require(f.bytes >= 0, "file sizes non-negative");
  }
  for (const auto& [name, shape] : m.tensors) {
    require(shape.size() == 1 || shape.size() == 2, "shapes of 1 or 2 dimensions");
    I n = 1;
    for (int64_t d : shape) {
      require(d >= 1, "positive dimensions");
      n *= d;
    }
    require(n <= (I(1) << 40), "tensors of at most 2^40 elements");
  }
  for (const Chunk& c : m.chunks) {
    require(strata::ckpt::known_kind(c.kind), "known kinds");
    const auto t = m.tensors.find(c.tensor);
    require(t != m.tensors.end(), "chunks of listed tensors");
    I n = 1;
    for (int64_t d : t->second) n *= d;
    require(c.file >= 0 && size_t(c.file) < m.files.size(), "chunks of listed files");
    require(c.offset >= 0 && c.numel >= 0 &&
                I(c.offset) + 4 * I(c.numel) <= I(m.files[size_t(c.file)].bytes),
            "chunks inside their files");
    I total = 0;
    for (const Run& r : c.runs) {
      require(r.global >= 0 && r.len >= 1 && r.count >= 1 && r.stride >= 0, "runs well formed");
      require(r.count == 1 || r.stride >= r.len, "a run's segments apart");
      require(I(r.global) + I(r.count - 1) * I(r.stride) + I(r.len) <= n, "runs inside the tensor");
      total += I(r.len) * I(r.count);
    }
    require(total == c.numel, "runs covering the chunk's elements");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Manifest m;
  try {
    m = strata::ckpt::parse_manifest(text, "fuzz");
  } catch (const strata::InputError&) {
    return 0;
  }
  check_manifest(m);
  const std::string again = strata::ckpt::to_json(m);
  try {
    require(strata::ckpt::to_json(strata::ckpt::parse_manifest(again, "to_json")) == again,
            "to_json parses back to the same manifest");
  } catch (const strata::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    require(false, "to_json gives a manifest that parses");
  }
  return 0;
}
