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

// What the process launcher said about this process, read from the
// environment before MPI is initialised: OpenMPI's mpirun (OMPI_COMM_WORLD_*),
// PMI starters such as MPICH's hydra or `srun --mpi=pmi2` (PMI_RANK/PMI_SIZE),
// a Slurm job step (`srun -n N moetron ...`: SLURM_PROCID, and
// SLURM_STEP_NUM_TASKS or SLURM_NTASKS; SLURM_LOCALID and
// SLURM_STEP_TASKS_PER_NODE for the ranks on this node), PMIx (PMIX_RANK;
// no size: 0 means unknown).
struct LaunchEnv {
  bool under_mpi = false;
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this machine
  int local_size = 1;  // ranks on this machine (1 when the launcher does not say)
};
LaunchEnv detect_launch_env();

// Ends every rank of the job when MPI is running with more than one rank
// (flushes stdio, waits 0.3 s so mpirun can forward the error just printed,
// then MPI_Abort on MPI_COMM_WORLD with `code`; does not return). Otherwise
// returns, and the caller exits as a single process would. Only main()
// calls it, after printing the error.
void abort_world(int code);

}  // namespace moetron::comm
