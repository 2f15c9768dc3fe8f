#include "strata/monitor/hang_doctor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "strata/core/check.h"

namespace strata::monitor {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The fields diagnose() reads, checked once so that it can index freely.
void check_record(const json& j, const std::string& path) {
  auto need = [&](bool ok, const char* what) {
    STRATA_INPUT_CHECK(ok, "flight record ", path, ": ", what,
                       "; it is not a strata flight record (comm/flight_recorder.h) or was cut "
                       "short; leave the other ranks' records and run strata doctor again");
  };
  need(j.is_object() && j.value("format", "") == "strata-flight-1", "no format strata-flight-1");
  need(j.contains("rank") && j["rank"].is_number_integer(), "no integer rank");
  need(j.contains("world") && j["world"].is_number_integer() && j["world"].get<int>() >= 1,
       "no world size");
  need(j["rank"].get<int>() >= 0 && j["rank"].get<int>() < j["world"].get<int>(),
       "rank outside the world");
  need(j.contains("groups") && j["groups"].is_array(), "no groups");
  for (const json& g : j["groups"]) {
    need(g.is_object() && g.contains("name") && g["name"].is_string() && g.contains("members") &&
             g["members"].is_array() && g.contains("collectives_issued") && g.contains("sent_to") &&
             g["sent_to"].is_object(),
         "a group without name, members, collectives_issued or sent_to");
  }
  need(j.contains("entries") && j["entries"].is_array(), "no entries");
  for (const json& e : j["entries"]) {
    need(e.is_object() && e.contains("id") && e.contains("group") &&
             e["group"].is_number_integer() && e["group"].get<size_t>() < j["groups"].size() &&
             e.contains("kind") && e.contains("state") && e.contains("seq"),
         "an entry without id, group, kind, state or seq");
  }
}

}  // namespace

std::vector<json> read_flight_records(const std::string& dir) {
  std::error_code ec;
  STRATA_INPUT_CHECK(fs::is_directory(dir, ec), "no flight records: ", dir,
                     " is not a directory; give the run directory (train.run_dir) of a job that "
                     "hung, or its flight directory");
  std::map<int, json> by_rank;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("rank", 0) != 0 || f.path().extension() != ".json") continue;
    std::ifstream in(f.path());
    STRATA_INPUT_CHECK(in.good(), "cannot read flight record ", f.path().string());
    json j = json::parse(in, nullptr, false);
    STRATA_INPUT_CHECK(!j.is_discarded(), "flight record ", f.path().string(),
                       " is not valid JSON (cut short?); remove it and run strata doctor again");
    check_record(j, f.path().string());
    const int r = j["rank"].get<int>();
    STRATA_INPUT_CHECK(!by_rank.count(r), "two flight records of rank ", r, " in ", dir);
    by_rank[r] = std::move(j);
  }
  STRATA_INPUT_CHECK(!by_rank.empty(), "no flight records (rank<R>.json) in ", dir,
                     ": the job did not hang under a watchdog (parallelism.timeout_s > 0) at "
                     "several ranks, or its records went to another run directory");
  std::vector<json> out;
  for (auto& [r, j] : by_rank) out.push_back(std::move(j));
  const int world = out.front()["world"].get<int>();
  for (const json& j : out) {
    STRATA_INPUT_CHECK(j["world"].get<int>() == world, "flight records in ", dir,
                       " disagree on the world size (", world, " and ", j["world"].get<int>(),
                       "): they come from different jobs; keep one job's records");
  }
  return out;
}

namespace {

// A group as every member names it: name and members, and how many such groups the rank had
// made before it (a rank may make several groups over the same ranks).
std::string group_key(const json& groups, size_t g) {
  const json& G = groups[g];
  size_t earlier = 0;
  for (size_t i = 0; i < g; ++i) {
    earlier += groups[i]["name"] == G["name"] && groups[i]["members"] == G["members"];
  }
  return G["name"].get<std::string>() + G["members"].dump() + "#" + std::to_string(earlier);
}

std::optional<size_t> find_group(const json& rec, const std::string& key) {
  const json& groups = rec["groups"];
  for (size_t g = 0; g < groups.size(); ++g) {
    if (group_key(groups, g) == key) return g;
  }
  return std::nullopt;
}

bool done(const json& e) {
  const std::string s = e["state"].get<std::string>();
  return s == "completed" || s == "failed";
}

// The operation a rank waits in: the one its watchdog marked, else its oldest unfinished
// collective or receive (a send completes in the background and blocks nothing).
const json* waiting_in(const json& rec) {
  const uint64_t stuck = rec.value("stuck_id", uint64_t(0));
  const json& entries = rec["entries"];
  if (stuck != 0) {
    for (const json& e : entries) {
      if (e["id"].get<uint64_t>() == stuck && !done(e)) return &e;
    }
  }
  for (const json& e : entries) {
    if (!done(e) && e["kind"] != "send") return &e;
  }
  return nullptr;
}

std::string place(const json* rec, int rank) {
  std::string s = "rank " + std::to_string(rank);
  if (rec != nullptr && !rec->value("identity", "").empty()) {
    s += " (" + (*rec)["identity"].get<std::string>() + ")";
  }
  return s;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::string bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// "dp all_reduce #5 (109.5 KiB)" or "pp-p2p recv #3 from rank 0 (tag 7, 4.0 KiB)".
std::string op_text(const json& rec, const json& e) {
  const json& G = rec["groups"][e["group"].get<size_t>()];
  std::string s = G["name"].get<std::string>() + " " + e.value("op", "?") + " #" +
                  std::to_string(e["seq"].get<uint64_t>());
  const std::string kind = e["kind"].get<std::string>();
  if (kind == "recv") s += " from rank " + std::to_string(e.value("peer", -1));
  if (kind == "send") s += " to rank " + std::to_string(e.value("peer", -1));
  s += " (";
  if (kind != "collective") s += "tag " + std::to_string(e.value("tag", 0)) + ", ";
  s += bytes(e.value("bytes", uint64_t(0))) + ")";
  return s;
}

std::string doing(const json& rec) {
  return "at step " + std::to_string(rec.value("step", int64_t(0))) + " in \"" +
         rec.value("activity", "") + "\" for " + seconds(rec.value("activity_for_s", 0.0));
}

// The last few operations a rank completed, newest first.
std::string last_done(const json& rec, size_t n) {
  std::vector<std::string> out;
  const json& entries = rec["entries"];
  for (auto it = entries.rbegin(); it != entries.rend() && out.size() < n; ++it) {
    if (done(*it)) out.push_back(op_text(rec, *it));
  }
  if (out.empty()) return "none recorded";
  std::string s;
  for (size_t i = 0; i < out.size(); ++i) s += (i ? ", " : "") + out[i];
  return s;
}

}  // namespace

Diagnosis diagnose(const std::vector<json>& records) {
  Diagnosis d;
  const int world = records.front()["world"].get<int>();
  std::vector<const json*> rec(size_t(world), nullptr);
  for (const json& j : records) rec[size_t(j["rank"].get<int>())] = &j;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (rec[size_t(r)] == nullptr) missing.push_back(r);
  }
  d.lines.push_back("flight records of " + std::to_string(records.size()) + " of " +
                    std::to_string(world) + " ranks" +
                    (missing.empty() ? "" : "; none from " + rank_list(missing)));

  // Who each waiting rank waits for.
  std::vector<std::set<int>> waits_for(static_cast<size_t>(world));
  std::vector<const json*> wait_op(size_t(world), nullptr);
  // Waiting ranks grouped by the operation they wait in, for the report.
  std::map<std::string, std::vector<int>> by_op;
  std::map<std::string, std::string> op_line;
  for (int r = 0; r < world; ++r) {
    const json* R = rec[size_t(r)];
    if (R == nullptr) continue;
    const json* e = waiting_in(*R);
    if (e == nullptr) continue;
    wait_op[size_t(r)] = e;
    const json& groups = (*R)["groups"];
    const size_t g = e->at("group").get<size_t>();
    const std::string key = group_key(groups, g);
    const uint64_t seq = e->at("seq").get<uint64_t>();
    const std::string kind = e->at("kind").get<std::string>();
    std::vector<int> peers;
    if (kind == "collective") {
      for (const json& m : groups[g]["members"]) peers.push_back(m.get<int>());
    } else {
      peers.push_back(e->value("peer", -1));
    }
    for (int p : peers) {
      if (p == r || p < 0 || p >= world) continue;
      const json* P = rec[size_t(p)];
      if (P == nullptr) {
        waits_for[size_t(r)].insert(p);
        continue;
      }
      const std::optional<size_t> pg = find_group(*P, key);
      uint64_t reached = 0;
      if (pg) {
        const json& G = (*P)["groups"][*pg];
        reached = kind == "collective" ? G["collectives_issued"].get<uint64_t>()
                                       : G["sent_to"].value(std::to_string(r), uint64_t(0));
      }
      if (reached < seq) waits_for[size_t(r)].insert(p);
    }
    const std::string text = op_text(*R, *e);
    const std::string id = key + "|" + kind + "|" + std::to_string(seq) + "|" +
                           (kind == "collective" ? "" : std::to_string(r));
    by_op[id].push_back(r);
    op_line[id] = text + ", issued at step " + std::to_string(e->value("step", int64_t(0))) +
                  " in \"" + e->value("activity", "") + "\"";
  }
  for (const auto& [id, ranks] : by_op) {
    const json& R = *rec[size_t(ranks.front())];
    d.lines.push_back(rank_list(ranks) + (ranks.size() == 1 ? " waits" : " wait") + " in " +
                      op_line[id] + "; waiting " +
                      seconds(R.value("written_unix_s", 0.0) -
                              wait_op[size_t(ranks.front())]->value("issued_unix_s", 0.0)));
  }

  // The ranks that are waited for, followed to the ones that wait for nothing.
  std::set<int> blamed;
  for (int r = 0; r < world; ++r)
    blamed.insert(waits_for[size_t(r)].begin(), waits_for[size_t(r)].end());
  std::set<int> roots;
  for (int b : blamed) {
    if (rec[size_t(b)] == nullptr || wait_op[size_t(b)] == nullptr) roots.insert(b);
  }
  for (int b : blamed) {
    std::vector<int> waiters;
    for (int r = 0; r < world; ++r) {
      if (waits_for[size_t(r)].count(b)) waiters.push_back(r);
    }
    const json* B = rec[size_t(b)];
    std::string line = place(B, b) + " never reached what " + rank_list(waiters) +
                       (waiters.size() == 1 ? " waits" : " wait") + " in: ";
    if (B == nullptr) {
      line +=
          "it wrote no flight record (it died, or was killed before it could write; see the "
          "job's log for its exit)";
    } else if (wait_op[size_t(b)] != nullptr) {
      line += "it waits itself, in " + op_text(*B, *wait_op[size_t(b)]);
    } else {
      line += "it is in no communication, " + doing(*B) + "; last operations: " + last_done(*B, 3);
    }
    d.lines.push_back(line);
  }

  d.roots.assign(roots.begin(), roots.end());
  if (!d.roots.empty()) {
    std::string line = "diagnosis: ";
    for (size_t i = 0; i < d.roots.size(); ++i) {
      const int r = d.roots[i];
      const json* R = rec[size_t(r)];
      if (i > 0) line += "; ";
      line += place(R, r) + (R == nullptr ? " left no record" : " stopped " + doing(*R));
    }
    line += d.roots.size() == 1 ? ": it holds the job" : ": they hold the job";
    d.lines.push_back(line);
  } else if (!blamed.empty()) {
    d.deadlock = true;
    d.lines.push_back("diagnosis: a deadlock: " + rank_list({blamed.begin(), blamed.end()}) +
                      " wait for each other (their operation orders disagree: a schedule or "
                      "collective issued on some ranks only)");
  } else if (by_op.empty()) {
    d.lines.push_back("diagnosis: no rank waits in an operation; each rank's last activity:");
    for (int r = 0; r < world; ++r) {
      if (rec[size_t(r)] != nullptr)
        d.lines.push_back("  " + place(rec[size_t(r)], r) + " " + doing(*rec[size_t(r)]));
    }
  } else {
    d.lines.push_back(
        "diagnosis: every member reached the operations the ranks wait in (it is "
        "slow or lost in the transport, not missing a rank)");
  }
  return d;
}

}  // namespace strata::monitor
