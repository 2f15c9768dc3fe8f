#include "strata/comm/cuda/nccl_transport.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/core/tensor.h"
#include "strata/kernels/cuda/runtime.h"
#include "strata/kernels/ops.h"

namespace strata::comm::nccl {

using detail::Op;
using detail::OpKind;

#define STRATA_NCCL_CHECK(call)                                                          \
  do {                                                                                   \
    const ncclResult_t strata_nccl_r_ = (call);                                          \
    if (strata_nccl_r_ != ncclSuccess) {                                                 \
      STRATA_FAIL("NCCL error ", ncclGetErrorString(strata_nccl_r_), " in " #call, ": ", \
                  ncclGetLastError(nullptr));                                            \
    }                                                                                    \
  } while (0)

class Transport {
 public:
  ncclComm_t comm = nullptr;
  Buffer scratch;  // wire-format copies on the device, grown once and reused

  ~Transport() {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
};

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
  }
  STRATA_FAIL("no NCCL type for ", dtype_name(t));
}

// Which GPU this rank uses, as (host, PCI bus id): two ranks with the same pair share a device.
std::string device_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char bus[64] = {};
  STRATA_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, ops::cuda::current_device()));
  return std::string(host) + "/" + bus;
}

void destroy(Transport* t) {
  delete t;
}

char* scratch(Transport& t, size_t bytes) {
  if (t.scratch.bytes() < bytes) t.scratch = Buffer(MemCategory::CommBuffers, bytes, Device::CUDA);
  return t.scratch.as<char>();
}

// dst (n of dt) = src (n of st) on the device, on the communication stream (the caller's
// OnStream scope).
void to_wire_device(void* dst, DType dt, const void* src, DType st, size_t n) {
  ops::copy(Tensor(dst, dt, {int64_t(n)}, Device::CUDA),
            Tensor(const_cast<void*>(src), st, {int64_t(n)}, Device::CUDA));
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

std::unique_ptr<Transport, void (*)(Transport*)> open(MPI_Comm comm, int rank, int size,
                                                      const std::string& name, std::string* why) {
  std::unique_ptr<Transport, void (*)(Transport*)> none(nullptr, destroy);
  if (default_device() != Device::CUDA) {
    *why = "the process computes on the CPU";
    return none;
  }
  const char* env = std::getenv("STRATA_NCCL");
  const bool wanted = env == nullptr || std::strcmp(env, "0") != 0;
  // Every rank learns every rank's GPU, so that all decide the same.
  const std::string mine = device_identity();
  char id[128] = {};
  std::snprintf(id, sizeof id, "%s", mine.c_str());
  std::vector<char> all(size_t(size) * sizeof id);
  STRATA_MPI_CHECK(MPI_Allgather(id, sizeof id, MPI_CHAR, all.data(), sizeof id, MPI_CHAR, comm));
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.emplace_back(all.data() + size_t(r) * sizeof id);
  std::sort(ids.begin(), ids.end());
  const bool shared = std::adjacent_find(ids.begin(), ids.end()) != ids.end();
  int use = wanted && !shared ? 1 : 0;
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &use, 1, MPI_INT, MPI_MIN, comm));
  if (use == 0) {
    *why = shared ? "ranks of group " + name + " share a GPU, which NCCL refuses"
                  : std::string("STRATA_NCCL=0");
    return none;
  }
  ncclUniqueId uid{};
  if (rank == 0) STRATA_NCCL_CHECK(ncclGetUniqueId(&uid));
  STRATA_MPI_CHECK(MPI_Bcast(&uid, sizeof uid, MPI_BYTE, 0, comm));
  auto t = std::unique_ptr<Transport, void (*)(Transport*)>(new Transport, destroy);
  STRATA_NCCL_CHECK(ncclCommInitRank(&t->comm, size, uid, rank));
  return t;
}

void run(Transport& t, const Op& op, int rank, int size) {
  const ops::OnStream on_comm({Device::CUDA, ops::StreamKind::Comm});
  const cudaStream_t s = ops::cuda::comm_stream();
  const size_t ds = dtype_size(op.dtype), ws = dtype_size(op.wire);
  switch (op.kind) {
    case OpKind::AllReduce: {
      if (op.wire == op.dtype) {
        STRATA_NCCL_CHECK(
            ncclAllReduce(op.out, op.out, op.n, nccl_type(op.dtype), ncclSum, t.comm, s));
        break;
      }
      char* w = scratch(t, op.n * ws);
      to_wire_device(w, op.wire, op.out, op.dtype, op.n);
      STRATA_NCCL_CHECK(ncclAllReduce(w, w, op.n, nccl_type(op.wire), ncclSum, t.comm, s));
      to_wire_device(op.out, op.dtype, w, op.wire, op.n);
      break;
    }
    case OpKind::ReduceScatter: {
      const size_t total = op.n * size_t(size);
      const bool convert_in = op.wire != op.dtype;
      // NCCL runs in place only with the output at this rank's block of the input.
      const char* own = static_cast<const char*>(op.in) + size_t(rank) * op.n * ds;
      const bool via_scratch =
          convert_in || (op.out != own && overlaps(op.in, total * ds, op.out, op.n * ds));
      const size_t in_bytes = convert_in ? (total * ws + 255) / 256 * 256 : 0;
      char* w = scratch(t, in_bytes + (via_scratch ? op.n * ws : 0));
      const void* send = op.in;
      if (convert_in) to_wire_device(w, op.wire, op.in, op.dtype, total), send = w;
      void* result = via_scratch ? w + in_bytes : op.out;
      STRATA_NCCL_CHECK(
          ncclReduceScatter(send, result, op.n, nccl_type(op.wire), ncclSum, t.comm, s));
      if (via_scratch) to_wire_device(op.out, op.dtype, result, op.wire, op.n);
      break;
    }
    case OpKind::AllGather:
      STRATA_NCCL_CHECK(ncclAllGather(op.in, op.out, op.n, nccl_type(op.dtype), t.comm, s));
      break;
    case OpKind::Broadcast:
      STRATA_NCCL_CHECK(
          ncclBroadcast(op.out, op.out, op.n, nccl_type(op.dtype), op.peer, t.comm, s));
      break;
    case OpKind::Send:
      STRATA_NCCL_CHECK(ncclSend(op.in, op.n, nccl_type(op.dtype), op.peer, t.comm, s));
      break;
    case OpKind::Recv:
      STRATA_NCCL_CHECK(ncclRecv(op.out, op.n, nccl_type(op.dtype), op.peer, t.comm, s));
      break;
    case OpKind::AllToAll: {
      const size_t block = op.n * ds;
      STRATA_NCCL_CHECK(ncclGroupStart());
      for (int j = 0; j < size; ++j) {
        STRATA_NCCL_CHECK(ncclSend(static_cast<const char*>(op.in) + size_t(j) * block, op.n,
                                   nccl_type(op.dtype), j, t.comm, s));
        STRATA_NCCL_CHECK(ncclRecv(static_cast<char*>(op.out) + size_t(j) * block, op.n,
                                   nccl_type(op.dtype), j, t.comm, s));
      }
      STRATA_NCCL_CHECK(ncclGroupEnd());
      break;
    }
    case OpKind::AllToAllV: {
      const char* in = static_cast<const char*>(op.in);
      char* out = static_cast<char*>(op.out);
      STRATA_NCCL_CHECK(ncclGroupStart());
      for (int j = 0; j < size; ++j) {
        const size_t send = op.counts[j], receive = op.counts[size + j];
        if (send > 0) STRATA_NCCL_CHECK(ncclSend(in, send, nccl_type(op.dtype), j, t.comm, s));
        if (receive > 0) {
          STRATA_NCCL_CHECK(ncclRecv(out, receive, nccl_type(op.dtype), j, t.comm, s));
        }
        in += send * ds, out += receive * ds;
      }
      STRATA_NCCL_CHECK(ncclGroupEnd());
      break;
    }
    case OpKind::SendRecv:
      STRATA_NCCL_CHECK(ncclGroupStart());
      STRATA_NCCL_CHECK(ncclSend(op.in, op.n, nccl_type(op.dtype), op.peer, t.comm, s));
      STRATA_NCCL_CHECK(ncclRecv(op.out, op.n, nccl_type(op.dtype), op.src, t.comm, s));
      STRATA_NCCL_CHECK(ncclGroupEnd());
      break;
    case OpKind::Barrier:
      break;  // no buffers: the communicator runs it over MPI
  }
  // Complete when it returns: the operation's Handle (and its event) then covers the data.
  STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace strata::comm::nccl
