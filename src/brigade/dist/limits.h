// Message-size limits of the dist module, exposed so tests can shrink them and
// exercise the multi-message paths with small buffers. Not for production code.
//
//   piece        most elements (of the MPI datatype used: float, double or byte) in
//                one MPI call. Point-to-point transfers, ring/tree steps, allreduce
//                and broadcast over the library loop in pieces of at most this many.
//                Default 1 << 30 (below INT_MAX, MPI's count type).
//   library_max  most elements a single count or displacement may have in the
//                int-counted vector collectives (MPI_Reduce_scatter, MPI_Allgatherv).
//                Above it, allgather falls back to the ring allgather and
//                reduce_scatter with AllreduceAlgo::Mpi throws. Default INT_MAX.
#pragma once
#include <cstdint>

namespace brigade::dist::detail {

struct MessageLimits {
  int64_t piece;
  int64_t library_max;
};

MessageLimits message_limits();
// Both values must be >= 1. Not thread-safe; set it before any communication.
void set_message_limits(MessageLimits limits);

}  // namespace brigade::dist::detail
