#include "strata/core/safetensors.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/core/check.h"

namespace strata {

namespace {

size_t dtype_bytes(const std::string& t) {
  if (t == "F64" || t == "I64" || t == "U64") return 8;
  if (t == "F32" || t == "I32" || t == "U32") return 4;
  if (t == "F16" || t == "BF16" || t == "I16" || t == "U16") return 2;
  if (t == "I8" || t == "U8" || t == "BOOL" || t == "F8_E4M3" || t == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

int64_t SafetensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  STRATA_INPUT_CHECK(in.good(), "cannot open safetensors file ", path);
  const auto size = size_t(in.tellg());
  STRATA_INPUT_CHECK(size >= 8, path, ": ", size, " bytes is too short for a safetensors file");
  bytes_.resize(size);
  in.seekg(0);
  in.read(bytes_.data(), std::streamsize(size));
  uint64_t n = 0;
  std::memcpy(&n, bytes_.data(), 8);
  STRATA_INPUT_CHECK(n <= size - 8 && n <= 100000000, path, ": header length ", n,
                     " exceeds the file (", size, " bytes); the file is truncated or corrupt");
  data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + std::ptrdiff_t(n));
  } catch (const nlohmann::json::exception& e) {
    STRATA_INPUT_FAIL(path, ": the safetensors header is not valid JSON: ", e.what());
  }
  STRATA_INPUT_CHECK(header.is_object(), path, ": the safetensors header is not a JSON object");
  const size_t data_size = size - data_start_;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, val] : v.items()) metadata_[k] = val.get<std::string>();
      continue;
    }
    SafetensorView t;
    try {
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      STRATA_INPUT_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size, path,
                         ": tensor '", name, "' has data_offsets outside the data section");
      t.data = bytes_.data() + data_start_ + off[0];
      t.bytes = size_t(off[1] - off[0]);
    } catch (const nlohmann::json::exception& e) {
      STRATA_INPUT_FAIL(path, ": tensor '", name, "' has a malformed entry: ", e.what());
    }
    size_t es = dtype_bytes(t.dtype);
    STRATA_INPUT_CHECK(es != 0, path, ": tensor '", name, "' has unknown dtype ", t.dtype);
    STRATA_INPUT_CHECK(size_t(t.numel()) * es == t.bytes, path, ": tensor '", name, "' holds ",
                       t.bytes, " bytes but its shape and dtype need ", size_t(t.numel()) * es);
    index_[name] = t;
  }
}

SafetensorView SafetensorsFile::get(const std::string& name, const std::string& dtype) const {
  auto it = index_.find(name);
  STRATA_INPUT_CHECK(it != index_.end(), path_, " has no tensor named '", name, "'");
  STRATA_INPUT_CHECK(dtype.empty() || it->second.dtype == dtype, path_, ": tensor '", name, "' is ",
                     it->second.dtype, ", expected ", dtype);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            std::vector<int64_t> shape, const void* data, size_t bytes) {
  Entry e{name, dtype, std::move(shape), std::vector<char>(bytes)};
  std::memcpy(e.data.data(), data, bytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    STRATA_INPUT_CHECK(out.good(), "cannot write ", tmp);
    uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const Entry& e : entries_) out.write(e.data.data(), std::streamsize(e.data.size()));
    out.flush();
    STRATA_INPUT_CHECK(out.good(), "writing ", tmp, " failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace strata
