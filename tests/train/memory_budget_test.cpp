// train.memory_budget = "auto" is a rank's share of its machine: the ranks a
// launcher started on one machine share its memory.
#include <gtest/gtest.h>

#include <cstdlib>

#include "moetron/planner/memory_model.h"
#include "moetron/train/memory_report.h"

namespace moetron::train {
namespace {

TEST(MemoryBudget, AutoIsThisRanksShareOfTheMachine) {
  Config cfg;
  const double whole = static_cast<double>(planner::available_memory_bytes());
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  const double share = static_cast<double>(memory_budget_bytes(cfg));
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    ::unsetenv(v);
  // Available memory moves a little between the two reads.
  EXPECT_NEAR(share, whole / 4, 0.05 * whole / 4);
  EXPECT_NEAR(static_cast<double>(memory_budget_bytes(cfg)), whole, 0.05 * whole);
  cfg.train.memory_budget = "1GiB";
  EXPECT_EQ(memory_budget_bytes(cfg), int64_t{1} << 30);
}

}  // namespace
}  // namespace moetron::train
