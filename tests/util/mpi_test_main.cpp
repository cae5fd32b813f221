#include "util/mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "moetron/comm/mpi_communicator.h"

namespace moetron::test {
namespace {
std::unique_ptr<comm::Communicator>& world_slot() {
  static std::unique_ptr<comm::Communicator> w;
  return w;
}
// The other ranks' failures, named by rank (their full printer would
// repeat rank 0's progress lines n times).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (gtest holds its lock while reporting a result: the name is kept here.)
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s: %s:%d: %s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

comm::Communicator& mpi_world() {
  return *world_slot();
}

std::shared_ptr<comm::Communicator> shared_world() {
  return mpi_world().split(0, mpi_world().rank());
}

}  // namespace moetron::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& world = moetron::test::world_slot();
  world = moetron::comm::make_mpi_world();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new moetron::test::RankFailurePrinter(world->rank()));
  }
  moetron::Tensor flag = moetron::Tensor::empty({1}, moetron::DType::i32);
  flag.data<int32_t>()[0] = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->allreduce(flag, moetron::comm::ReduceOp::max);
  const int failed = flag.data<int32_t>()[0];
  if (world->rank() == 0 && failed) std::fprintf(stderr, "at least one rank failed\n");
  world.reset();
  return failed;
}
