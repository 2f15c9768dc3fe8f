// The types of the kernel interface's streams and events (kernels/ops.h, "streams and events",
// states the contract). They live in core so that comm/, which does not link kernels/, can take
// and give events: a collective waits for an event before it reads its buffer, and its handle
// gives the event of its completion.
#pragma once

#include <cstdint>

#include "strata/core/device.h"

namespace strata::ops {

enum class StreamKind : uint8_t { Compute, Comm };

// One of a device's two streams: the compute stream every kernel runs on, and the communication
// stream the collectives run on.
struct Stream {
  Device device = Device::CPU;
  StreamKind kind = StreamKind::Compute;
};

// A queue whose operations complete in order, numbered 1, 2, ...: what an event that is not
// complete at once points into. On the CPU a communicator's comm thread (comm/comm_stream.h)
// implements it; a device backend implements it over its own events.
class Completion {
 public:
  virtual bool done(uint64_t seq) const = 0;
  // Blocks until operation seq has completed; rethrows the error it raised (to one waiter).
  virtual void wait(uint64_t seq) = 0;

 protected:
  ~Completion() = default;
};

// A point in one stream's work. Two words, copied freely, never allocating; the default is
// complete. It must not outlive the queue it points into.
class Event {
 public:
  Event() = default;
  Event(Completion* queue, uint64_t seq) : queue_(queue), seq_(seq) {}

  bool done() const { return queue_ == nullptr || queue_->done(seq_); }
  // The host blocks until the work is done (ops::synchronize(const Event&)).
  void wait() const {
    if (queue_ != nullptr) queue_->wait(seq_);
  }
  // Which queue and which of its operations: a backend orders its own streams by these (a CUDA
  // stream waits on the device event behind seq of one of its queues).
  const Completion* queue() const { return queue_; }
  uint64_t seq() const { return seq_; }

 private:
  Completion* queue_ = nullptr;
  uint64_t seq_ = 0;
};

}  // namespace strata::ops
