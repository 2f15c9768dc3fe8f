#include "strata/comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <exception>
#include <thread>
#include <utility>

#include "strata/comm/comm_stream.h"
#if STRATA_HAVE_NCCL
#include "strata/comm/cuda/nccl_transport.h"
#endif
#include "strata/comm/flight_recorder.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/wire_reduce.h"
#include "strata/core/check.h"
#include "strata/core/device_memory.h"
#include "strata/core/memory.h"
#include "strata/kernels/ops.h"

namespace strata::comm {

namespace detail {

// Everything the comm thread touches, so that it can outlive a Communicator abandoned during
// stack unwinding.
struct CommState {
  std::string name;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  Buffer scratch;                // wire-format copies; used only on the comm thread
  Buffer staged_in, staged_out;  // a GPU's buffers in host memory (execute_staged)
#if STRATA_HAVE_NCCL
  // NCCL for the group's GPU buffers; null where it cannot serve the group (nccl_note says why).
  std::unique_ptr<nccl::Transport, void (*)(nccl::Transport*)> nccl{nullptr, nullptr};
  std::string nccl_note;
#endif
  int flight_group = 0;       // its id in the flight recorder
  bool polled = false;        // set_polled_background
  uint64_t wire_bytes = 0;    // see Communicator::wire_bytes(); written by the issuing thread
  std::vector<int> v_counts;  // all_to_all_v's MPI counts and displacements (4 · size)
  std::unique_ptr<CommStream> stream;
};

}  // namespace detail

namespace {

using detail::CommState;
using detail::Op;
using detail::OpKind;

// MPI counts are int: larger element counts go in chunks of this many.
constexpr size_t kMaxCount = size_t(1) << 30;

size_t round_up64(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

// The MPI transport works on the CPU device's memory: a GPU's buffers reach it staged through
// host memory (execute_staged), so its scratch and conversions are the CPU device's.
char* scratch(CommState& s, size_t bytes) {
  if (s.scratch.bytes() < bytes) s.scratch = Buffer(MemCategory::CommBuffers, bytes, Device::CPU);
  return s.scratch.as<char>();
}

// dst (n of dtype dt) = src (n of dtype st), converted by the kernel interface.
void to_wire(void* dst, DType dt, const void* src, DType st, size_t n) {
  ops::copy(Tensor(dst, dt, {int64_t(n)}, Device::CPU),
            Tensor(const_cast<void*>(src), st, {int64_t(n)}, Device::CPU));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// Threads of this process inside a blocking MPI operation: each of them drives MPI's progress
// engine, which advances every request of the process, the background ones included.
std::atomic<int> g_blocking_in_mpi{0};

// A background operation's request to completion, polled (MPI_Test progresses every request of
// the process). While another thread is inside a blocking MPI operation it progresses this one
// too, so this thread sleeps between polls (20 µs) rather than spin beside it: a blocking
// collective of the compute thread (tensor parallelism's, on cores the ranks share) would
// otherwise wait for a peer whose core this thread takes. Alone, it polls, yielding the core.
void wait_sleeping(MPI_Request& r) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    STRATA_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (g_blocking_in_mpi.load(std::memory_order_relaxed) > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else if (polls > 64) {
      std::this_thread::yield();
    }
  }
}

void all_reduce_in_place(CommState& s, void* buf, size_t n, DType t, bool background) {
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < n; off += kMaxCount) {
    const int count = int(std::min(kMaxCount, n - off));
    if (background) {
      MPI_Request r = MPI_REQUEST_NULL;
      STRATA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p + off * dtype_size(t), count,
                                      detail::mpi_datatype(t), detail::mpi_sum(t), s.comm, &r));
      wait_sleeping(r);
      continue;
    }
    STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), count,
                                   detail::mpi_datatype(t), detail::mpi_sum(t), s.comm));
  }
}

void run_all_reduce(CommState& s, const Op& op) {
  if (op.wire == op.dtype) return all_reduce_in_place(s, op.out, op.n, op.dtype, op.background);
  char* w = scratch(s, op.n * dtype_size(op.wire));
  to_wire(w, op.wire, op.out, op.dtype, op.n);
  all_reduce_in_place(s, w, op.n, op.wire, op.background);
  to_wire(op.out, op.dtype, w, op.wire, op.n);
}

void run_reduce_scatter(CommState& s, const Op& op) {
  const size_t total = op.n * size_t(s.size);
  const bool convert_in = op.wire != op.dtype;
  // MPI forbids the output inside the input; such a result goes through scratch too.
  const bool via_scratch = convert_in || overlaps(op.in, total * dtype_size(op.dtype), op.out,
                                                  op.n * dtype_size(op.dtype));
  const size_t in_bytes = convert_in ? round_up64(total * dtype_size(op.wire)) : 0;
  char* w = scratch(s, in_bytes + (via_scratch ? op.n * dtype_size(op.wire) : 0));
  const void* send = op.in;
  if (convert_in) {
    to_wire(w, op.wire, op.in, op.dtype, total);
    send = w;
  }
  void* result = via_scratch ? w + in_bytes : op.out;
  if (op.background) {
    MPI_Request r = MPI_REQUEST_NULL;
    STRATA_MPI_CHECK(MPI_Ireduce_scatter_block(send, result, int(op.n),
                                               detail::mpi_datatype(op.wire),
                                               detail::mpi_sum(op.wire), s.comm, &r));
    wait_sleeping(r);
  } else {
    STRATA_MPI_CHECK(MPI_Reduce_scatter_block(
        send, result, int(op.n), detail::mpi_datatype(op.wire), detail::mpi_sum(op.wire), s.comm));
  }
  if (via_scratch) to_wire(op.out, op.dtype, result, op.wire, op.n);
}

void run_all_gather(CommState& s, const Op& op) {
  const MPI_Datatype t = detail::mpi_datatype(op.dtype);
  const char* own = static_cast<const char*>(op.out) + size_t(s.rank) * op.n * dtype_size(op.dtype);
  if (op.in == own) {
    STRATA_MPI_CHECK(
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, op.out, int(op.n), t, s.comm));
  } else {
    STRATA_MPI_CHECK(MPI_Allgather(op.in, int(op.n), t, op.out, int(op.n), t, s.comm));
  }
}

void run_broadcast(CommState& s, const Op& op) {
  char* p = static_cast<char*>(op.out);
  for (size_t off = 0; off < op.n; off += kMaxCount) {
    const int count = int(std::min(kMaxCount, op.n - off));
    STRATA_MPI_CHECK(MPI_Bcast(p + off * dtype_size(op.dtype), count,
                               detail::mpi_datatype(op.dtype), op.peer, s.comm));
  }
}

void run_send(CommState& s, const Op& op) {
  const char* p = static_cast<const char*>(op.in);
  for (size_t off = 0; off < op.n; off += kMaxCount) {
    const int count = int(std::min(kMaxCount, op.n - off));
    STRATA_MPI_CHECK(MPI_Send(p + off * dtype_size(op.dtype), count, detail::mpi_datatype(op.dtype),
                              op.peer, op.tag, s.comm));
  }
}

void run_recv(CommState& s, const Op& op) {
  char* p = static_cast<char*>(op.out);
  for (size_t off = 0; off < op.n; off += kMaxCount) {
    const int count = int(std::min(kMaxCount, op.n - off));
    MPI_Status status;
    STRATA_MPI_CHECK(MPI_Recv(p + off * dtype_size(op.dtype), count, detail::mpi_datatype(op.dtype),
                              op.peer, op.tag, s.comm, &status));
    int got = 0;
    MPI_Get_count(&status, detail::mpi_datatype(op.dtype), &got);
    STRATA_CHECK(got == count, "recv on group ", s.name, " expected ", count,
                 " elements from rank ", op.peer, " (tag ", op.tag, ") but got ", got,
                 "; the ranks disagree on the message size");
  }
}

void run_all_to_all(CommState& s, const Op& op) {
  STRATA_CHECK(op.n <= size_t(INT_MAX), "all_to_all on group ", s.name, ": ", op.n,
               " elements per rank exceed MPI's count");
  const MPI_Datatype t = detail::mpi_datatype(op.dtype);
  STRATA_MPI_CHECK(MPI_Alltoall(op.in, int(op.n), t, op.out, int(op.n), t, s.comm));
}

// The counts' sums: what goes out and what comes in.
std::pair<size_t, size_t> v_totals(const CommState& s, const Op& op) {
  size_t out = 0, in = 0;
  for (int j = 0; j < s.size; ++j) out += op.counts[j], in += op.counts[s.size + j];
  return {out, in};
}

void run_all_to_all_v(CommState& s, const Op& op) {
  const int n = s.size;
  int* c = s.v_counts.data();  // send counts, send displacements, receive counts, displacements
  size_t sd = 0, rd = 0;
  for (int j = 0; j < n; ++j) {
    STRATA_CHECK(sd + op.counts[j] <= size_t(INT_MAX) && rd + op.counts[n + j] <= size_t(INT_MAX),
                 "all_to_all_v on group ", s.name, ": more elements than MPI's count");
    c[j] = int(op.counts[j]), c[n + j] = int(sd), sd += op.counts[j];
    c[2 * n + j] = int(op.counts[n + j]), c[3 * n + j] = int(rd), rd += op.counts[n + j];
  }
  const MPI_Datatype t = detail::mpi_datatype(op.dtype);
  STRATA_MPI_CHECK(MPI_Alltoallv(op.in, c, c + n, t, op.out, c + 2 * n, c + 3 * n, t, s.comm));
}

void run_send_recv(CommState& s, const Op& op) {
  STRATA_CHECK(op.n <= size_t(INT_MAX), "send_recv on group ", s.name, ": ", op.n,
               " elements exceed MPI's count");
  const MPI_Datatype t = detail::mpi_datatype(op.dtype);
  STRATA_MPI_CHECK(MPI_Sendrecv(op.in, int(op.n), t, op.peer, op.tag, op.out, int(op.n), t, op.src,
                                op.tag, s.comm, MPI_STATUS_IGNORE));
}

void execute_host(CommState& s, const Op& op) {
  // The transport reads and writes device memory itself, as NCCL does a GPU's.
  const device_memory::Access access;
  struct Blocking {  // counted in g_blocking_in_mpi while it runs (wait_sleeping)
    explicit Blocking(bool on) : on(on) {
      if (on) g_blocking_in_mpi.fetch_add(1, std::memory_order_relaxed);
    }
    ~Blocking() {
      if (on) g_blocking_in_mpi.fetch_sub(1, std::memory_order_relaxed);
    }
    const bool on;
  } blocking(!op.background);
  switch (op.kind) {
    case OpKind::AllReduce:
      return run_all_reduce(s, op);
    case OpKind::ReduceScatter:
      return run_reduce_scatter(s, op);
    case OpKind::AllGather:
      return run_all_gather(s, op);
    case OpKind::Broadcast:
      return run_broadcast(s, op);
    case OpKind::Send:
      return run_send(s, op);
    case OpKind::Recv:
      return run_recv(s, op);
    case OpKind::Barrier:
      STRATA_MPI_CHECK(MPI_Barrier(s.comm));
      return;
    case OpKind::AllToAll:
      return run_all_to_all(s, op);
    case OpKind::AllToAllV:
      return run_all_to_all_v(s, op);
    case OpKind::SendRecv:
      return run_send_recv(s, op);
  }
}

// The bytes op reads from `in` and reads or writes at `out` (0 where it has no such buffer).
struct Extent {
  size_t in = 0, out = 0;
};
Extent extent(const CommState& s, const Op& op) {
  const size_t b = op.n * dtype_size(op.dtype), whole = b * size_t(s.size);
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Recv:
      return {0, b};
    case OpKind::ReduceScatter:
      return {whole, b};
    case OpKind::AllGather:
      return {b, whole};
    case OpKind::Send:
      return {b, 0};
    case OpKind::AllToAll:
      return {whole, whole};
    case OpKind::AllToAllV: {
      const auto [out, in] = v_totals(s, op);
      return {out * dtype_size(op.dtype), in * dtype_size(op.dtype)};
    }
    case OpKind::SendRecv:
      return {b, b};
    case OpKind::Barrier:
      break;
  }
  return {};
}

char* staging(Buffer& b, size_t bytes) {
  if (b.bytes() < bytes) b = Buffer::host(MemCategory::CommBuffers, bytes);
  return b.as<char>();
}

// op on a GPU's buffers, through host memory: MPI here is not CUDA-aware (NCCL reads a GPU's
// memory itself). The copies run on the device's communication stream and are complete when
// they return: the operation's completion (its Handle's event) covers the copy back.
void execute_staged(CommState& s, const Op& op) {
  const ops::OnStream on_comm({Device::CUDA, ops::StreamKind::Comm});
  const Extent e = extent(s, op);
  Op h = op;
  char* in = staging(s.staged_in, e.in);
  char* out = staging(s.staged_out, e.out);
  // The bytes at a device address, as op's elements (every extent is a whole number of them).
  auto dev = [&](const void* p, size_t bytes) {
    return Tensor(const_cast<void*>(p), op.dtype, {int64_t(bytes / dtype_size(op.dtype))},
                  Device::CUDA);
  };
  auto to_host = [&](char* dst, const void* src, size_t bytes) {
    ops::copy_to_host(dst, dev(src, bytes));
  };
  auto to_device = [&](void* dst, const char* src, size_t bytes) {
    ops::copy_from_host(dev(dst, bytes), src);
  };
  if (op.kind == OpKind::AllGather) {
    // The input may be this rank's own block of the output: stage it there.
    char* own = out + size_t(s.rank) * e.in;
    to_host(own, op.in, e.in);
    h.in = own;
  } else if (e.in > 0) {
    to_host(in, op.in, e.in);
    h.in = in;
  }
  if (e.out > 0) {
    if (op.kind == OpKind::AllReduce || op.kind == OpKind::Broadcast) to_host(out, op.out, e.out);
    h.out = out;
  }
  execute_host(s, h);
  if (e.out > 0) to_device(op.out, out, e.out);
}

void execute(CommState& s, const Op& op) {
  const void* buf = op.out != nullptr ? static_cast<const void*>(op.out) : op.in;
  if (buf != nullptr && ops::device_of(buf) == Device::CUDA) {
#if STRATA_HAVE_NCCL
    if (s.nccl) return nccl::run(*s.nccl, op, s.rank, s.size);
#endif
    return execute_staged(s, op);
  }
  execute_host(s, op);
}

std::string describe(const CommState& s, const Op& op) {
  const std::string group = strata::detail::concat(" on group ", s.name, " (size ", s.size, ")");
  switch (op.kind) {
    case OpKind::Send:
      return strata::detail::concat("point-to-point send of ", op.n, " elements to rank ", op.peer,
                                    " (tag ", op.tag, ")", group);
    case OpKind::Recv:
      return strata::detail::concat("point-to-point recv of ", op.n, " elements from rank ",
                                    op.peer, " (tag ", op.tag, ")", group);
    case OpKind::Barrier:
      return "collective barrier" + group;
    case OpKind::SendRecv:
      return strata::detail::concat("point-to-point send_recv of ", op.n, " elements to rank ",
                                    op.peer, " and from rank ", op.src, " (tag ", op.tag, ")",
                                    group);
    case OpKind::AllToAll:
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
      return strata::detail::concat("collective ", detail::op_name(op.kind), " of ", op.n,
                                    " elements per rank", group);
    case OpKind::AllToAllV:
      return strata::detail::concat("collective all_to_all_v sending ", v_totals(s, op).first,
                                    " and receiving ", v_totals(s, op).second, " elements", group);
    default:
      return strata::detail::concat("collective ", detail::op_name(op.kind), " of ", op.n,
                                    " elements", group);
  }
}

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  stream_ = o.stream_;
  seq_ = o.seq_;
  o.stream_ = nullptr;
  return *this;
}

void Handle::wait() {
  if (stream_ == nullptr) return;
  detail::CommStream* s = std::exchange(stream_, nullptr);
  s->wait(seq_);
}

bool Handle::done() const {
  return stream_ == nullptr || stream_->done(seq_);
}

ops::Event Handle::event() const {
  if (stream_ == nullptr) return {};
  return {stream_, seq_};
}

Communicator::Communicator(MPI_Comm comm, std::string name) : s_(std::make_unique<CommState>()) {
  STRATA_CHECK(initialized(), "comm::init must run before communicator ", name, " is made");
  detail::create_wire_ops();
  s_->name = std::move(name);
  STRATA_MPI_CHECK(MPI_Comm_dup(comm, &s_->comm));
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(s_->comm, MPI_ERRORS_RETURN));
  STRATA_MPI_CHECK(MPI_Comm_set_name(s_->comm, s_->name.c_str()));
  STRATA_MPI_CHECK(MPI_Comm_rank(s_->comm, &s_->rank));
  STRATA_MPI_CHECK(MPI_Comm_size(s_->comm, &s_->size));
  s_->v_counts.assign(size_t(4 * s_->size), 0);
#if STRATA_HAVE_NCCL
  s_->nccl = nccl::open(s_->comm, s_->rank, s_->size, s_->name, &s_->nccl_note);
#endif
  s_->flight_group = flight::register_group(s_->name, s_->comm);
  CommState* st = s_.get();
  s_->stream = std::make_unique<detail::CommStream>(
      "comm-" + s_->name,
      [st](const Op& op) {
        flight::start(op.flight);
        try {
          execute(*st, op);
        } catch (...) {
          flight::complete(op.flight, true);
          throw;
        }
        flight::complete(op.flight);
      },
      [st](const Op& op) { return describe(*st, op); });
}

Communicator::~Communicator() {
  if (!s_) return;
  if (std::uncaught_exceptions() > 0 && s_->stream->in_flight() > 0) {
    s_->stream->abandon();
    (void)s_.release();  // the detached thread may still be inside MPI with it
    return;
  }
  s_->stream.reset();
  if (initialized()) MPI_Comm_free(&s_->comm);
}

const std::string& Communicator::name() const {
  return s_->name;
}
int Communicator::rank() const {
  return s_->rank;
}
int Communicator::size() const {
  return s_->size;
}
void Communicator::set_timeout(std::chrono::seconds t) {
  s_->stream->set_timeout(t);
}
std::chrono::seconds Communicator::timeout() const {
  return s_->stream->timeout();
}

namespace {

void check_buffer(const CommState& s, const void* p, size_t n, const char* what) {
  STRATA_CHECK(p != nullptr || n == 0, what, " on group ", s.name, " got a null buffer for ", n,
               " elements");
}

void check_rank(const CommState& s, int r, const char* what) {
  STRATA_CHECK(r >= 0 && r < s.size, what, " on group ", s.name, ": rank ", r,
               " is outside the group of size ", s.size);
}

void check_per_rank(const CommState& s, size_t n_per_rank, const char* what) {
  STRATA_CHECK(n_per_rank <= size_t(INT_MAX), what, " on group ", s.name, ": ", n_per_rank,
               " elements per rank exceed MPI's limit of ", INT_MAX, "; split the buffer");
}

// Each operation, checked on the issuing thread, where a mistake is reported at its cause.
Op all_reduce_op(const CommState& s, void* buf, size_t n, DType dtype, DType wire) {
  check_buffer(s, buf, n, "all_reduce");
  return {.kind = OpKind::AllReduce, .out = buf, .n = n, .dtype = dtype, .wire = wire};
}

Op reduce_scatter_op(const CommState& s, const void* in, void* out, size_t n_per_rank, DType dtype,
                     DType wire) {
  check_buffer(s, in, n_per_rank, "reduce_scatter");
  check_buffer(s, out, n_per_rank, "reduce_scatter");
  check_per_rank(s, n_per_rank, "reduce_scatter");
  return {.kind = OpKind::ReduceScatter,
          .in = in,
          .out = out,
          .n = n_per_rank,
          .dtype = dtype,
          .wire = wire};
}

Op all_gather_op(const CommState& s, const void* in, void* out, size_t n_per_rank, DType dtype) {
  check_buffer(s, in, n_per_rank, "all_gather");
  check_buffer(s, out, n_per_rank, "all_gather");
  check_per_rank(s, n_per_rank, "all_gather");
  const size_t block = n_per_rank * dtype_size(dtype);
  const char* own = static_cast<const char*>(out) + size_t(s.rank) * block;
  STRATA_CHECK(in == own || !overlaps(in, block, out, block * size_t(s.size)),
               "all_gather on group ", s.name,
               ": the input overlaps the output other than as this rank's own block");
  return {.kind = OpKind::AllGather,
          .in = in,
          .out = out,
          .n = n_per_rank,
          .dtype = dtype,
          .wire = dtype};
}

Op broadcast_op(const CommState& s, void* buf, size_t n, DType dtype, int root) {
  check_buffer(s, buf, n, "broadcast");
  check_rank(s, root, "broadcast root");
  return {
      .kind = OpKind::Broadcast, .out = buf, .n = n, .dtype = dtype, .wire = dtype, .peer = root};
}

}  // namespace

namespace {

// Bytes one rank sends for op under bandwidth-optimal algorithms (DeepSpeed's and the ZeRO
// paper's accounting): ring all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather
// (N-1)/N of the whole (N blocks), broadcast (N-1)/N (pipelined), point-to-point the message.
uint64_t wire_bytes_of(const CommState& s, const Op& op) {
  const uint64_t N = uint64_t(s.size);
  const uint64_t w = dtype_size(op.wire), n = op.n;
  switch (op.kind) {
    case OpKind::AllReduce:
      return 2 * (N - 1) * n * w / N;
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
      return (N - 1) * n * w;
    case OpKind::Broadcast:
      return (N - 1) * n * w / N;
    case OpKind::Send:
    case OpKind::SendRecv:
      return n * w;
    case OpKind::AllToAll:
      return (N - 1) * n * w;
    case OpKind::AllToAllV:
      return (v_totals(s, op).first - op.counts[s.rank]) * w;
    default:
      return 0;
  }
}

}  // namespace

namespace {

// op with its flight recorder entry, issued now.
Op recorded(const CommState& s, Op op) {
  const flight::Kind kind = op.kind == OpKind::Send   ? flight::Kind::Send
                            : op.kind == OpKind::Recv ? flight::Kind::Recv
                                                      : flight::Kind::Collective;
  const uint64_t bytes = std::max(extent(s, op).in, extent(s, op).out);
  op.flight = flight::issue(s.flight_group, kind, detail::op_name(op.kind), op.peer, op.tag, bytes);
  return op;
}

}  // namespace

Handle Communicator::enqueue(const detail::Op& op_in, const ops::Event& after) {
  s_->wire_bytes += wire_bytes_of(*s_, op_in);
  Op op = recorded(*s_, op_in);
  op.background = s_->polled;
  return Handle(s_->stream.get(), s_->stream->submit(op, after));
}

void Communicator::run(const detail::Op& op_in) {
  s_->wire_bytes += wire_bytes_of(*s_, op_in);
  const Op op = recorded(*s_, op_in);
  // A blocking call reads what compute wrote before it (the contract above): on a GPU, wait for
  // the compute stream's work so far.
  const void* buf = op.out != nullptr ? static_cast<const void*>(op.out) : op.in;
  if (buf != nullptr && ops::device_of(buf) == Device::CUDA) {
    ops::synchronize(ops::record({Device::CUDA, ops::StreamKind::Compute}));
  }
  s_->stream->run_blocking(op);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  synchronize();  // MPI_Comm_split runs here, on the caller's thread: nothing may be in flight
  MPI_Comm sub = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(s_->comm, color, key, &sub));
  auto out = std::make_unique<Communicator>(sub, std::move(name));
  MPI_Comm_free(&sub);
  return out;
}

std::unique_ptr<Communicator> Communicator::product(Communicator& inner, std::string name) {
  synchronize();
  inner.synchronize();
  // The inner group's members as ranks of MPI_COMM_WORLD, gathered over this group.
  MPI_Group world = MPI_GROUP_NULL, in = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  STRATA_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  STRATA_MPI_CHECK(MPI_Comm_group(inner.s_->comm, &in));
  const int n = inner.size();
  std::vector<int> local(size_t(n), 0), mine(size_t(n), 0), all(size_t(n) * size_t(size()), 0);
  for (int i = 0; i < n; ++i) local[size_t(i)] = i;
  STRATA_MPI_CHECK(MPI_Group_translate_ranks(in, n, local.data(), world, mine.data()));
  STRATA_MPI_CHECK(MPI_Allgather(mine.data(), n, MPI_INT, all.data(), n, MPI_INT, s_->comm));
  std::vector<int> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  STRATA_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
               "the product of groups ", s_->name, " and ", inner.name(),
               " names a rank twice: the ", s_->name, " group's members must have disjoint ",
               inner.name(), " groups");
  STRATA_MPI_CHECK(MPI_Group_incl(world, int(all.size()), all.data(), &members));
  MPI_Comm comm = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, members, 0x5e7, &comm));
  MPI_Group_free(&members);
  MPI_Group_free(&in);
  MPI_Group_free(&world);
  auto out = std::make_unique<Communicator>(comm, std::move(name));
  MPI_Comm_free(&comm);
  return out;
}

void Communicator::set_polled_background(bool on) {
  s_->polled = on;
}

MPI_Comm Communicator::mpi_comm() const {
  return s_->comm;
}

uint64_t Communicator::wire_bytes() const {
  return s_->wire_bytes;
}

Handle Communicator::all_reduce_async(void* buf, size_t n, DType dtype, DType wire,
                                      const ops::Event& after) {
  return enqueue(all_reduce_op(*s_, buf, n, dtype, wire), after);
}

Handle Communicator::reduce_scatter_async(const void* in, void* out, size_t n_per_rank, DType dtype,
                                          DType wire, const ops::Event& after) {
  return enqueue(reduce_scatter_op(*s_, in, out, n_per_rank, dtype, wire), after);
}

Handle Communicator::all_gather_async(const void* in, void* out, size_t n_per_rank, DType dtype,
                                      const ops::Event& after) {
  return enqueue(all_gather_op(*s_, in, out, n_per_rank, dtype), after);
}

Handle Communicator::broadcast_async(void* buf, size_t n, DType dtype, int root,
                                     const ops::Event& after) {
  return enqueue(broadcast_op(*s_, buf, n, dtype, root), after);
}

void Communicator::all_reduce(void* buf, size_t n, DType dtype, DType wire) {
  run(all_reduce_op(*s_, buf, n, dtype, wire));
}

void Communicator::reduce_scatter(const void* in, void* out, size_t n_per_rank, DType dtype,
                                  DType wire) {
  run(reduce_scatter_op(*s_, in, out, n_per_rank, dtype, wire));
}

void Communicator::all_gather(const void* in, void* out, size_t n_per_rank, DType dtype) {
  run(all_gather_op(*s_, in, out, n_per_rank, dtype));
}

void Communicator::broadcast(void* buf, size_t n, DType dtype, int root) {
  run(broadcast_op(*s_, buf, n, dtype, root));
}

namespace {

Op send_op(const CommState& s, const void* buf, size_t n, DType dtype, int dst, int tag) {
  check_buffer(s, buf, n, "send");
  check_rank(s, dst, "send destination");
  return {.kind = OpKind::Send,
          .in = buf,
          .n = n,
          .dtype = dtype,
          .wire = dtype,
          .peer = dst,
          .tag = tag};
}

Op recv_op(const CommState& s, void* buf, size_t n, DType dtype, int src, int tag) {
  check_buffer(s, buf, n, "recv");
  check_rank(s, src, "recv source");
  return {.kind = OpKind::Recv,
          .out = buf,
          .n = n,
          .dtype = dtype,
          .wire = dtype,
          .peer = src,
          .tag = tag};
}

}  // namespace

void Communicator::send(const void* buf, size_t n, DType dtype, int dst, int tag) {
  run(send_op(*s_, buf, n, dtype, dst, tag));
}

void Communicator::recv(void* buf, size_t n, DType dtype, int src, int tag) {
  run(recv_op(*s_, buf, n, dtype, src, tag));
}

void Communicator::all_to_all(const void* in, void* out, size_t n_per_rank, DType dtype) {
  check_buffer(*s_, in, n_per_rank, "all_to_all");
  check_buffer(*s_, out, n_per_rank, "all_to_all");
  check_per_rank(*s_, n_per_rank, "all_to_all");
  const size_t whole = n_per_rank * size_t(s_->size) * dtype_size(dtype);
  STRATA_CHECK(!overlaps(in, whole, out, whole), "all_to_all on group ", s_->name,
               ": the output overlaps the input");
  run({.kind = OpKind::AllToAll,
       .in = in,
       .out = out,
       .n = n_per_rank,
       .dtype = dtype,
       .wire = dtype});
}

namespace {

Op all_to_all_v_op(const CommState& s, const void* in, void* out, const size_t* counts,
                   DType dtype) {
  const auto [send, receive] = v_totals(s, {.counts = counts});
  check_buffer(s, in, send, "all_to_all_v");
  check_buffer(s, out, receive, "all_to_all_v");
  STRATA_CHECK(!overlaps(in, send * dtype_size(dtype), out, receive * dtype_size(dtype)),
               "all_to_all_v on group ", s.name, ": the output overlaps the input");
  return {.kind = OpKind::AllToAllV,
          .in = in,
          .out = out,
          .dtype = dtype,
          .wire = dtype,
          .counts = counts};
}

}  // namespace

void Communicator::all_to_all_v(const void* in, void* out, const size_t* counts, DType dtype) {
  run(all_to_all_v_op(*s_, in, out, counts, dtype));
}

Handle Communicator::all_to_all_v_async(const void* in, void* out, const size_t* counts,
                                        DType dtype, const ops::Event& after) {
  return enqueue(all_to_all_v_op(*s_, in, out, counts, dtype), after);
}

namespace {

Op send_recv_op(const CommState& s, const void* in, int dst, void* out, int src, size_t n,
                DType dtype, int tag) {
  check_buffer(s, in, n, "send_recv");
  check_buffer(s, out, n, "send_recv");
  check_rank(s, dst, "send_recv destination");
  check_rank(s, src, "send_recv source");
  const size_t b = n * dtype_size(dtype);
  STRATA_CHECK(!overlaps(in, b, out, b), "send_recv on group ", s.name,
               ": the output overlaps the input");
  return {.kind = OpKind::SendRecv,
          .in = in,
          .out = out,
          .n = n,
          .dtype = dtype,
          .wire = dtype,
          .peer = dst,
          .src = src,
          .tag = tag};
}

}  // namespace

void Communicator::send_recv(const void* in, int dst, void* out, int src, size_t n, DType dtype,
                             int tag) {
  run(send_recv_op(*s_, in, dst, out, src, n, dtype, tag));
}

Handle Communicator::send_recv_async(const void* in, int dst, void* out, int src, size_t n,
                                     DType dtype, int tag, const ops::Event& after) {
  return enqueue(send_recv_op(*s_, in, dst, out, src, n, dtype, tag), after);
}

void Communicator::barrier() {
  run({.kind = OpKind::Barrier});
}

Handle Communicator::send_async(const void* buf, size_t n, DType dtype, int dst, int tag,
                                const ops::Event& after) {
  return enqueue(send_op(*s_, buf, n, dtype, dst, tag), after);
}

Handle Communicator::recv_async(void* buf, size_t n, DType dtype, int src, int tag,
                                const ops::Event& after) {
  return enqueue(recv_op(*s_, buf, n, dtype, src, tag), after);
}

Handle Communicator::barrier_async() {
  return enqueue({.kind = OpKind::Barrier}, {});
}

void Communicator::synchronize() {
  s_->stream->synchronize();
}

}  // namespace strata::comm
