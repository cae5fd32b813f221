// Rank detection from what the process launcher set (mpirun, srun, PMI),
// read before MPI starts: a simulated Slurm job step (`srun -n 8`).
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "moetron/comm/mpi_communicator.h"

namespace moetron::comm {
namespace {

// Sets variables for one test and restores the environment after it.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* v : kAll) {
      const char* old = std::getenv(v);
      saved_.emplace_back(v, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(v);
    }
    for (const auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }

 private:
  static constexpr const char* kAll[] = {"OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "PMI_RANK",
                                         "PMI_SIZE",
                                         "MPI_LOCALRANKID",
                                         "MPI_LOCALNRANKS",
                                         "SLURM_PROCID",
                                         "SLURM_STEP_NUM_TASKS",
                                         "SLURM_NTASKS",
                                         "SLURM_LOCALID",
                                         "SLURM_STEP_TASKS_PER_NODE",
                                         "PMIX_RANK"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(LaunchEnv, AloneIsOneRank) {
  ScopedEnv env({});
  const LaunchEnv e = detect_launch_env();
  EXPECT_FALSE(e.under_mpi);
  EXPECT_EQ(e.size, 1);
  EXPECT_EQ(e.local_size, 1);
}

TEST(LaunchEnv, SrunTasksAreRanks) {
  // `srun -N 2 -n 8 moetron train ...`: task 5 is the second task on its node.
  ScopedEnv env({{"SLURM_PROCID", "5"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_LOCALID", "1"},
                 {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}});
  const LaunchEnv e = detect_launch_env();
  EXPECT_TRUE(e.under_mpi);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 4);
}

TEST(LaunchEnv, AJobStepsTaskCountWinsOverTheAllocations) {
  ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_STEP_NUM_TASKS", "4"}});
  const LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_size, 1);  // not said: one
}

TEST(LaunchEnv, MpirunsVariablesComeFirst) {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "2"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "1"}});
  const LaunchEnv e = detect_launch_env();
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 4);
  EXPECT_EQ(e.local_size, 4);
}

TEST(LaunchEnv, ASlurmBatchScriptWithoutATaskCountIsNotAJob) {
  ScopedEnv env({{"SLURM_PROCID", "0"}});
  EXPECT_FALSE(detect_launch_env().under_mpi);
}

}  // namespace
}  // namespace moetron::comm
