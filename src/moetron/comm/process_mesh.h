// The process mesh: world ranks laid out on the axes pp, dp, ep, tp, cp.
// The order lists axes from innermost (fastest-varying rank bits) to
// outermost; the default "tp,cp,ep,dp,pp" keeps tensor parallelism inside a
// node and pipeline stages across nodes (the intra-node-first rule). Each
// axis gets a sub-communicator: the ranks that agree on every other axis.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "moetron/comm/communicator.h"

namespace moetron::comm {

enum class Axis { pp = 0, dp, ep, tp, cp };
inline constexpr int kNumAxes = 5;
std::string axis_name(Axis a);
Axis parse_axis(const std::string& name);

struct MeshShape {
  std::array<int, kNumAxes> degree{1, 1, 1, 1, 1};  // indexed by Axis
  std::array<Axis, kNumAxes> order{Axis::tp, Axis::cp, Axis::ep, Axis::dp,
                                   Axis::pp};  // innermost first

  int& operator[](Axis a) { return degree[static_cast<size_t>(a)]; }
  int operator[](Axis a) const { return degree[static_cast<size_t>(a)]; }
  int world_size() const;
  // Parses "tp,cp,ep,dp,pp" (every axis once); throws naming the bad entry.
  void set_order(const std::string& csv);
  std::string str() const;  // "pp2 x dp2 x tp2 (order tp,cp,ep,dp,pp)"
};

// Throws moetron::Error naming the rule broken (a degree < 1; the product of
// the degrees must equal the world size, else the message shows both).
void validate_mesh(const MeshShape& shape, int world_size);

// Coordinates of `rank` on every axis, and back.
std::array<int, kNumAxes> mesh_coords(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const std::array<int, kNumAxes>& coords);
// World ranks of the group containing `rank` that varies along `axes` (all
// other coordinates fixed), ordered by their coordinates along `axes`.
std::vector<int> mesh_group(const MeshShape& shape, int rank, const std::vector<Axis>& axes);

class ProcessMesh {
 public:
  // Collective over `world`: every rank must call it with the same shape.
  ProcessMesh(Communicator& world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  int coord(Axis a) const { return coords_[static_cast<size_t>(a)]; }
  int degree(Axis a) const { return shape_[a]; }
  Communicator& world() { return world_; }
  Communicator& axis(Axis a) { return *axis_comm_[static_cast<size_t>(a)]; }
  // A communicator over several axes at once (e.g. {dp, ep} for the
  // expert-data-parallel group), created on first use. Collective: all ranks
  // must ask for the same groups in the same order.
  Communicator& group(const std::vector<Axis>& axes);
  // A new communicator over the same ranks as group(axes), kept by the
  // caller: for traffic that must be counted apart (e.g. gradients from
  // routing statistics). Collective like group().
  std::unique_ptr<Communicator> make_group(const std::vector<Axis>& axes);

 private:
  Communicator& world_;
  MeshShape shape_;
  std::array<int, kNumAxes> coords_{};
  std::array<std::unique_ptr<Communicator>, kNumAxes> axis_comm_;
  std::vector<std::pair<std::vector<Axis>, std::unique_ptr<Communicator>>> groups_;
};

}  // namespace moetron::comm
