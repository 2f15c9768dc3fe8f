// A checkpoint directory on disk (DESIGN.md §7):
//   <root>/step_00000100/manifest.json      the manifest (manifest.h)
//   <root>/step_00000100/rank_00003.safetensors   one data file per writing rank: 1-D fp32
//                                                 chunks, written straight from memory
//   <root>/latest                            the name of the newest complete step directory
// A save writes into <root>/.step_00000100.tmp, fsyncs every file, and only then renames the
// directory into place and rewrites `latest` (write, fsync, rename): a crash at any point leaves
// the previous checkpoint complete and `latest` naming it. A load checks each chunk's CRC-32C
// before using a byte of it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/ckpt/manifest.h"
#include "strata/core/device.h"

namespace strata::ckpt {

std::string step_dir_name(int64_t step);  // "step_00000100"
std::string rank_file_name(int rank);     // "rank_00003.safetensors"

// A chunk to write: its metadata (kind, tensor, runs, numel) and its elements in device memory.
struct PendingChunk {
  Chunk meta;
  const float* data = nullptr;
};
// Writes one rank's data file at `path` (safetensors: each chunk an F32 tensor named
// "kind/tensor/index"), fsyncs it, and sets each chunk's offset and CRC-32C. Returns its bytes.
// An I/O error (the disk full, EIO, no permission) is a runtime Error naming the file and the
// system's reason; what a file holds (truncated, damaged) is an InputError.
// The chunks' elements are on `device` and reach the file through host memory (kernels/ops.h).
int64_t write_rank_file(const std::string& path, std::vector<PendingChunk>& chunks,
                        Device device = default_device());

// A small file of a checkpoint written atomically (core/atomic_file.h: tmp, fsync, rename, fsync
// the directory); a failure is a runtime Error.
void write_file_atomic(const std::string& path, const std::string& text);

// Makes the step directory `tmp` (its data files and manifest.json written and fsynced) the
// checkpoint <root>/<name>: fsyncs it, renames it into place (replacing a previous save of the
// same step), fsyncs the root, then points <root>/latest at it.
void commit(const std::string& root, const std::string& tmp, const std::string& name);

// The step directory a path names: a step directory itself (it has a manifest.json), or a
// checkpoint root whose `latest` names one. InputError if neither.
std::string resolve_checkpoint(const std::string& path);
// The root's latest complete step directory, or "" when it has none (no `latest` file).
std::string latest_checkpoint(const std::string& root);

// Reads a checkpoint: the manifest (validated), the files' presence and sizes, and every stored
// kind's chunks covering each tensor exactly once. Chunks are read with pread and checked
// against their CRC before use.
class Reader {
 public:
  // Destinations (dst, out below) are memory of `device`, written through the kernel interface
  // (host memory qualifies on the CPU device).
  explicit Reader(const std::string& step_dir, Device device = default_device());
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& kind) const;
  // dst[s.local + i] = element s.global + i of `kind` of `tensor`, for every segment s (in
  // increasing global order, as global_segments gives them) and i < s.len. A chunk that fills
  // one contiguous block of dst is read straight into it (and checked there); others through a
  // buffer.
  void read_into(const std::string& kind, const std::string& tensor,
                 const std::vector<Segment>& segments, float* dst) {
    plan(kind, tensor, segments, dst);
    run();
  }
  // The same in two steps: plan() records what to read, run() reads everything planned in file
  // and offset order (one sequential pass over each file however the layouts differ).
  void plan(const std::string& kind, const std::string& tensor,
            const std::vector<Segment>& segments, float* dst);
  void run();
  // out[i] = element lo + i, for every i in [0, hi - lo).
  void read(const std::string& kind, const std::string& tensor, int64_t lo, int64_t hi,
            float* out) {
    read_into(kind, tensor, {{lo, 0, hi - lo, 1}}, out);
  }
  // Checks each data file's safetensors header against the manifest's chunks (names, F32,
  // shapes, offsets), then reads every chunk and checks its CRC (strata ckpt verify); returns
  // the bytes read. A disagreement is an InputError naming the file.
  int64_t verify_all();

 private:
  void load_chunk(size_t c);               // into buf_, CRC checked
  void read_checked(size_t c, float* to);  // chunk c's elements into `to`, CRC checked
  std::string dir_;
  Manifest m_;
  std::vector<int> fds_;
  // (kind, tensor) -> chunk indices, with each chunk's global bounds.
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> index_;
  std::vector<std::pair<int64_t, int64_t>> bounds_;
  Device device_;
  std::vector<float> buf_;
  std::vector<float> stage_;  // host block of a direct read
  size_t loaded_ = SIZE_MAX;
  // Planned reads: a chunk into one block of dst (direct), or pieces of it through buf_.
  struct Piece {
    int64_t chunk, n;  // chunk element, count
    float* dst;
  };
  struct Job {
    size_t chunk;
    std::vector<Piece> pieces;
    bool direct;
  };
  std::vector<Job> jobs_;
};

}  // namespace strata::ckpt
