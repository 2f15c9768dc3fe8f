// TensorBoard event files, as TensorFlow's and PyTorch's SummaryWriter write them: TFRecord
// framing (a little-endian uint64 length, the masked CRC-32C of the length, the bytes, their
// masked CRC-32C) around serialized tensorflow.Event messages (tb_event.proto), the first of them
// the file version "brain.Event:2". TensorBoard reads every events.out.tfevents.* file of a
// directory in name order; the name starts with the creation time, so a restarted run's new file
// sorts after the old one.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "strata/monitor/scalars.h"

namespace strata::monitor {

class TensorBoardWriter {
 public:
  // Creates dir (and its parents) and a new event file in it. first_step > 0 writes a
  // SessionLog START at first_step: TensorBoard drops the events of earlier files from that step
  // on (for a resumed run, the steps the interrupted run logged and this one trains again). An
  // InputError names a directory or file that cannot be made.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  // One Event with every scalar of `values` (as float, TensorBoard's simple_value) at `step`.
  void write(int64_t step, const Scalars& values, double wall_time);
  // Pushes what was written to the file, so that a TensorBoard watching it sees the step.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& bytes);
  std::string path_;
  std::ofstream out_;
  bool warned_ = false;
};

// The masked CRC-32C of TFRecord framing: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t tfrecord_masked_crc(const void* data, size_t n);

}  // namespace strata::monitor
