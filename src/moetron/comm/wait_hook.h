// A function a blocking wait calls while it polls for its operations to
// finish: `moetron launch` tells a hung rank from ranks that wait for it by
// their heartbeats (train/heartbeat.h), so a rank blocked in a collective
// must keep beating, from the thread that waits (a background thread would
// beat for a deadlocked main thread too). comm/ knows nothing of heartbeats:
// the training command installs the hook.
//
// Process-wide on purpose: a heartbeat belongs to the process, and every
// communicator (the many split from the world by ProcessMesh, and those
// built later) must call it; a per-object hook could miss one.
//
// The MPI backend calls it between MPI_Testall polls in wait() and barrier()
// (MPI_Waitall / MPI_Barrier when none is installed). NCCL's wait blocks on
// the CUDA stream and does not call it.
#pragma once

namespace moetron::comm {

// Must be cheap (it is called between polls, thousands of times a second:
// throttle inside) and must not throw or call MPI.
using WaitHook = void (*)() noexcept;

// nullptr removes it.
void set_wait_hook(WaitHook hook) noexcept;
WaitHook wait_hook() noexcept;

}  // namespace moetron::comm
