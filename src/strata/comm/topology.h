// The rank grid: the one place that maps a rank to its (dp, cp, tp, pp) coordinates and back
// (DESIGN.md §5). The order names the axes fastest-varying first; Megatron's default "tp-dp-pp"
// means rank = tp + TP * (dp + DP * pp), so a tensor-parallel group is TP consecutive ranks and
// lands on one host. The context-parallel axis (cp, the sequence split over ranks) goes right
// after tp where the order does not name it ("tp-cp-dp-pp", Megatron's), so that a cp group is
// close too. ProcessGroups builds one Communicator per axis from it.
#pragma once

#include <mpi.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::comm {

class Communicator;

enum class Axis : int { DP = 0, TP = 1, PP = 2, CP = 3 };
const char* axis_name(Axis a);  // "dp" | "tp" | "pp" | "cp"

struct GridCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
  int at(Axis a) const { return const_cast<GridCoord*>(this)->at(a); }
  int& at(Axis a) { return a == Axis::DP ? dp : a == Axis::TP ? tp : a == Axis::PP ? pp : cp; }
  bool operator==(const GridCoord&) const = default;
};

class RankGrid {
 public:
  // dp = world / (tp * pp * cp). Throws InputError naming the sizes and a fix when they do not
  // fit, or when order is not a '-'-separated permutation of tp, dp, pp (and cp, optional).
  RankGrid(int world, int tp, int pp, std::string order = "tp-dp-pp", int cp = 1);

  int world() const { return world_; }
  int dp() const { return size_[int(Axis::DP)]; }
  int tp() const { return size_[int(Axis::TP)]; }
  int pp() const { return size_[int(Axis::PP)]; }
  int cp() const { return size_[int(Axis::CP)]; }
  int size(Axis a) const { return size_[int(a)]; }
  const std::string& order() const { return order_name_; }

  GridCoord coord(int rank) const;
  int rank_of(const GridCoord& c) const;
  // The ranks that share every coordinate of `rank` but axis's, ordered by their coordinate
  // along axis (so a rank's index in its group is its coordinate).
  std::vector<int> group_ranks(Axis axis, int rank) const;
  // Every group along axis, ordered by their lowest rank.
  std::vector<std::vector<int>> groups(Axis axis) const;

  // The grid as text: sizes and order, a table rank -> dp tp pp, and the groups of each axis.
  std::string describe() const;

 private:
  int world_;
  std::array<int, 4> size_;    // by Axis
  std::array<int, 4> stride_;  // by Axis
  std::string order_name_;
};

// An OpenMPI hostfile: "host slots=N" per line ("count=" and "cpu=" mean slots; max_slots= is
// accepted and ignored), '#' starts a comment, blank lines are skipped, a host named twice
// adds up its slots. Returns (host, slots) in file order. Errors (InputError) name file:line.
std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path);

// Places ranks on hosts in order, filling each host's slots (mpirun's default by-slot mapping),
// and throws InputError if a tensor-parallel group spans two hosts or the hosts have fewer
// slots than the grid has ranks.
void check_tp_within_hosts(const RankGrid& grid,
                           const std::vector<std::pair<std::string, int>>& hosts);

// One Communicator per axis for this rank, plus the whole world; built once, collectively over
// world (MPI_Comm_split). Group ranks equal grid coordinates along the axis.
class ProcessGroups {
 public:
  ProcessGroups(const RankGrid& grid, MPI_Comm world);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const RankGrid& grid() const { return grid_; }
  const GridCoord& coord() const { return coord_; }
  Communicator& world() { return *world_; }
  Communicator& dp() { return group(Axis::DP); }
  Communicator& tp() { return group(Axis::TP); }
  Communicator& pp() { return group(Axis::PP); }
  Communicator& cp() { return group(Axis::CP); }
  // The ranks that share tp and pp coordinates: data and context parallelism together, ordered
  // by dp then cp (rank = dp · CP + cp). Gradients are reduced and ZeRO shards over it; without
  // context parallelism it is dp().
  Communicator& dp_cp() { return dp_cp_ ? *dp_cp_ : dp(); }
  Communicator& group(Axis a) { return *groups_[int(a)]; }

 private:
  RankGrid grid_;
  GridCoord coord_;
  std::unique_ptr<Communicator> world_;
  std::array<std::unique_ptr<Communicator>, 4> groups_;  // by Axis
  std::unique_ptr<Communicator> dp_cp_;                  // with cp > 1 only
};

}  // namespace strata::comm
