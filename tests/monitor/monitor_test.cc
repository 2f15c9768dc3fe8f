// The monitor layer alone: TFRecord framing of the TensorBoard writer (read back record by record
// with the CRCs checked) and the CSV monitor's DeepSpeed layout and trimming on resume. The
// TensorBoard package reading strata's files is monitor_peer_test.sh.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/crc32c.h"
#include "strata/monitor/csv_monitor.h"
#include "strata/monitor/tb_event.pb.h"
#include "strata/monitor/tensorboard.h"

namespace strata::monitor {
namespace {

std::string temp_dir() {
  std::string t = "/tmp/strata_monitor_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint8_t(b[at + size_t(i)]);
  return v;
}

// Every record of a TFRecord file, each CRC checked.
std::vector<tensorflow::Event> read_events(const std::string& path) {
  const std::string b = read_all(path);
  std::vector<tensorflow::Event> out;
  for (size_t at = 0; at < b.size();) {
    EXPECT_LE(at + 12, b.size());
    const uint64_t n = le(b, at, 8);
    EXPECT_EQ(le(b, at + 8, 4), tfrecord_masked_crc(b.data() + at, 8));
    EXPECT_LE(at + 12 + n + 4, b.size());
    const std::string data = b.substr(at + 12, n);
    EXPECT_EQ(le(b, at + 12 + n, 4), tfrecord_masked_crc(data.data(), data.size()));
    tensorflow::Event e;
    EXPECT_TRUE(e.ParseFromString(data));
    out.push_back(e);
    at += 12 + n + 4;
  }
  return out;
}

TEST(Monitor, MaskedCrcIsTFRecords) {
  // The mask of TFRecord: rotate right by 15, add 0xa282ead8.
  const uint32_t crc = crc32c("123456789", 9);
  EXPECT_EQ(tfrecord_masked_crc("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(tfrecord_masked_crc("123456789", 9), crc);
}

TEST(Monitor, EventFileHoldsTheVersionStartAndScalars) {
  const std::string dir = temp_dir() + "/a/b";
  std::string path;
  {
    TensorBoardWriter w(dir, 17);
    w.write(24, {{"Train/Samples/train_loss", 2.5}, {"Train/Samples/lr", 1e-3}}, 1234.5);
    w.write(32, {{"Train/Samples/train_loss", 2.25}}, 1235.5);
    path = w.path();
  }
  EXPECT_NE(path.find("/a/b/events.out.tfevents."), std::string::npos) << path;
  const std::vector<tensorflow::Event> ev = read_events(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version(), "brain.Event:2");
  EXPECT_EQ(ev[1].session_log().status(), tensorflow::SessionLog::START);
  EXPECT_EQ(ev[1].step(), 17);
  EXPECT_EQ(ev[2].step(), 24);
  EXPECT_DOUBLE_EQ(ev[2].wall_time(), 1234.5);
  ASSERT_EQ(ev[2].summary().value_size(), 2);
  EXPECT_EQ(ev[2].summary().value(0).tag(), "Train/Samples/train_loss");
  EXPECT_EQ(ev[2].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(ev[2].summary().value(1).simple_value(), 1e-3f);
  EXPECT_EQ(ev[3].summary().value(0).simple_value(), 2.25f);
  std::filesystem::remove_all(dir);
}

TEST(Monitor, CsvIsDeepSpeedsLayoutAndAResumeKeepsOneRowPerStep) {
  const std::string dir = temp_dir();
  {
    CsvMonitor m(dir, 0);
    for (int s = 1; s <= 4; ++s) m.write(8 * s, {{"Train/Samples/train_loss", 1.0 / s}});
    EXPECT_EQ(m.file_of("Train/Samples/a b"), dir + "/Train_Samples_a_b.csv");
  }
  const std::string file = dir + "/Train_Samples_train_loss.csv";
  EXPECT_EQ(read_all(file), "step,train_loss\n8,1\n16,0.5\n24,0.3333333333333333\n32,0.25\n");
  {
    CsvMonitor m(dir, 16);  // resumed after 16 samples: rows 24 and 32 are trained again
    m.write(24, {{"Train/Samples/train_loss", 0.75}});
  }
  EXPECT_EQ(read_all(file), "step,train_loss\n8,1\n16,0.5\n24,0.75\n");
  {
    CsvMonitor m(dir, 0);  // a fresh run starts the file over
    m.write(8, {{"Train/Samples/train_loss", 3.0}});
  }
  EXPECT_EQ(read_all(file), "step,train_loss\n8,3\n");
  std::filesystem::remove_all(dir);
}

TEST(Monitor, AnUnwritableDirectoryIsAnInputError) {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/file") << "x";
  try {
    TensorBoardWriter w(dir + "/file/tb", 1);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensorboard.output_path"), std::string::npos) << e.what();
  }
  try {
    CsvMonitor m(dir + "/file/csv", 0);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("csv_monitor.output_path"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::monitor
