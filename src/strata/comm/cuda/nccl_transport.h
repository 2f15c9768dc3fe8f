// The NCCL transport of a Communicator whose process computes on a GPU (built with the CUDA
// backend): the group's collectives on a GPU's buffers run as NCCL calls on the device's
// communication stream, with the NCCL communicator made from an id that rank 0 draws and
// broadcasts over MPI (MPI stays the launcher and the control plane). Where NCCL cannot serve
// the group (two of its ranks on one GPU, which NCCL refuses; STRATA_NCCL=0 in the environment),
// open() returns null and the group's GPU buffers go through host memory to MPI instead
// (communicator.cc, execute_staged). Host buffers always take MPI.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "strata/comm/comm_stream.h"

namespace strata::comm::nccl {

class Transport;

// Collective over comm (every rank calls it, with the same answer on every rank): a transport
// for the group, or null where NCCL cannot serve it. `why` receives the reason for a null.
std::unique_ptr<Transport, void (*)(Transport*)> open(MPI_Comm comm, int rank, int size,
                                                      const std::string& name, std::string* why);

// Runs op (its buffers on the GPU) on the communication stream and returns when it is complete.
// wire conversions run there too, in `scratch` device memory the transport owns.
void run(Transport& t, const detail::Op& op, int rank, int size);

}  // namespace strata::comm::nccl
