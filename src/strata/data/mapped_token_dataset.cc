#include "strata/data/mapped_token_dataset.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "strata/core/check.h"

namespace strata::data {

int token_type_size(TokenType t) {
  switch (t) {
    case TokenType::U8:
    case TokenType::I8:
      return 1;
    case TokenType::I16:
    case TokenType::U16:
      return 2;
    case TokenType::I32:
    case TokenType::U32:
      return 4;
    case TokenType::I64:
      return 8;
  }
  return 0;
}

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::U8:
      return "uint8";
    case TokenType::I8:
      return "int8";
    case TokenType::I16:
      return "int16";
    case TokenType::U16:
      return "uint16";
    case TokenType::I32:
      return "int32";
    case TokenType::U32:
      return "uint32";
    case TokenType::I64:
      return "int64";
  }
  return "?";
}

namespace {

// Scanning at open costs one pass over the data; past this many bytes it waits for vocab_bound().
constexpr int64_t kEagerScanBytes = int64_t(1) << 30;

template <typename T>
bool valid_id(T v) {
  return std::cmp_greater_equal(v, 0) &&
         std::cmp_less_equal(v, std::numeric_limits<int32_t>::max());
}

template <typename T>
constexpr bool always_valid() {
  return std::is_unsigned_v<T> && sizeof(T) <= 2;
}

// Converts n tokens to int32. Returns the index of the first id outside [0, 2^31), or -1.
template <typename T>
int64_t convert(const uint8_t* src, int64_t n, int32_t* out) {
  const T* p = reinterpret_cast<const T*>(src);
  if constexpr (always_valid<T>()) {
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(p[i]);
    return -1;
  } else {
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      bad |= !valid_id(p[i]);
      out[i] = int32_t(p[i]);
    }
    if (!bad) return -1;
    for (int64_t i = 0; i < n; ++i)
      if (!valid_id(p[i])) return i;
    return -1;
  }
}

// Largest id in n tokens, or, when some id is outside [0, 2^31), {-1, index of the first}.
template <typename T>
std::pair<int64_t, int64_t> scan_max(const uint8_t* src, int64_t n) {
  const T* p = reinterpret_cast<const T*>(src);
  int64_t mx = 0, mn = 0;
#pragma omp parallel for reduction(max : mx) reduction(min : mn) if (n > (int64_t(1) << 22))
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = int64_t(p[i]);
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  if constexpr (!always_valid<T>()) {
    if (mn < 0 || mx > std::numeric_limits<int32_t>::max()) {
      for (int64_t i = 0; i < n; ++i)
        if (!valid_id(p[i])) return {-1, i};
    }
  }
  return {mx, 0};
}

template <typename F>
auto dispatch(TokenType t, F&& f) {
  switch (t) {
    case TokenType::U8:
      return f(uint8_t{});
    case TokenType::I8:
      return f(int8_t{});
    case TokenType::I16:
      return f(int16_t{});
    case TokenType::U16:
      return f(uint16_t{});
    case TokenType::I32:
      return f(int32_t{});
    case TokenType::U32:
      return f(uint32_t{});
    case TokenType::I64:
      return f(int64_t{});
  }
  return f(uint8_t{});
}

}  // namespace

MappedTokenDataset::MappedTokenDataset(std::string source) : source_(std::move(source)) {}

int MappedTokenDataset::add_file(MappedFile file) {
  files_.push_back(std::move(file));
  return int(files_.size()) - 1;
}

void MappedTokenDataset::add_segment(int file_index, int64_t offset, int64_t ntok, TokenType type) {
  STRATA_CHECK(file_index >= 0 && file_index < int(files_.size()), "bad file index ", file_index);
  const MappedFile& f = files_[size_t(file_index)];
  const int64_t width = token_type_size(type);
  STRATA_CHECK(offset >= 0 && ntok >= 0 && offset % width == 0 && offset + ntok * width <= f.size(),
               "segment [", offset, ", +", ntok, " tokens) outside ", f.path());
  if (ntok == 0) return;
  // Adjacent runs of the same file and type merge, so a Megatron dataset is usually one segment.
  if (!segments_.empty()) {
    Segment& last = segments_.back();
    if (last.file == file_index && last.type == type &&
        last.file_offset + last.ntok * width == offset) {
      last.ntok += ntok;
      num_tokens_ += ntok;
      return;
    }
  }
  segments_.push_back(Segment{f.data() + offset, ntok, num_tokens_, offset, file_index, type});
  num_tokens_ += ntok;
}

void MappedTokenDataset::finalize() {
  if (num_tokens_ == 0) {
    std::string files;
    for (const MappedFile& f : files_) files += (files.empty() ? "" : ", ") + f.path();
    STRATA_INPUT_FAIL("dataset ", source_, " has no tokens (files: ", files,
                      "); point data.path at a dataset with at least one token");
  }
  int64_t bytes = 0;
  for (const Segment& s : segments_) bytes += s.ntok * token_type_size(s.type);
  if (bytes <= kEagerScanBytes) vocab_bound();
}

void MappedTokenDataset::scan() const {
  int64_t mx = 0;
  for (const Segment& s : segments_) {
    auto [seg_max, bad] =
        dispatch(s.type, [&](auto t) { return scan_max<decltype(t)>(s.data, s.ntok); });
    if (seg_max < 0) {
      const int64_t width = token_type_size(s.type);
      int64_t value = dispatch(s.type, [&](auto t) {
        decltype(t) v;
        std::memcpy(&v, s.data + bad * width, sizeof(v));
        return int64_t(v);
      });
      STRATA_INPUT_FAIL(files_[size_t(s.file)].path(), ": the ", token_type_name(s.type),
                        " token at byte offset ", s.file_offset + bad * width, " has id ", value,
                        "; token ids must be in [0, 2^31). The file is corrupt or was written ",
                        "with a different token type");
    }
    mx = std::max(mx, seg_max);
  }
  vocab_bound_ = num_tokens_ > 0 ? mx + 1 : 0;
}

int64_t MappedTokenDataset::vocab_bound() const {
  std::call_once(scanned_, [this] { scan(); });
  return vocab_bound_;
}

void MappedTokenDataset::read_segment(const Segment& s, int64_t begin, int64_t count,
                                      int32_t* out) const {
  const int64_t width = token_type_size(s.type);
  int64_t bad = dispatch(
      s.type, [&](auto t) { return convert<decltype(t)>(s.data + begin * width, count, out); });
  if (bad >= 0) {
    STRATA_INPUT_FAIL(files_[size_t(s.file)].path(), ": the ", token_type_name(s.type),
                      " token at byte offset ", s.file_offset + (begin + bad) * width,
                      " is not a valid id (negative or >= 2^31). The file is corrupt or was ",
                      "written with a different token type");
  }
}

void MappedTokenDataset::read(int64_t begin, int64_t count, int32_t* out) const {
  STRATA_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, "read [", begin, ", ",
               begin + count, ") outside the ", num_tokens_, " tokens of ", source_);
  if (count == 0) return;
  auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                             [](int64_t b, const Segment& s) { return b < s.first; });
  size_t k = size_t(it - segments_.begin()) - 1;
  while (count > 0) {
    const Segment& s = segments_[k++];
    int64_t local = begin - s.first;
    int64_t n = std::min(count, s.ntok - local);
    read_segment(s, local, n, out);
    begin += n, count -= n, out += n;
  }
}

}  // namespace strata::data

namespace strata::data {

void TokenDataset::read_mask(int64_t begin, int64_t count, uint8_t* out) const {
  STRATA_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens(), "mask [", begin, ", ",
               begin + count, ") outside the ", num_tokens(), " tokens of ", source());
  std::fill(out, out + count, uint8_t(1));
}

void MappedTokenDataset::add_mask(int file_index, int64_t offset, int64_t first_token,
                                  int64_t ntok) {
  STRATA_CHECK(file_index >= 0 && size_t(file_index) < files_.size() && offset >= 0 &&
                   offset + ntok <= files_[size_t(file_index)].size() && first_token >= 0 &&
                   first_token + ntok <= num_tokens_ &&
                   (masks_.empty() || masks_.back().first + masks_.back().ntok <= first_token),
               "loss mask of tokens [", first_token, ", ", first_token + ntok, ") at byte ", offset,
               " of file ", file_index, " does not fit ", source_);
  if (ntok > 0) masks_.push_back({files_[size_t(file_index)].data() + offset, first_token, ntok});
}

void MappedTokenDataset::read_mask(int64_t begin, int64_t count, uint8_t* out) const {
  TokenDataset::read_mask(begin, count, out);  // checks the range; unmasked tokens train
  auto it = std::upper_bound(masks_.begin(), masks_.end(), begin,
                             [](int64_t b, const MaskRun& m) { return b < m.first + m.ntok; });
  for (; it != masks_.end() && it->first < begin + count; ++it) {
    const int64_t lo = std::max(begin, it->first),
                  hi = std::min(begin + count, it->first + it->ntok);
    std::memcpy(out + (lo - begin), it->data + (lo - it->first), size_t(hi - lo));
  }
}

}  // namespace strata::data
