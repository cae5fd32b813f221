// The world communicator of a multi-process test (tests/**/*_mpitest.cpp),
// set up by mpi_test_main.cpp's main(): every rank runs every test, only
// rank 0 prints gtest's report (the others print their own failures, named
// by rank), and the exit code is non-zero on every rank when any rank failed.
#pragma once

#include <memory>

#include "moetron/comm/communicator.h"

namespace moetron::test {
comm::Communicator& mpi_world();
// A duplicate of the MPI world for one Trainer to own (a Trainer takes
// shared ownership of its world; the test's world outlives every test).
std::shared_ptr<comm::Communicator> shared_world();
}  // namespace moetron::test
