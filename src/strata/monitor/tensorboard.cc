#include "strata/monitor/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "strata/core/check.h"
#include "strata/core/crc32c.h"
#include "strata/monitor/tb_event.pb.h"

namespace strata::monitor {

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_INPUT_CHECK(!ec, "cannot create the TensorBoard directory '", dir, "': ", ec.message(),
                     "; set tensorboard.output_path to a writable directory");
  // SummaryWriter's name: the time first (files sort in the order runs made them), then the host
  // and the process, which keep two runs started in the same second apart.
  const double t = now_seconds();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.strata",
                static_cast<long long>(t), host_name().c_str(), int(getpid()));
  path_ = (std::filesystem::path(dir) / name).string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  STRATA_INPUT_CHECK(out_.good(), "cannot write the TensorBoard event file ", path_,
                     "; set tensorboard.output_path to a writable directory");
  tensorflow::Event version;
  version.set_wall_time(t);
  version.set_file_version("brain.Event:2");
  record(version.SerializeAsString());
  if (first_step > 0) {
    tensorflow::Event start;
    start.set_wall_time(t);
    start.set_step(first_step);
    start.mutable_session_log()->set_status(tensorflow::SessionLog::START);
    record(start.SerializeAsString());
  }
  flush();
}

void TensorBoardWriter::write(int64_t step, const Scalars& values, double wall_time) {
  tensorflow::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  tensorflow::Summary* summary = e.mutable_summary();
  for (const Scalar& s : values) {
    tensorflow::Summary::Value* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value(float(s.value));
  }
  record(e.SerializeAsString());
}

void TensorBoardWriter::flush() {
  out_.flush();
}

void TensorBoardWriter::record(const std::string& bytes) {
  std::string frame;
  frame.reserve(bytes.size() + 16);
  put_le(frame, bytes.size(), 8);
  put_le(frame, tfrecord_masked_crc(frame.data(), 8), 4);
  frame += bytes;
  put_le(frame, tfrecord_masked_crc(bytes.data(), bytes.size()), 4);
  out_.write(frame.data(), std::streamsize(frame.size()));
  // A full disk or a vanished directory costs the monitor, never the run: one warning.
  if (!out_.good() && !warned_) {
    warned_ = true;
    std::fprintf(stderr, "warning: cannot write the TensorBoard event file %s; training goes on\n",
                 path_.c_str());
  }
}

}  // namespace strata::monitor
