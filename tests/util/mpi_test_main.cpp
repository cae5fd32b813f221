#include "util/mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "moetron/comm/mpi_communicator.h"

namespace moetron::test {
namespace {
std::unique_ptr<comm::Communicator>& world_slot() {
  static std::unique_ptr<comm::Communicator> w;
  return w;
}
}  // namespace

comm::Communicator& mpi_world() { return *world_slot(); }

}  // namespace moetron::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& world = moetron::test::world_slot();
  world = moetron::comm::make_mpi_world();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  moetron::Tensor flag = moetron::Tensor::empty({1}, moetron::DType::i32);
  flag.data<int32_t>()[0] = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->allreduce(flag, moetron::comm::ReduceOp::max);
  const int failed = flag.data<int32_t>()[0];
  if (world->rank() == 0 && failed) std::fprintf(stderr, "at least one rank failed\n");
  world.reset();
  return failed;
}
