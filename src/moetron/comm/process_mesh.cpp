#include "moetron/comm/process_mesh.h"

#include <algorithm>
#include <sstream>

namespace moetron::comm {

namespace {
constexpr std::array<const char*, kNumAxes> kNames = {"pp", "dp", "ep", "tp", "cp"};
size_t idx(Axis a) {
  return static_cast<size_t>(a);
}
}  // namespace

std::string axis_name(Axis a) {
  return kNames[idx(a)];
}

Axis parse_axis(const std::string& name) {
  for (int i = 0; i < kNumAxes; ++i) {
    if (name == kNames[static_cast<size_t>(i)]) return static_cast<Axis>(i);
  }
  MOETRON_FAIL("unknown mesh axis '", name, "' (expected pp, dp, ep, tp or cp)");
}

int MeshShape::world_size() const {
  int n = 1;
  for (int d : degree) n *= d;
  return n;
}

void MeshShape::set_order(const std::string& csv) {
  std::array<Axis, kNumAxes> parsed{};
  std::array<bool, kNumAxes> seen{};
  std::stringstream ss(csv);
  std::string item;
  int n = 0;
  while (std::getline(ss, item, ',')) {
    MOETRON_CHECK(n < kNumAxes, "mesh order '", csv, "' lists more than ", kNumAxes, " axes");
    const Axis a = parse_axis(item);
    MOETRON_CHECK(!seen[idx(a)], "mesh order '", csv, "' lists axis ", item, " twice");
    seen[idx(a)] = true;
    parsed[static_cast<size_t>(n++)] = a;
  }
  MOETRON_CHECK(n == kNumAxes, "mesh order '", csv, "' must list all of pp, dp, ep, tp, cp");
  order = parsed;
}

std::string MeshShape::str() const {
  std::ostringstream os;
  bool first = true;
  for (int i = kNumAxes - 1; i >= 0; --i) {
    const Axis a = order[static_cast<size_t>(i)];
    if ((*this)[a] == 1) continue;
    os << (first ? "" : " x ") << axis_name(a) << (*this)[a];
    first = false;
  }
  if (first) os << "1 rank";
  os << " (order";
  for (size_t i = 0; i < order.size(); ++i) os << (i ? "," : " ") << axis_name(order[i]);
  os << ")";
  return os.str();
}

void validate_mesh(const MeshShape& s, int world_size) {
  for (int i = 0; i < kNumAxes; ++i) {
    MOETRON_CHECK(s.degree[static_cast<size_t>(i)] >= 1, "parallel degree ",
                  kNames[static_cast<size_t>(i)], " = ", s.degree[static_cast<size_t>(i)],
                  " must be >= 1");
  }
  MOETRON_CHECK(s.world_size() == world_size,
                "the parallel degrees pp x dp x ep x tp x cp = ", s[Axis::pp], " x ", s[Axis::dp],
                " x ", s[Axis::ep], " x ", s[Axis::tp], " x ", s[Axis::cp], " = ", s.world_size(),
                " must equal the number of ranks, ", world_size);
}

std::array<int, kNumAxes> mesh_coords(const MeshShape& s, int rank) {
  std::array<int, kNumAxes> c{};
  int rest = rank;
  for (Axis a : s.order) {  // innermost first
    c[idx(a)] = rest % s[a];
    rest /= s[a];
  }
  return c;
}

int mesh_rank(const MeshShape& s, const std::array<int, kNumAxes>& coords) {
  int rank = 0, stride = 1;
  for (Axis a : s.order) {
    rank += coords[idx(a)] * stride;
    stride *= s[a];
  }
  return rank;
}

std::vector<int> mesh_group(const MeshShape& s, int rank, const std::vector<Axis>& axes) {
  const std::array<int, kNumAxes> base = mesh_coords(s, rank);
  // Enumerate the coordinates along `axes`, innermost (by mesh order) fastest.
  std::vector<Axis> ordered;
  for (Axis a : s.order) {
    if (std::find(axes.begin(), axes.end(), a) != axes.end()) ordered.push_back(a);
  }
  int count = 1;
  for (Axis a : ordered) count *= s[a];
  std::vector<int> ranks;
  for (int k = 0; k < count; ++k) {
    std::array<int, kNumAxes> c = base;
    int rest = k;
    for (Axis a : ordered) {
      c[idx(a)] = rest % s[a];
      rest /= s[a];
    }
    ranks.push_back(mesh_rank(s, c));
  }
  return ranks;
}

ProcessMesh::ProcessMesh(Communicator& world, MeshShape shape) : world_(world), shape_(shape) {
  validate_mesh(shape_, world.size());
  coords_ = mesh_coords(shape_, world.rank());
  for (int i = 0; i < kNumAxes; ++i)
    axis_comm_[static_cast<size_t>(i)] = make_group({static_cast<Axis>(i)});
}

std::unique_ptr<Communicator> ProcessMesh::make_group(const std::vector<Axis>& axes) {
  // color: the smallest world rank of the group (identifies it); key: the
  // position inside it, so the sub-communicator's rank is the group index.
  const std::vector<int> members = mesh_group(shape_, world_.rank(), axes);
  const int color = *std::min_element(members.begin(), members.end());
  const int key =
      static_cast<int>(std::find(members.begin(), members.end(), world_.rank()) - members.begin());
  return world_.split(color, key);
}

Communicator& ProcessMesh::group(const std::vector<Axis>& axes) {
  for (auto& [key, comm] : groups_) {
    if (key == axes) return *comm;
  }
  groups_.emplace_back(axes, make_group(axes));
  return *groups_.back().second;
}

}  // namespace moetron::comm
