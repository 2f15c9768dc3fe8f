#include "strata/core/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/core/check.h"

namespace strata {
namespace {

// A file: the 8-byte little-endian header length, the header, the data.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(n >> (8 * i) & 0xff);
  return out + header + data;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "strata_safetensors_" + std::to_string(::getpid()) + "_" + name;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string input_error(const std::string& bytes) {
  try {
    parse_safetensors_header(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* expected;  // in the message, after "bad.safetensors"
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}
std::string one(const std::string& dtype, const std::string& shape, const std::string& offsets,
                const std::string& data = std::string(8, 'x')) {
  return file_bytes(R"({"t":)" + entry(dtype, shape, offsets) + "}", data);
}

std::vector<Malformed> malformed_cases() {
  const std::string f32 = R"("F32")";
  std::string huge_length = file_bytes("{}", "");
  std::memset(huge_length.data(), 0xff, 8);
  return {
      {"TooShort", "abc", ": 3 bytes is too short for a safetensors file"},
      {"HeaderBeyondFile", file_bytes("{}", "").substr(0, 9), "header length 2 exceeds the file"},
      {"HeaderOverLimit", huge_length, "header length 18446744073709551615 is over the"},
      {"NotJson", file_bytes(R"({"t": )", ""), "the safetensors header is not valid JSON"},
      {"NotUtf8", file_bytes("{\"\xff\": 1}", ""), "not valid JSON"},
      {"Comment", file_bytes("{} // x", ""), "not valid JSON"},
      {"NotObject", file_bytes("[1, 2]", ""), "the safetensors header is not a JSON object"},
      {"TooDeep", file_bytes(R"({"t":)" + std::string(20, '[') + std::string(20, ']') + "}", ""),
       "nests deeper than 16 levels"},
      {"FarTooDeep", file_bytes(std::string(1000000, '['), ""), "nests deeper than 16 levels"},
      {"EntryNotObject", file_bytes(R"({"t": 5})", ""), "tensor 't' is not an object"},
      {"NoDtype", file_bytes(R"({"t": {"shape": [], "data_offsets": [0, 4]}})", "xxxx"),
       "tensor 't' has no dtype string"},
      {"DtypeNotString", one("4", "[2]", "[0, 8]"), "tensor 't' has no dtype string"},
      {"UnknownDtype", one(R"("F33")", "[2]", "[0, 8]"), "tensor 't' has unknown dtype 'F33'"},
      {"NoShape", file_bytes(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", "xxxx"),
       "tensor 't' has no shape"},
      {"ShapeNotList", one(f32, "2", "[0, 8]"), "tensor 't' has no shape"},
      {"NegativeDim", one(f32, "[2, -1]", "[0, 8]"), "tensor 't' has dimension 1 = -1, below 0"},
      {"FractionalDim", one(f32, "[1.5]", "[0, 8]"), "dimension 0 = 1.5, not an integer"},
      {"StringDim", one(f32, R"(["2"])", "[0, 8]"), R"(dimension 0 = "2", not an integer)"},
      {"DimAboveInt64", one(f32, "[18446744073709551615]", "[0, 8]"), "above 2^63 - 1"},
      {"NumelOverflows", one(f32, "[4294967296, 4294967296]", "[0, 8]"),
       "shape [4294967296, 4294967296] whose size in bytes overflows 64 bits"},
      {"BytesOverflow", one(f32, "[4611686018427387904]", "[0, 8]"),
       "whose size in bytes overflows 64 bits"},
      {"NoOffsets", file_bytes(R"({"t": {"dtype": "F32", "shape": [1]}})", "xxxx"),
       "tensor 't' has no data_offsets; expected two non-negative integers"},
      {"OneOffset", one(f32, "[2]", "[8]"), "has data_offsets [8]; expected two"},
      {"ThreeOffsets", one(f32, "[2]", "[0, 4, 8]"), "expected two non-negative integers"},
      {"NegativeOffset", one(f32, "[2]", "[-8, 0]"), "expected two non-negative integers"},
      {"FractionalOffset", one(f32, "[2]", "[0, 8.0]"), "expected two non-negative integers"},
      {"BeginAfterEnd", one(f32, "[2]", "[8, 0]"), "has data_offsets [8, 0], begin > end"},
      {"EndBeyondData", one(f32, "[4]", "[0, 16]"),
       "has data_offsets [0, 16] beyond the data section (8 bytes after the header)"},
      {"EndFarBeyondData", one(f32, "[2]", "[18446744073709551608, 18446744073709551615]"),
       "beyond the data section"},
      {"SizeMismatch", one(f32, "[3]", "[0, 8]"),
       "tensor 't' holds 8 bytes but its shape [3] and dtype F32 need 12"},
      {"Overlap",
       file_bytes(R"({"a":)" + entry(f32, "[2]", "[0, 8]") + R"(,"b":)" +
                      entry(f32, "[2]", "[4, 12]") + "}",
                  std::string(12, 'x')),
       "tensors 'a' (data_offsets [0, 8]) and 'b' ([4, 12]) overlap"},
      {"Contained",
       file_bytes(R"({"a":)" + entry(f32, "[4]", "[0, 16]") + R"(,"b":)" +
                      entry(f32, "[1]", "[4, 8]") + "}",
                  std::string(16, 'x')),
       "overlap"},
      {"MetadataNotObject", file_bytes(R"({"__metadata__": "x"})", ""),
       "__metadata__ is not an object of strings"},
      {"MetadataNotString", file_bytes(R"({"__metadata__": {"k": 1}})", ""),
       "__metadata__ 'k' is not a string but 1"},
      {"DuplicateTensor",
       file_bytes(R"({"a":)" + entry(f32, "[1]", "[0, 4]") + R"(,"a":)" +
                      entry(f32, "[1]", "[4, 8]") + "}",
                  std::string(8, 'x')),
       "the safetensors header has key 'a' twice at the top level"},
      {"DuplicateField",
       file_bytes(
           R"({"a": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
           "xxxx"),
       "has key 'dtype' twice in 'a'"},
      {"DuplicateMetadata", file_bytes(R"({"__metadata__": {"k": "1", "k": "2"}})", ""),
       "has key 'k' twice in '__metadata__'"},
  };
}

class SafetensorsMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformed, IsAnInputErrorNamingFileAndProblem) {
  const std::string msg = input_error(GetParam().bytes);
  EXPECT_EQ(msg.rfind("bad.safetensors", 0), 0u) << msg;
  EXPECT_NE(msg.find(GetParam().expected), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 600u) << "messages quote the file only briefly";
  for (char c : msg) EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << "unprintable byte in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsMalformed, ::testing::ValuesIn(malformed_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Safetensors, LongNamesAreClippedInMessages) {
  const std::string name(1 << 20, 'n');
  const std::string msg = input_error(file_bytes("{\"" + name + "\": 1}", ""));
  EXPECT_NE(msg.find("is not an object"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 600u);
}

// A valid file of every shape of entry: scalar, empty, 2-D, several dtypes, metadata.
SafetensorsWriter sample_writer(std::vector<float>& w, std::vector<int64_t>& ids) {
  w = {1.5f, -2.f, 3.25f, 0.f, 7.f, -0.5f};
  ids = {1, -2, 1LL << 40};
  const uint16_t h[3] = {0x3f80, 0x4000, 0xc040};
  const float scalar = 42.f;
  SafetensorsWriter writer;
  writer.add("w", "F32", {2, 3}, w.data(), w.size() * 4);
  writer.add("ids", "I64", {3}, ids.data(), ids.size() * 8);
  writer.add("half", "BF16", {3}, h, sizeof h);
  writer.add("empty", "F32", {0, 5}, nullptr, 0);
  writer.add("scalar", "F32", {}, &scalar, 4);
  writer.set_metadata("format", "pt");
  writer.set_metadata("step", "100");
  return writer;
}

TEST(Safetensors, RoundTripsThroughWriterAndBothReaders) {
  std::vector<float> w;
  std::vector<int64_t> ids;
  const std::string path = temp_path("roundtrip.safetensors");
  sample_writer(w, ids).write(path);
  const std::filesystem::path written(path);
  for (const auto& e : std::filesystem::directory_iterator(written.parent_path())) {
    EXPECT_NE(e.path().filename().string().rfind(written.filename().string() + ".tmp", 0), 0u)
        << "left behind: " << e.path();
  }

  SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"empty", "half", "ids", "scalar", "w"}));
  EXPECT_EQ(file.metadata().at("step"), "100");
  SafetensorView v = file.get("w", "F32");
  EXPECT_EQ(v.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v.numel(), 6);
  ASSERT_EQ(v.bytes, 24u);
  EXPECT_EQ(std::memcmp(v.data, w.data(), 24), 0);
  EXPECT_EQ(file.get("empty").numel(), 0);
  EXPECT_EQ(file.get("scalar").shape.size(), 0u);
  // Tensors in a safetensors file are not aligned to their dtype ("scalar" follows "half"'s 2-byte
  // elements): read the value as bytes.
  float scalar = 0.f;
  std::memcpy(&scalar, file.get("scalar").data, sizeof scalar);
  EXPECT_EQ(scalar, 42.f);
  EXPECT_THROW(file.get("w", "BF16"), InputError);
  EXPECT_THROW(file.get("nope"), InputError);

  // The index locates the same bytes in the file without reading them.
  const SafetensorsIndex index = read_safetensors_index(path);
  const std::string bytes = read_file(path);
  EXPECT_EQ(index.file_size, bytes.size());
  EXPECT_EQ(index.data_start % 8, 0u) << "the writer pads the header to 8 bytes";
  EXPECT_EQ(index.metadata, file.metadata());
  ASSERT_EQ(index.tensors.size(), 5u);
  for (const std::string& name : file.names()) {
    const SafetensorsEntry& e = index.at(name);
    const SafetensorView fv = file.get(name);
    EXPECT_EQ(e.dtype, fv.dtype);
    EXPECT_EQ(e.shape, fv.shape);
    EXPECT_EQ(e.bytes, fv.bytes);
    EXPECT_EQ(bytes.compare(e.offset, e.bytes, static_cast<const char*>(fv.data), fv.bytes), 0)
        << name;
  }
  const SafetensorsEntry& e = index.at("ids", "I64");
  std::vector<int64_t> back(3);
  std::memcpy(back.data(), bytes.data() + e.offset, e.bytes);
  EXPECT_EQ(back, ids);

  // The in-memory parser, on the whole file and on just its header.
  const SafetensorsIndex whole = parse_safetensors_header(bytes.data(), bytes.size(), path);
  const SafetensorsIndex head =
      parse_safetensors_header(bytes.data(), size_t(index.data_start), bytes.size(), path);
  for (const SafetensorsIndex* other : {&whole, &head}) {
    EXPECT_EQ(other->data_start, index.data_start);
    EXPECT_EQ(other->metadata, index.metadata);
    for (const auto& [name, entry] : index.tensors) {
      EXPECT_EQ(other->at(name).offset, entry.offset);
      EXPECT_EQ(other->at(name).shape, entry.shape);
    }
  }
  std::filesystem::remove(path);
}

TEST(Safetensors, AcceptsGapsUnknownFieldsAndEmptyTensorsAnywhere) {
  const std::string header = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8],
                                       "extra": {"x": [1]}},
                                 "z": {"dtype": "F32", "shape": [0], "data_offsets": [5, 5]}})";
  const std::string bytes = file_bytes(header, "pad!data");
  const SafetensorsIndex index = parse_safetensors_header(bytes.data(), bytes.size(), "ok");
  EXPECT_EQ(bytes.substr(index.at("a").offset, 4), "data");
  EXPECT_EQ(index.at("z").bytes, 0u);
}

TEST(Safetensors, IndexReaderNamesTheFile) {
  const std::string path = temp_path("truncated.safetensors");
  std::vector<float> w;
  std::vector<int64_t> ids;
  sample_writer(w, ids).write(path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  for (auto read : {+[](const std::string& p) { (void)read_safetensors_index(p); },
                    +[](const std::string& p) { SafetensorsFile f(p); }}) {
    try {
      read(path);
      ADD_FAILURE() << "a truncated file was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": tensor"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the file is truncated"), std::string::npos);
    }
  }
  std::filesystem::remove(path);
  EXPECT_THROW(read_safetensors_index(path), InputError);
  EXPECT_THROW(read_safetensors_index(::testing::TempDir()), InputError);
  EXPECT_THROW(SafetensorsFile{::testing::TempDir()}, InputError);
}

// The index reader reads the header only: a 64 GiB (sparse) file indexes at once.
TEST(Safetensors, IndexReaderDoesNotReadTensorData) {
  const uint64_t big = uint64_t(1) << 36;
  const std::string header = R"({"big": {"dtype": "U8", "shape": [)" + std::to_string(big) +
                             R"(], "data_offsets": [0, )" + std::to_string(big) + "]}}";
  const std::string path = temp_path("sparse.safetensors");
  write_file(path, file_bytes(header, ""));
  std::error_code ec;
  std::filesystem::resize_file(path, 8 + header.size() + big, ec);
  if (ec) GTEST_SKIP() << "no sparse 64 GiB file here: " << ec.message();
  const SafetensorsIndex index = read_safetensors_index(path);
  EXPECT_EQ(index.at("big").offset, 8 + header.size());
  EXPECT_EQ(index.at("big").bytes, big);
  std::filesystem::remove(path);
}

TEST(SafetensorsWriter, RefusesWhatTheReaderWouldReject) {
  const float x[2] = {1, 2};
  SafetensorsWriter writer;
  writer.add("x", "F32", {2}, x, 8);
  EXPECT_THROW(writer.add("x", "F32", {2}, x, 8), Error);
  EXPECT_THROW(writer.add("__metadata__", "F32", {2}, x, 8), Error);
  EXPECT_THROW(writer.add("y", "F33", {2}, x, 8), Error);
  EXPECT_THROW(writer.add("y", "F32", {3}, x, 8), Error);
  EXPECT_THROW(writer.add("y", "F32", {-1, -2}, x, 8), Error);
  EXPECT_THROW(writer.add("y", "F32", {int64_t(1) << 62, 4}, x, 8), Error);
  EXPECT_NO_THROW(writer.add("y", "F32", {2}, x, 8)) << "a refused tensor is not half added";
}

}  // namespace
}  // namespace strata
