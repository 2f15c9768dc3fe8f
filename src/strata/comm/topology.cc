#include "strata/comm/topology.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "strata/core/check.h"

namespace strata::comm {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::DP:
      return "dp";
    case Axis::TP:
      return "tp";
    case Axis::PP:
      return "pp";
    case Axis::CP:
      return "cp";
  }
  return "?";
}

namespace {

constexpr Axis kAxes[4] = {Axis::DP, Axis::TP, Axis::PP, Axis::CP};

// "tp-dp-pp" -> {TP, CP, DP, PP}, fastest first: cp right after tp where the order omits it.
std::array<Axis, 4> parse_order(const std::string& order) {
  std::vector<Axis> out;
  std::array<bool, 4> seen{};
  std::istringstream in(order);
  std::string tok;
  bool ok = true;
  while (ok && std::getline(in, tok, '-')) {
    int a = tok == "dp" ? 0 : tok == "tp" ? 1 : tok == "pp" ? 2 : tok == "cp" ? 3 : -1;
    ok = out.size() < 4 && a >= 0 && !seen[size_t(a)];
    if (ok) {
      seen[size_t(a)] = true;
      out.push_back(Axis(a));
    }
  }
  ok = ok && seen[0] && seen[1] && seen[2] && !order.empty() && order.back() != '-';
  STRATA_INPUT_CHECK(ok, "parallelism.order \"", order,
                     "\" is not a valid grid order: list tp, dp and pp (and optionally cp) once "
                     "each, fastest-varying first, separated by '-' (e.g. \"tp-dp-pp\", "
                     "Megatron's; cp goes after tp when not named)");
  if (!seen[3]) {
    const auto tp = std::find(out.begin(), out.end(), Axis::TP);
    out.insert(tp + 1, Axis::CP);
  }
  return {out[0], out[1], out[2], out[3]};
}

std::string join(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

}  // namespace

RankGrid::RankGrid(int world, int tp, int pp, std::string order, int cp)
    : world_(world), order_name_(std::move(order)) {
  STRATA_INPUT_CHECK(world >= 1, "the world size must be at least 1, got ", world);
  STRATA_INPUT_CHECK(tp >= 1, "parallelism.tensor must be at least 1, got ", tp);
  STRATA_INPUT_CHECK(pp >= 1, "parallelism.pipeline must be at least 1, got ", pp);
  STRATA_INPUT_CHECK(cp >= 1, "parallelism.context must be at least 1, got ", cp);
  const int model = tp * pp * cp;
  if (cp == 1) {
    STRATA_INPUT_CHECK(world % model == 0, "world size ", world,
                       " is not divisible by tensor x pipeline parallel size ", model, " (tp=", tp,
                       ", pp=", pp, "); launch a multiple of ", model,
                       " processes or choose tp and pp whose product divides ", world);
  } else {
    STRATA_INPUT_CHECK(world % model == 0, "world size ", world,
                       " is not divisible by tensor x pipeline x context parallel size ", model,
                       " (tp=", tp, ", pp=", pp, ", cp=", cp, "); launch a multiple of ", model,
                       " processes or choose tp, pp and cp whose product divides ", world);
  }
  size_[int(Axis::DP)] = world / model;
  size_[int(Axis::TP)] = tp;
  size_[int(Axis::PP)] = pp;
  size_[int(Axis::CP)] = cp;
  int stride = 1;
  for (Axis a : parse_order(order_name_)) {
    stride_[int(a)] = stride;
    stride *= size_[int(a)];
  }
}

GridCoord RankGrid::coord(int rank) const {
  STRATA_CHECK(rank >= 0 && rank < world_, "rank ", rank, " is outside the grid of ", world_,
               " ranks");
  GridCoord c;
  for (Axis a : kAxes) c.at(a) = rank / stride_[int(a)] % size_[int(a)];
  return c;
}

int RankGrid::rank_of(const GridCoord& c) const {
  int r = 0;
  for (Axis a : kAxes) {
    STRATA_CHECK(c.at(a) >= 0 && c.at(a) < size_[int(a)], axis_name(a), " coordinate ", c.at(a),
                 " is outside 0..", size_[int(a)] - 1);
    r += c.at(a) * stride_[int(a)];
  }
  return r;
}

std::vector<int> RankGrid::group_ranks(Axis axis, int rank) const {
  GridCoord c = coord(rank);
  std::vector<int> out;
  out.reserve(size_t(size(axis)));
  for (int i = 0; i < size(axis); ++i) {
    c.at(axis) = i;
    out.push_back(rank_of(c));
  }
  return out;
}

std::vector<std::vector<int>> RankGrid::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    if (coord(r).at(axis) == 0) out.push_back(group_ranks(axis, r));
  }
  return out;
}

std::string RankGrid::describe() const {
  std::ostringstream os;
  const bool context = cp() > 1;
  os << "rank grid: " << world_ << " ranks = dp " << dp();
  if (context) os << " x cp " << cp();
  os << " x tp " << tp() << " x pp " << pp() << ", order " << order_name_
     << " (fastest-varying first)\n";
  os << (context ? "rank    dp    cp    tp    pp\n" : "rank    dp    tp    pp\n");
  char line[64];
  for (int r = 0; r < world_; ++r) {
    const GridCoord c = coord(r);
    if (context) {
      std::snprintf(line, sizeof(line), "%4d  %4d  %4d  %4d  %4d\n", r, c.dp, c.cp, c.tp, c.pp);
    } else {
      std::snprintf(line, sizeof(line), "%4d  %4d  %4d  %4d\n", r, c.dp, c.tp, c.pp);
    }
    os << line;
  }
  std::vector<Axis> shown = {Axis::TP, Axis::DP, Axis::PP};
  if (context) shown.insert(shown.begin() + 1, Axis::CP);
  for (Axis a : shown) {
    const auto gs = groups(a);
    os << axis_name(a) << " groups (" << gs.size() << " of " << size(a) << "):";
    for (const auto& g : gs) os << " [" << join(g, " ") << "]";
    os << "\n";
  }
  return os.str();
}

std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path) {
  std::ifstream in(path);
  STRATA_INPUT_CHECK(in.good(), "cannot open hostfile ", path, ": ", std::strerror(errno));
  std::vector<std::pair<std::string, int>> hosts;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    const std::string where = strata::detail::concat(path, ":", lineno, ": ");
    STRATA_INPUT_CHECK(host.find('=') == std::string::npos, where,
                       "expected a host name first, got \"", host, "\"");
    int slots = 0;
    while (words >> word) {
      const size_t eq = word.find('=');
      const std::string key = word.substr(0, eq);
      const bool is_slots = key == "slots" || key == "count" || key == "cpu";
      STRATA_INPUT_CHECK(
          eq != std::string::npos && (is_slots || key == "max_slots" || key == "max-slots"), where,
          "unknown hostfile entry \"", word, "\"; expected slots=N (max_slots=N is also accepted)");
      const std::string value = word.substr(eq + 1);
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      STRATA_INPUT_CHECK(!value.empty() && *end == '\0' && n >= 1 && n <= 1 << 20, where, key,
                         " must be a positive integer, got \"", value, "\"");
      if (is_slots) slots = int(n);
    }
    STRATA_INPUT_CHECK(slots > 0, where, "host \"", host,
                       "\" has no slots=N; strata needs the slot count to place ranks (write \"",
                       host, " slots=8\")");
    bool merged = false;
    for (auto& [h, s] : hosts) {
      if (h != host) continue;
      s += slots;
      merged = true;
    }
    if (!merged) hosts.emplace_back(host, slots);
  }
  STRATA_INPUT_CHECK(!hosts.empty(), "hostfile ", path, " lists no hosts");
  return hosts;
}

void check_tp_within_hosts(const RankGrid& grid,
                           const std::vector<std::pair<std::string, int>>& hosts) {
  std::vector<size_t> host_of;  // by rank
  host_of.reserve(size_t(grid.world()));
  for (size_t h = 0; h < hosts.size() && host_of.size() < size_t(grid.world()); ++h) {
    for (int s = 0; s < hosts[h].second && host_of.size() < size_t(grid.world()); ++s) {
      host_of.push_back(h);
    }
  }
  STRATA_INPUT_CHECK(host_of.size() == size_t(grid.world()), "the hosts provide ", host_of.size(),
                     " slots for ", grid.world(), " ranks; add hosts or slots");
  for (const auto& g : grid.groups(Axis::TP)) {
    for (int r : g) {
      const size_t a = host_of[size_t(g.front())], b = host_of[size_t(r)];
      STRATA_INPUT_CHECK(a == b, "tensor-parallel group {", join(g, ","), "} spans hosts ",
                         hosts[a].first, " and ", hosts[b].first,
                         "; make slots per host a multiple of tp=", grid.tp(),
                         " or reorder the grid (tp fastest-varying, e.g. \"tp-dp-pp\")");
    }
  }
}

}  // namespace strata::comm
