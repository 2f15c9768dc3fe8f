// clang-format off
// fuzz-sources: src/strata/ckpt/store.cc src/strata/ckpt/manifest.cc src/strata/ckpt/slices.cc src/strata/model/param_spec.cc src/strata/model/model_config.cc src/strata/core/crc32c.cc src/strata/core/rng.cc src/strata/core/check.cc
// clang-format on
//
// A checkpoint's Reader (ckpt/store.h) on an arbitrary manifest.json beside a fixed data file,
// rank_00000.safetensors: 64 floats 0, 0.5, 1, … (256 bytes). An InputError is the expected
// answer to anything wrong; a finding is a crash, a sanitizer report, any other exception, a
// file left open, or an accepted checkpoint whose reads do not give what its chunks say: every
// stored kind of every tensor is read whole and in a window, and compared with the elements
// placed by walking the chunks' runs here. Seeds in fuzz/corpus/checkpoint_reader/ are to_json
// output whose chunks lie in the data file with their CRCs right (so mutations of the runs get
// past the checksums): Adam moments split by columns and out of order, and weights only.
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "strata/ckpt/manifest.h"
#include "strata/ckpt/store.h"
#include "strata/core/check.h"

namespace {

namespace fs = std::filesystem;
using strata::ckpt::Chunk;
using strata::ckpt::Run;

void require(bool ok, const char* promise) {
  if (!ok) {
    std::fprintf(stderr, "accepted checkpoint breaks its promise: %s\n", promise);
    std::abort();
  }
}

std::string data_file() {
  std::string bytes(256, '\0');
  for (int i = 0; i < 64; ++i) {
    const float v = 0.5f * float(i);
    std::memcpy(&bytes[size_t(4 * i)], &v, 4);
  }
  return bytes;
}

// A step directory holding the data file and `manifest` as manifest.json, for one input
// (libFuzzer ends without running atexit handlers, so nothing may outlive the input).
class StepDir {
 public:
  explicit StepDir(const std::string& manifest) {
    char name[] = "/tmp/strata_reader_fuzz.XXXXXX";
    if (::mkdtemp(name) == nullptr) std::abort();
    path_ = name;
    std::ofstream(path_ / strata::ckpt::rank_file_name(0), std::ios::binary) << data_file();
    std::ofstream(path_ / "manifest.json", std::ios::binary) << manifest;
  }
  ~StepDir() { fs::remove_all(path_); }
  StepDir(const StepDir&) = delete;
  StepDir& operator=(const StepDir&) = delete;
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

size_t open_files() {
  size_t n = 0;
  for ([[maybe_unused]] const fs::directory_entry& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Elements [lo, hi) of `kind` of `tensor` as the chunks place them, from the files' bytes.
std::vector<float> expected(const strata::ckpt::Manifest& m, const std::string& kind,
                            const std::string& tensor, const std::string& manifest_text, int64_t lo,
                            int64_t hi) {
  const std::string data = data_file();
  std::vector<float> out(size_t(hi - lo));
  for (const Chunk& c : m.chunks) {
    if (c.kind != kind || c.tensor != tensor) continue;
    const std::string& name = m.files[size_t(c.file)].name;
    const std::string& bytes = name == "manifest.json" ? manifest_text : data;
    int64_t at = 0;
    for (const Run& r : c.runs) {
      for (int64_t q = 0; q < r.count; ++q) {
        for (int64_t i = 0; i < r.len; ++i, ++at) {
          const int64_t g = r.global + q * r.stride + i;
          if (g >= lo && g < hi) {
            std::memcpy(&out[size_t(g - lo)], &bytes[size_t(c.offset + 4 * at)], 4);
          }
        }
      }
    }
  }
  return out;
}

void read_and_compare(strata::ckpt::Reader& rd, const std::string& text) {
  const strata::ckpt::Manifest& m = rd.manifest();
  rd.verify_all();
  for (const char* kind : {strata::ckpt::kMaster, strata::ckpt::kExpAvg, strata::ckpt::kExpAvgSq,
                           strata::ckpt::kMomentum}) {
    if (!rd.has(kind)) continue;
    for (const auto& [tensor, shape] : m.tensors) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      // The reader checked that the chunks cover each tensor once: n is at most the chunks'
      // elements, which lie in the files.
      for (const auto& [lo, hi] : {std::pair{int64_t(0), n}, std::pair{n / 3, n - n / 4}}) {
        if (lo >= hi) continue;
        std::vector<float> got(size_t(hi - lo));
        rd.read(kind, tensor, lo, hi, got.data());
        const std::vector<float> want = expected(m, kind, tensor, text, lo, hi);
        require(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
                "a read gives the elements the chunks place");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const StepDir dir(text);
  const size_t files = open_files();
  try {
    strata::ckpt::Reader rd(dir.path());
    read_and_compare(rd, text);
  } catch (const strata::InputError&) {
  }
  require(open_files() == files, "no file left open");
  return 0;
}
