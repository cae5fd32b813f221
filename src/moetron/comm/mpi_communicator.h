// The MPI backend (Debian's OpenMPI). MPI is initialised on first use with
// MPI_THREAD_FUNNELED (only the thread that started an operation calls MPI)
// and finalised at process exit. Non-blocking operations map to MPI's
// MPI_I* calls; bf16 reductions are staged in fp32 and rounded once.
// OpenMPI advances a non-blocking collective only inside MPI calls, so each
// communicator keeps its operations in flight and poll() tests them: compute
// loops call it between kernels (measured against a progress thread in
// bench/RESULTS.md, "Progress of non-blocking collectives").
#pragma once

#include <memory>

#include "moetron/comm/communicator.h"

namespace moetron::comm {

// MPI_COMM_WORLD (duplicated). Under `mpirun -np N` every process gets its rank;
// started alone it is a world of one.
std::unique_ptr<Communicator> make_mpi_world();

}  // namespace moetron::comm
