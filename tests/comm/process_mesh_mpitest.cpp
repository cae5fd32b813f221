// Under mpirun at 2 and 4 ranks: the mesh's sub-communicators hold exactly
// the ranks mesh_group() names, in that order.
#include <gtest/gtest.h>

#include "util/mpi_test_main.h"

#include "moetron/comm/mpi_communicator.h"
#include "moetron/comm/process_mesh.h"

namespace moetron::comm {
namespace {

TEST(ProcessMeshMpi, AxisCommunicatorsHoldTheirGroups) {
  Communicator& w = test::mpi_world();
  MeshShape s;
  s[Axis::tp] = 2;
  s[Axis::dp] = w.size() / 2;
  ProcessMesh mesh(w, s);
  for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
    const std::vector<int> members = mesh_group(s, w.rank(), {a});
    Communicator& c = mesh.axis(a);
    ASSERT_EQ(c.size(), static_cast<int>(members.size())) << axis_name(a);
    EXPECT_EQ(members[static_cast<size_t>(c.rank())], w.rank()) << axis_name(a);
    // Gather world ranks over the axis: they must be the group, in order.
    Tensor me = Tensor::empty({1}, DType::i32), all = Tensor::empty({c.size()}, DType::i32);
    me.data<int32_t>()[0] = w.rank();
    c.allgather(me, all);
    for (int i = 0; i < c.size(); ++i)
      EXPECT_EQ(all.data<int32_t>()[i], members[static_cast<size_t>(i)]);
  }
  Communicator& both = mesh.group({Axis::dp, Axis::tp});
  EXPECT_EQ(both.size(), w.size());
  EXPECT_EQ(&both, &mesh.group({Axis::dp, Axis::tp}));  // created once
}

}  // namespace
}  // namespace moetron::comm
