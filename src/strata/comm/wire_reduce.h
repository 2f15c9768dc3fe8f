// Sums in the wire dtype. MPI has no bf16 or fp16, so each is an MPI type of its own (one
// uint16, committed) with a user-defined sum op that adds in fp32 and rounds to nearest even:
// the same arithmetic a GPU's NCCL does for half types.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "strata/core/dtype.h"

namespace strata::comm::detail {

// inout[i] = round(inout[i] + in[i]) in dtype t, for n elements.
void sum_into(void* inout, const void* in, size_t n, DType t);

// Creates the bf16/fp16 types and ops once per process (comm::init calls it); freed by
// free_wire_ops (comm::finalize).
void create_wire_ops();
void free_wire_ops();

// The MPI datatype and sum op for dtype t; create_wire_ops must have run.
MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_sum(DType t);

}  // namespace strata::comm::detail
