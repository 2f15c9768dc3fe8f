#include "strata/ckpt/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/crc32c.h"
#include "strata/core/progress.h"
#include "strata/core/safetensors.h"
#include "strata/kernels/ops.h"

namespace strata::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", static_cast<long long>(step));
  return b;
}

std::string rank_file_name(int rank) {
  char b[40];
  std::snprintf(b, sizeof b, "rank_%05d.safetensors", rank);
  return b;
}

namespace {

// A failed system call on a checkpoint file (a full disk, an I/O error, no permission) is a
// runtime failure: the elastic supervisor retries it from the previous checkpoint. What the files
// say (truncated, damaged, another model) stays an InputError.
[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  const int e = errno;
  STRATA_RUNTIME_FAIL(what, " ", path, ": ", std::strerror(e),
                      e == ENOSPC || e == EDQUOT ? " (free space on that file system)"
                      : e == EACCES || e == EPERM || e == EROFS
                          ? " (check the directory's permissions or mount)"
                          : "");
}

// The test seam of core/atomic_file.h, which also fails reads here: STRATA_CKPT_FAIL_IO=read.
bool injected(const char* call) {
  return io_fault_injected(call);
}

void pread_all(int fd, void* p, size_t n, int64_t offset, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r =
        injected("read") ? -1 : ::pread(fd, c, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_fail("cannot read", path);
    if (r == 0) STRATA_INPUT_FAIL(path, " ends early: the checkpoint is truncated");
    c += r, n -= size_t(r), offset += r;
  }
}

std::string read_text(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) STRATA_INPUT_FAIL("cannot open ", path, ": it does not exist");
    io_fail("cannot open", path);
  }
  std::string s;
  char b[65536];
  while (in.read(b, sizeof b) || in.gcount() > 0) {
    s.append(b, size_t(in.gcount()));
    if (s.size() > limit) STRATA_INPUT_FAIL(path, " is larger than any checkpoint manifest");
  }
  return s;
}

}  // namespace

int64_t write_rank_file(const std::string& path, std::vector<PendingChunk>& chunks, Device device) {
  nlohmann::json h = nlohmann::json::object();
  int64_t off = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i].meta;
    const int64_t bytes = 4 * c.numel;
    h[c.kind + "/" + c.tensor + "/" + std::to_string(i)] = {
        {"dtype", "F32"}, {"shape", {c.numel}}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t len = header.size();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create", path);
  try {
    write_fully(fd, &len, 8, path, IoError::runtime);
    write_fully(fd, header.data(), header.size(), path, IoError::runtime);
    int64_t at = 8 + int64_t(len);
    // Where device memory is the host's (the plain CPU device), straight from it; elsewhere through
    // a host block small enough to stay in the core's cache while its CRC is taken and written.
    constexpr int64_t kBlock = int64_t(1) << 18;  // floats: 1 MiB
    std::vector<float> stage;
    const ProgressTask progress("checkpoint save (this rank's file)", uint64_t(off),
                                ProgressTask::Unit::Bytes);
    for (PendingChunk& p : chunks) {
      p.meta.offset = at;
      const Tensor src(const_cast<float*>(p.data), DType::F32, {p.meta.numel}, device);
      const float* direct = static_cast<const float*>(ops::host_address(src));
      if (direct == nullptr) stage.resize(size_t(kBlock));
      uint32_t crc = 0;
      for (int64_t i = 0; i < p.meta.numel; i += kBlock) {
        const int64_t n = std::min(kBlock, p.meta.numel - i);
        const float* host = direct != nullptr ? direct + i : stage.data();
        if (direct == nullptr) {
          ops::copy_to_host(stage.data(),
                            Tensor(const_cast<float*>(p.data) + i, DType::F32, {n}, device));
        }
        crc = crc32c(host, size_t(n) * 4, crc);
        write_fully(fd, host, size_t(n) * 4, path, IoError::runtime);
        progress_advance(uint64_t(n) * 4);
      }
      p.meta.crc32c = crc;
      at += p.meta.numel * 4;
    }
    fsync_fd(fd, path, IoError::runtime);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) io_fail("cannot close", path);
  return 8 + int64_t(len) + off;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  atomic_write(path, text, IoError::runtime);
}

void commit(const std::string& root, const std::string& tmp, const std::string& name) {
  const fs::path final_dir = fs::path(root) / name;
  fsync_dir(tmp, IoError::runtime);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // The same step saved again: swap the two directories in one step (a crash leaves one of
    // them complete under the name `latest` may give), then drop the old one.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      io_fail("cannot replace " + final_dir.string() + " with", tmp);
    }
    fsync_dir(root, IoError::runtime);
    fs::remove_all(tmp);
  } else {
    rename_durably(tmp, final_dir.string(), IoError::runtime);
  }
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
}

std::string latest_checkpoint(const std::string& root) {
  const fs::path latest = fs::path(root) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::string name = read_text(latest.string(), 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
    STRATA_INPUT_FAIL(latest.string(), " does not name a step directory (it says \"", name, "\")");
  }
  const fs::path dir = fs::path(root) / name;
  if (!fs::exists(dir / "manifest.json", ec)) {
    STRATA_INPUT_FAIL(latest.string(), " names ", dir.string(),
                      ", which holds no manifest.json: the checkpoint was removed or damaged");
  }
  return dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  const std::string latest = latest_checkpoint(path);
  if (!latest.empty()) return latest;
  STRATA_INPUT_FAIL("no checkpoint at ", path,
                    ": it holds neither a manifest.json (a step directory) nor a `latest` file "
                    "(a checkpoint root)");
}

Reader::Reader(const std::string& step_dir, Device device) : dir_(step_dir), device_(device) {
  const std::string mpath = (fs::path(dir_) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(mpath, ec)) {
    STRATA_INPUT_FAIL(dir_, " holds no manifest.json: not a complete strata checkpoint");
  }
  m_ = parse_manifest(read_text(mpath, size_t(1) << 30), mpath);
  // Each stored kind covers every tensor exactly once.
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<int64_t, int64_t>>> cover;
  bounds_.resize(m_.chunks.size());
  for (size_t c = 0; c < m_.chunks.size(); ++c) {
    const Chunk& k = m_.chunks[c];
    index_[{k.kind, k.tensor}].push_back(c);
    int64_t lo, hi, n;
    run_bounds(k.runs, lo, hi, n);
    bounds_[c] = {lo, hi};
    auto& segs = cover[{k.kind, k.tensor}];
    for (const Run& r : k.runs) {
      for (int64_t q = 0; q < r.count; ++q) segs.push_back({r.global + q * r.stride, r.len});
    }
  }
  std::map<std::string, int> kinds;
  for (auto& [key, segs] : cover) {
    std::sort(segs.begin(), segs.end());
    int64_t at = 0;
    for (const auto& [g, len] : segs) {
      if (g != at) {
        STRATA_INPUT_FAIL(mpath, ": the ", key.first, " chunks of ", key.second,
                          g < at ? " overlap" : " leave elements uncovered", " at element ",
                          std::min(g, at), "; the checkpoint is damaged");
      }
      at += len;
    }
    int64_t n = 1;
    for (int64_t d : m_.tensors.at(key.second)) n *= d;
    if (at != n) {
      STRATA_INPUT_FAIL(mpath, ": the ", key.first, " chunks of ", key.second, " cover ", at,
                        " of its ", n, " elements; the checkpoint is damaged");
    }
    ++kinds[key.first];
  }
  for (const auto& [kind, tensors] : kinds) {
    if (size_t(tensors) != m_.tensors.size()) {
      STRATA_INPUT_FAIL(mpath, ": ", kind, " is stored for ", tensors, " of the ",
                        m_.tensors.size(), " tensors; the checkpoint is damaged");
    }
  }
  if (!has(kMaster)) STRATA_INPUT_FAIL(mpath, " stores no weights (", kMaster, ")");
  // The files are opened last: a constructor that throws runs no destructor, so nothing may
  // throw once they are open but what closes them.
  for (const Manifest::File& f : m_.files) {
    const std::string p = (fs::path(dir_) / f.name).string();
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      for (int o : fds_) ::close(o);
      if (errno == ENOENT) STRATA_INPUT_FAIL("the checkpoint's data file ", p, " is missing");
      io_fail("cannot open", p);
    }
    fds_.push_back(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // chunks are read in file order
    struct stat st {};
    if (::fstat(fd, &st) != 0 || int64_t(st.st_size) != f.bytes) {
      const long long size = static_cast<long long>(st.st_size);
      for (int o : fds_) ::close(o);
      STRATA_INPUT_FAIL(p, " is ", size, " bytes where the manifest says ", f.bytes,
                        ": the checkpoint is truncated or damaged");
    }
  }
}

Reader::~Reader() {
  for (int fd : fds_) ::close(fd);
}

bool Reader::has(const std::string& kind) const {
  for (const auto& [key, chunks] : index_) {
    if (key.first == kind) return true;
  }
  return false;
}

void Reader::load_chunk(size_t c) {
  if (loaded_ == c) return;
  buf_.resize(size_t(m_.chunks[c].numel));
  loaded_ = SIZE_MAX;
  read_checked(c, buf_.data());
  loaded_ = c;
}

// In blocks small enough that each block's CRC is taken while it is still in the core's cache;
// the next block's read-ahead is requested before each block is read, so the disk works while
// blocks are copied.
void Reader::read_checked(size_t c, float* to) {
  const Chunk& k = m_.chunks[c];
  const int fd = fds_[size_t(k.file)];
  const std::string path = (fs::path(dir_) / m_.files[size_t(k.file)].name).string();
  constexpr size_t kBlock = size_t(1) << 20;
  const size_t bytes = size_t(k.numel) * 4;
  // Where device memory is the host's (the plain CPU device), in place; elsewhere through a host
  // block: the file is read into host memory, checked there, copied to the device.
  const Tensor dst(to, DType::F32, {k.numel}, device_);
  char* direct = static_cast<char*>(ops::host_address(dst));
  if (direct == nullptr) stage_.resize(kBlock / 4);
  uint32_t crc = 0;
  for (size_t at = 0; at < bytes; at += kBlock) {
    const size_t n = std::min(kBlock, bytes - at);
    if (at + n < bytes) {
      ::posix_fadvise(fd, off_t(k.offset + int64_t(at + n)),
                      off_t(std::min(kBlock, bytes - at - n)), POSIX_FADV_WILLNEED);
    }
    char* host = direct != nullptr ? direct + at : reinterpret_cast<char*>(stage_.data());
    pread_all(fd, host, n, k.offset + int64_t(at), path);
    crc = crc32c(host, n, crc);
    if (direct == nullptr) {
      ops::copy_from_host(Tensor(to + at / 4, DType::F32, {int64_t(n / 4)}, device_), host);
    }
  }
  if (crc != k.crc32c) {
    STRATA_INPUT_FAIL(path, ": the ", k.kind, " chunk of ", k.tensor, " at byte ", k.offset,
                      " fails its checksum: the file is damaged");
  }
}

void Reader::plan(const std::string& kind, const std::string& tensor,
                  const std::vector<Segment>& segments, float* dst) {
  if (segments.empty()) return;
  const auto it = index_.find({kind, tensor});
  if (it == index_.end()) {
    STRATA_INPUT_FAIL(dir_, " stores no ", kind, " for ", tensor,
                      ": it is incomplete, or of another model or optimizer");
  }
  const int64_t lo = segments.front().global;
  const int64_t hi = segments.back().global + segments.back().len;
  for (size_t c : it->second) {
    if (bounds_[c].second <= lo || bounds_[c].first >= hi) continue;
    const Chunk& k = m_.chunks[c];
    // The chunk's elements that land in dst: each run segment against the segments it meets.
    Job job{c, {}, false};
    int64_t at = 0;
    for (const Run& r : k.runs) {
      for (int64_t q = 0; q < r.count; ++q, at += r.len) {
        const int64_t g = r.global + q * r.stride;
        if (g + r.len <= lo || g >= hi) continue;
        auto s = std::upper_bound(segments.begin(), segments.end(), g,
                                  [](int64_t v, const Segment& x) { return v < x.global; });
        if (s != segments.begin()) --s;
        for (; s != segments.end() && s->global < g + r.len; ++s) {
          const int64_t a = std::max(g, s->global), b = std::min(g + r.len, s->global + s->len);
          if (a < b) job.pieces.push_back({at + (a - g), b - a, dst + s->local + (a - s->global)});
        }
      }
    }
    if (job.pieces.empty()) continue;
    // All of the chunk, in order, into one block of dst: read it there.
    int64_t n = 0;
    job.direct = job.pieces.front().chunk == 0;
    for (const Piece& p : job.pieces) {
      job.direct = job.direct && p.chunk == n && p.dst == job.pieces.front().dst + n;
      n += p.n;
    }
    job.direct = job.direct && n == k.numel;
    jobs_.push_back(std::move(job));
  }
}

void Reader::run() {
  std::sort(jobs_.begin(), jobs_.end(), [&](const Job& a, const Job& b) {
    const Chunk &x = m_.chunks[a.chunk], &y = m_.chunks[b.chunk];
    return x.file != y.file ? x.file < y.file : x.offset < y.offset;
  });
  uint64_t total = 0;
  for (const Job& job : jobs_) total += uint64_t(m_.chunks[job.chunk].numel) * 4;
  const ProgressTask progress("checkpoint load", total, ProgressTask::Unit::Bytes);
  for (const Job& job : jobs_) {
    progress_advance(uint64_t(m_.chunks[job.chunk].numel) * 4);
    if (!job.direct) {
      load_chunk(job.chunk);
      for (const Piece& p : job.pieces) {
        ops::copy_from_host(Tensor(p.dst, DType::F32, {p.n}, device_), buf_.data() + p.chunk);
      }
      continue;
    }
    read_checked(job.chunk, job.pieces.front().dst);
  }
  jobs_.clear();
}

int64_t Reader::verify_all() {
  // Each data file's safetensors header describes exactly the manifest's chunks of that file.
  for (size_t f = 0; f < m_.files.size(); ++f) {
    const std::string path = (fs::path(dir_) / m_.files[f].name).string();
    const SafetensorsIndex ix = read_safetensors_index(path);
    std::map<uint64_t, const std::pair<const std::string, SafetensorsEntry>*> at_offset;
    for (const auto& e : ix.tensors) at_offset[e.second.offset] = &e;
    size_t of_file = 0;
    for (const Chunk& k : m_.chunks) {
      if (size_t(k.file) != f) continue;
      ++of_file;
      const auto it = at_offset.find(uint64_t(k.offset));
      const std::string prefix = k.kind + "/" + k.tensor + "/";
      if (it == at_offset.end()) {
        STRATA_INPUT_FAIL(path, ": its safetensors header has no tensor at byte ", k.offset,
                          ", where the manifest puts the ", k.kind, " chunk of ", k.tensor,
                          "; the file and the manifest disagree: the checkpoint is damaged");
      }
      const auto& [name, e] = *it->second;
      if (name.compare(0, prefix.size(), prefix) != 0 || e.dtype != "F32" ||
          e.shape != std::vector<int64_t>{k.numel} || e.bytes != uint64_t(k.numel) * 4) {
        STRATA_INPUT_FAIL(path, ": its safetensors header says ", name, " (", e.dtype, ", ",
                          e.numel(), " elements) at byte ", k.offset,
                          " where the manifest has the ", k.kind, " chunk of ", k.tensor, " (F32, ",
                          k.numel, " elements); the checkpoint is damaged");
      }
    }
    if (ix.tensors.size() != of_file) {
      STRATA_INPUT_FAIL(path, ": its safetensors header lists ", ix.tensors.size(),
                        " tensors where the manifest has ", of_file,
                        " chunks in it; the checkpoint is damaged");
    }
  }
  int64_t bytes = 0;
  for (size_t c = 0; c < m_.chunks.size(); ++c) {
    load_chunk(c);
    bytes += m_.chunks[c].numel * 4;
  }
  return bytes;
}

}  // namespace strata::ckpt
