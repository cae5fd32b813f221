// The world communicator of a multi-process test (tests/**/*_mpitest.cpp),
// set up by mpi_test_main.cpp's main(): every rank runs every test, only
// rank 0 prints gtest's report, and the exit code is non-zero on every rank
// when any rank failed.
#pragma once

#include "moetron/comm/communicator.h"

namespace moetron::test {
comm::Communicator& mpi_world();
}
