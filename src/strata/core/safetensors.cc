#include "strata/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"

namespace strata {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // Hugging Face's reader has the same limit
constexpr int kMaxDepth = 16;  // a valid header nests 3 deep: {"t": {"shape": [...]}}

struct DtypeSize {
  const char* name;
  size_t bytes;
};
constexpr DtypeSize kDtypes[] = {
    {"F64", 8}, {"I64", 8}, {"U64", 8},  {"F32", 4},     {"I32", 4},
    {"U32", 4}, {"F16", 2}, {"BF16", 2}, {"I16", 2},     {"U16", 2},
    {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

std::string known_dtypes() {
  std::string s;
  for (const DtypeSize& d : kDtypes) s += std::string(s.empty() ? "" : " ") + d.name;
  return s;
}

// Text from the file, shortened for a message: a hostile header can hold a 100 MB name.
std::string clip(std::string_view s) {
  constexpr size_t kMax = 80;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}
std::string clip_json(const json& v) {
  return clip(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size() && i < 8; ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + (shape.size() > 8 ? ", ...]" : "]");
}

// The element count of a shape; false if a dimension is negative or the running product leaves
// int64 (then numel() could not compute it).
bool element_count(const std::vector<int64_t>& shape, uint64_t& numel) {
  numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, uint64_t(d), &numel) ||
        numel > uint64_t(INT64_MAX)) {
      return false;
    }
  }
  return true;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Refuses, while nlohmann parses, what it would otherwise accept: nesting deep enough to exhaust
// memory or a recursive walk's stack, and a key given twice in one object (nlohmann keeps the
// last silently, so a second entry "w" would hide the first).
class HeaderGuard {
 public:
  explicit HeaderGuard(const std::string& what) : what_(what) {}

  // depth: the number of containers enclosing the event's value.
  bool on_event(int depth, json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        STRATA_INPUT_CHECK(depth < kMaxDepth, what_, ": the safetensors header nests deeper than ",
                           kMaxDepth, " levels");
        frames_.push_back({frames_.empty() ? "" : frames_.back().last_key, "", {}});
        break;
      case json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.last_key = parsed.get<std::string>();
        STRATA_INPUT_CHECK(f.keys.insert(f.last_key).second, what_, ": the safetensors header has ",
                           "key '", clip(f.last_key), "' twice ",
                           frames_.size() == 1 ? "at the top level" : "in '" + clip(f.owner) + "'");
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  }

 private:
  struct Frame {
    std::string owner;     // the key of this container in its parent
    std::string last_key;  // the key being parsed in this object
    std::set<std::string> keys;
  };
  const std::string& what_;
  std::vector<Frame> frames_;
};

json parse_json(const char* text, uint64_t n, const std::string& what) {
  HeaderGuard guard(what);
  try {
    return json::parse(text, text + n,
                       [&guard](int depth, json::parse_event_t event, json& parsed) {
                         return guard.on_event(depth, event, parsed);
                       });
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    const std::string_view msg = e.what();
    const size_t p = msg.find("] ");
    constexpr size_t kMax = 300;  // the message quotes the token, which a file can make huge
    std::string reason(msg.substr(p == msg.npos ? 0 : p + 2).substr(0, kMax));
    for (char& c : reason) {  // it may quote bytes of the file: keep the message printable
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    STRATA_INPUT_FAIL(what, ": the safetensors header is not valid JSON: ", reason);
  }
}

std::map<std::string, std::string> parse_metadata(const json& v, const std::string& what) {
  STRATA_INPUT_CHECK(v.is_object(), what, ": __metadata__ is not an object of strings but ",
                     clip_json(v));
  std::map<std::string, std::string> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    STRATA_INPUT_CHECK(it->is_string(), what, ": __metadata__ '", clip(it.key()),
                       "' is not a string but ", clip_json(*it));
    out.emplace(it.key(), it->get<std::string>());
  }
  return out;
}

// data_size: the bytes after the header; data_start + data_size is the file size.
SafetensorsEntry parse_entry(const std::string& name, const json& v, uint64_t data_start,
                             uint64_t data_size, const std::string& what) {
  const std::string t = what + ": tensor '" + clip(name) + "'";
  STRATA_INPUT_CHECK(v.is_object(), t, " is not an object {\"dtype\", \"shape\", ",
                     "\"data_offsets\"} but ", clip_json(v));
  SafetensorsEntry e;

  const auto dtype = v.find("dtype");
  STRATA_INPUT_CHECK(dtype != v.end() && dtype->is_string(), t, " has no dtype string");
  e.dtype = dtype->get<std::string>();
  const size_t dtype_bytes = safetensors_dtype_bytes(e.dtype);
  STRATA_INPUT_CHECK(dtype_bytes != 0, t, " has unknown dtype '", clip(e.dtype),
                     "'; expected one of ", known_dtypes());

  const auto shape = v.find("shape");
  STRATA_INPUT_CHECK(shape != v.end() && shape->is_array(), t,
                     " has no shape (a list of dimensions)");
  for (size_t i = 0; i < shape->size(); ++i) {
    const json& d = (*shape)[i];
    STRATA_INPUT_CHECK(d.is_number_integer(), t, " has dimension ", i, " = ", clip_json(d),
                       ", not an integer");
    STRATA_INPUT_CHECK(d.is_number_unsigned(), t, " has dimension ", i, " = ", d.get<int64_t>(),
                       ", below 0");
    const auto di = d.get<uint64_t>();
    STRATA_INPUT_CHECK(di <= uint64_t(INT64_MAX), t, " has dimension ", i, " = ", di,
                       ", above 2^63 - 1");
    e.shape.push_back(int64_t(di));
  }
  uint64_t numel = 0, need = 0;
  STRATA_INPUT_CHECK(
      element_count(e.shape, numel) && !__builtin_mul_overflow(numel, dtype_bytes, &need), t,
      " has shape ", shape_str(e.shape), " whose size in bytes overflows 64 bits");

  const auto off = v.find("data_offsets");
  STRATA_INPUT_CHECK(
      off != v.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
          (*off)[1].is_number_unsigned(),
      t, off == v.end() ? " has no data_offsets" : " has data_offsets " + clip_json(*off),
      "; expected two non-negative integers [begin, end]");
  const auto begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  STRATA_INPUT_CHECK(begin <= end, t, " has data_offsets [", begin, ", ", end, "], begin > end");
  STRATA_INPUT_CHECK(end <= data_size, t, " has data_offsets [", begin, ", ", end,
                     "] beyond the data section (", data_size,
                     " bytes after the header); the file is truncated or corrupt");
  STRATA_INPUT_CHECK(end - begin == need, t, " holds ", end - begin, " bytes but its shape ",
                     shape_str(e.shape), " and dtype ", e.dtype, " need ", need);
  e.offset = data_start + begin;
  e.bytes = end - begin;
  return e;
}

void check_no_overlap(const SafetensorsIndex& index) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
  for (const auto& [name, e] : index.tensors) {
    if (e.bytes != 0) by_offset.emplace_back(&name, &e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->offset, a.second->bytes) <
           std::pair(b.second->offset, b.second->bytes);
  });
  // Without an overlap so far, the previous tensor ends last.
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [a, ea] = by_offset[i - 1];
    const auto& [b, eb] = by_offset[i];
    const uint64_t base = index.data_start;
    STRATA_INPUT_CHECK(eb->offset >= ea->offset + ea->bytes, index.what, ": tensors '", clip(*a),
                       "' (data_offsets [", ea->offset - base, ", ", ea->offset + ea->bytes - base,
                       "]) and '", clip(*b), "' ([", eb->offset - base, ", ",
                       eb->offset + eb->bytes - base, "]) overlap");
  }
}

// The header length the 8-byte little-endian prefix gives, checked against the file's size.
uint64_t header_length(const char* prefix, uint64_t file_size, const std::string& what) {
  STRATA_INPUT_CHECK(file_size >= 8, what, ": ", file_size,
                     " bytes is too short for a safetensors file (it starts with an 8-byte "
                     "header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(prefix[i]);
  STRATA_INPUT_CHECK(n <= kMaxHeaderBytes, what, ": header length ", n, " is over the ",
                     kMaxHeaderBytes, "-byte limit; the file is corrupt or not safetensors");
  STRATA_INPUT_CHECK(n <= file_size - 8, what, ": header length ", n, " exceeds the file (",
                     file_size, " bytes); the file is truncated or corrupt");
  return n;
}

// text[0, n): the JSON header of a file of file_size bytes (n <= file_size - 8).
SafetensorsIndex parse_header(const char* text, uint64_t n, uint64_t file_size,
                              const std::string& what) {
  SafetensorsIndex index;
  index.what = what;
  index.file_size = file_size;
  index.data_start = 8 + n;
  const json header = parse_json(text, n, what);
  STRATA_INPUT_CHECK(header.is_object(), what, ": the safetensors header is not a JSON object but ",
                     clip_json(header));
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      index.metadata = parse_metadata(*it, what);
    } else {
      index.tensors.emplace(it.key(), parse_entry(it.key(), *it, index.data_start,
                                                  file_size - index.data_start, what));
    }
  }
  check_no_overlap(index);
  return index;
}

// A regular file opened for reading, closed when it goes out of scope.
class InputFile {
 public:
  explicit InputFile(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    STRATA_INPUT_CHECK(fd_.fd >= 0, "cannot open safetensors file ", path, ": ",
                       std::strerror(errno));
    struct stat st {};
    STRATA_INPUT_CHECK(::fstat(fd_.fd, &st) == 0 && S_ISREG(st.st_mode), path,
                       " is not a regular file");
    size_ = uint64_t(st.st_size);
  }
  uint64_t size() const { return size_; }

  void read_at(char* out, size_t n, uint64_t offset) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd_.fd, out, std::min(n, size_t(1) << 30), off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      STRATA_INPUT_CHECK(got >= 0, "reading ", path_, " failed: ", std::strerror(errno));
      STRATA_INPUT_CHECK(got > 0, path_, " ended at byte ", offset,
                         " while being read; it was truncated meanwhile");
      out += got;
      n -= size_t(got);
      offset += uint64_t(got);
    }
  }

 private:
  struct Fd {  // a member, so that a throwing constructor still closes it
    explicit Fd(int f) : fd(f) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
    int fd;
  };
  std::string path_;
  Fd fd_;
  uint64_t size_ = 0;
};

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  for (const DtypeSize& d : kDtypes) {
    if (dtype == d.name) return d.bytes;
  }
  return 0;
}

int64_t SafetensorsEntry::numel() const {
  return product(shape);
}

int64_t SafetensorView::numel() const {
  return product(shape);
}

const SafetensorsEntry& SafetensorsIndex::at(const std::string& name,
                                             const std::string& dtype) const {
  auto it = tensors.find(name);
  STRATA_INPUT_CHECK(it != tensors.end(), what, " has no tensor named '", name, "'");
  STRATA_INPUT_CHECK(dtype.empty() || it->second.dtype == dtype, what, ": tensor '", name, "' is ",
                     it->second.dtype, ", expected ", dtype);
  return it->second;
}

SafetensorsIndex parse_safetensors_header(const char* data, size_t size, const std::string& what) {
  return parse_safetensors_header(data, size, size, what);
}

SafetensorsIndex parse_safetensors_header(const char* data, size_t size, uint64_t file_size,
                                          const std::string& what) {
  STRATA_CHECK(size <= file_size, what, ": a buffer of ", size, " bytes from a file of ",
               file_size);
  STRATA_CHECK(size >= 8 || size == file_size, what, ": pass at least the 8-byte length prefix");
  const uint64_t n = header_length(data, file_size, what);
  STRATA_CHECK(n <= size - 8, what, ": the buffer ends inside the ", n, "-byte header");
  return parse_header(data + 8, n, file_size, what);
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  const InputFile file(path);
  char prefix[8] = {};
  file.read_at(prefix, size_t(std::min<uint64_t>(8, file.size())), 0);
  const uint64_t n = header_length(prefix, file.size(), path);
  std::vector<char> text(n);
  file.read_at(text.data(), n, 8);
  return parse_header(text.data(), n, file.size(), path);
}

SafetensorsFile::SafetensorsFile(const std::string& path) {
  const InputFile file(path);
  bytes_.resize(file.size());
  file.read_at(bytes_.data(), bytes_.size(), 0);
  index_ = parse_safetensors_header(bytes_.data(), bytes_.size(), path);
}

SafetensorView SafetensorsFile::get(const std::string& name, const std::string& dtype) const {
  const SafetensorsEntry& e = index_.at(name, dtype);
  return {e.dtype, e.shape, bytes_.data() + e.offset, e.bytes};
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_.tensors) out.push_back(k);
  return out;
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            std::vector<int64_t> shape, const void* data, size_t bytes) {
  STRATA_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
  const size_t dtype_bytes = safetensors_dtype_bytes(dtype);
  STRATA_CHECK(dtype_bytes != 0, "tensor '", name, "': unknown dtype ", dtype);
  uint64_t numel = 0, need = 0;
  STRATA_CHECK(element_count(shape, numel) && !__builtin_mul_overflow(numel, dtype_bytes, &need) &&
                   need == bytes,
               "tensor '", name, "': ", bytes, " bytes do not hold shape ", shape_str(shape),
               " of ", dtype);
  STRATA_CHECK(names_.insert(name).second, "tensor '", name, "' added twice");
  Entry e{name, dtype, std::move(shape), std::vector<char>(bytes)};
  if (bytes != 0) std::memcpy(e.data.data(), data, bytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::write(const std::string& path) const {
  json header = json::object();
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFile out(path, IoError::input);
  const uint64_t n = text.size();
  out.write(&n, 8);
  out.write(text);
  for (const Entry& e : entries_) out.write(e.data.data(), e.data.size());
  out.commit();
}

}  // namespace strata
