// The NCCL backend (GPUs): every Communicator operation on NCCL, one CUDA
// stream per communicator. Built only where the CUDA toolkit and NCCL are
// found (CMake MOETRON_NCCL, which defines MOETRON_HAVE_NCCL); compiled and
// linked in CI, exercised only on a machine with a GPU per rank.
//
// Memory: moetron's tensors live in host memory today. A host tensor is
// staged through device buffers the communicator owns (cudaMemcpyAsync on its
// stream, in and out around the NCCL call); a tensor whose device is
// Device::cuda is passed to NCCL directly. Staging buffers grow to the
// largest message and are reused: operations on one stream run in order, so
// a later one cannot overwrite a buffer an earlier one still reads.
//
// Work: a CUDA event recorded after the operation (and its copy back);
// test() is cudaEventQuery, wait() cudaEventSynchronize. A host tensor must
// stay alive, and unread, until then. poll() is a no-op: NCCL progresses on
// the GPU. bf16 is reduced by NCCL natively (ncclBfloat16), avg is ncclAvg.
// Errors carry ncclGetErrorString / cudaGetErrorString and the rank.
#pragma once

#include <memory>

#include "moetron/comm/communicator.h"

namespace moetron::comm {

// A communicator over the same ranks as `bootstrap` (any backend: rank 0
// creates the ncclUniqueId and broadcasts it over it), each rank on CUDA
// device `device`; -1 picks the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, MPI_LOCALRANKID; else bootstrap.rank()) modulo the device
// count. Collective over `bootstrap`. Throws when there is no CUDA device.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device = -1);

// Number of CUDA devices this process sees (0 when the driver reports none
// or is missing); `why` gets cudaGetErrorString when the query fails.
int cuda_device_count(std::string* why = nullptr);

}  // namespace moetron::comm
