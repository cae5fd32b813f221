#include "moetron/comm/process_mesh.h"

#include <gtest/gtest.h>

namespace moetron::comm {
namespace {

MeshShape shape_of(int pp, int dp, int ep, int tp, int cp) {
  MeshShape s;
  s[Axis::pp] = pp;
  s[Axis::dp] = dp;
  s[Axis::ep] = ep;
  s[Axis::tp] = tp;
  s[Axis::cp] = cp;
  return s;
}

TEST(ProcessMesh, DefaultOrderKeepsTensorParallelInnermost) {
  const MeshShape s = shape_of(2, 2, 1, 2, 1);  // 8 ranks
  EXPECT_EQ(s.world_size(), 8);
  // tp varies fastest, then dp, then pp.
  EXPECT_EQ(mesh_group(s, 0, {Axis::tp}), (std::vector<int>{0, 1}));
  EXPECT_EQ(mesh_group(s, 5, {Axis::tp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh_group(s, 1, {Axis::dp}), (std::vector<int>{1, 3}));
  EXPECT_EQ(mesh_group(s, 2, {Axis::pp}), (std::vector<int>{2, 6}));
  EXPECT_EQ(mesh_group(s, 6, {Axis::dp, Axis::tp}), (std::vector<int>{4, 5, 6, 7}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh_rank(s, mesh_coords(s, r)), r);
  const auto c = mesh_coords(s, 7);
  EXPECT_EQ(c[static_cast<size_t>(Axis::pp)], 1);
  EXPECT_EQ(c[static_cast<size_t>(Axis::dp)], 1);
  EXPECT_EQ(c[static_cast<size_t>(Axis::tp)], 1);
  EXPECT_EQ(s.str(), "pp2 x dp2 x tp2 (order tp,cp,ep,dp,pp)");
}

TEST(ProcessMesh, OrderIsConfigurable) {
  MeshShape s = shape_of(1, 2, 1, 2, 1);
  s.set_order("dp,tp,cp,ep,pp");
  EXPECT_EQ(mesh_group(s, 0, {Axis::dp}), (std::vector<int>{0, 1}));
  EXPECT_EQ(mesh_group(s, 0, {Axis::tp}), (std::vector<int>{0, 2}));
  EXPECT_THROW(s.set_order("dp,tp,cp,ep"), Error);
  EXPECT_THROW(s.set_order("dp,dp,cp,ep,pp"), Error);
  EXPECT_THROW(s.set_order("dp,tp,cp,ep,xx"), Error);
}

TEST(ProcessMesh, ValidationNamesTheRule) {
  try {
    validate_mesh(shape_of(2, 1, 1, 2, 1), 8);
    FAIL() << "accepted 4 != 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must equal the number of ranks, 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(validate_mesh(shape_of(0, 1, 1, 1, 1), 0), Error);
  EXPECT_NO_THROW(validate_mesh(shape_of(1, 4, 2, 1, 1), 8));
}

TEST(ProcessMesh, OneRankMeshOnTheLocalCommunicator) {
  auto local = make_local_communicator();
  ProcessMesh mesh(*local, MeshShape{});
  EXPECT_EQ(mesh.axis(Axis::dp).size(), 1);
  EXPECT_EQ(mesh.group({Axis::dp, Axis::ep}).size(), 1);
}

}  // namespace
}  // namespace moetron::comm
