// A kernels::Context that sets the OpenMP thread count holds it for its own
// lifetime only. The trainer once ran at half its benchmark's rate because
// a one-thread probe context (the bf16-widening check of the memory plan)
// left every later kernel of the run on one thread.
#include <gtest/gtest.h>
#include <omp.h>

#include "moetron/core/threading.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/matmul.h"

namespace moetron::kernels {
namespace {

// The threads a parallel region gets now.
int team_size() {
  int team = 0;
#pragma omp parallel
#pragma omp single
  team = omp_get_num_threads();
  return team;
}

TEST(ContextThreads, AShortLivedContextPutsBackTheThreadCountItFound) {
  const Context run(Backend::cpu, 2);
  ASSERT_EQ(num_compute_threads(), 2);
  {
    const Context probe(Backend::cpu, 1);
    EXPECT_EQ(num_compute_threads(), 1);
    EXPECT_EQ(team_size(), 1);
  }
  EXPECT_EQ(num_compute_threads(), 2);
  {
    const Context same(Backend::cpu, 2);
    const Context untouched(Backend::reference);
    EXPECT_EQ(num_compute_threads(), 2);
  }
  EXPECT_EQ(num_compute_threads(), 2);
}

TEST(ContextThreads, TheBf16WideningProbeLeavesTheThreadCountAlone) {
  const Context run(Backend::cpu, 2);
  (void)cpu_widens_bf16_matmul();
  EXPECT_EQ(num_compute_threads(), 2);
  EXPECT_EQ(team_size(), 2);
}

}  // namespace
}  // namespace moetron::kernels
