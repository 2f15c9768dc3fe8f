// The flight recorder (comm/flight_recorder.h) as communicators and peer exchanges feed it:
// collectives numbered per group, point-to-point messages per peer, the activity they were
// issued in, the ring's bound with whole counts, and the files it writes (on demand and when the
// rank has been still for half the watch timeout). Run under mpirun with 2 and 4 ranks.
#include "strata/comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/peer_exchange.h"

namespace strata::comm {
namespace {

using nlohmann::json;

json record() {
  return json::parse(flight::to_json("test"));
}

// The newest group of that name in the record (each test makes its own communicator).
const json& group_named(const json& r, const std::string& name, size_t* id = nullptr) {
  const json& groups = r["groups"];
  for (size_t g = groups.size(); g-- > 0;) {
    if (groups[g]["name"] == name) {
      if (id != nullptr) *id = g;
      return groups[g];
    }
  }
  ADD_FAILURE() << "no group " << name;
  static const json none;
  return none;
}

std::vector<json> entries_of(const json& r, size_t group) {
  std::vector<json> out;
  for (const json& e : r["entries"]) {
    if (e["group"].get<size_t>() == group) out.push_back(e);
  }
  return out;
}

TEST(FlightRecorder, CollectivesNumberedPerGroupWithActivityAndBytes) {
  Communicator c(MPI_COMM_WORLD, "flt-coll");
  std::vector<float> x(100, 1.0f);
  flight::set_activity(7, "B 2.0");
  c.all_reduce(x.data(), x.size(), DType::F32, DType::F32);
  c.all_reduce(x.data(), x.size(), DType::F32, DType::F32);
  flight::set_activity(7, "gradient reduction");
  c.all_reduce_async(x.data(), 50, DType::F32, DType::F32).wait();
  c.barrier();
  const json r = record();
  size_t id = 0;
  const json& g = group_named(r, "flt-coll", &id);
  std::vector<int> members;
  for (int i = 0; i < c.size(); ++i) members.push_back(i);
  EXPECT_EQ(g["members"].get<std::vector<int>>(), members);
  EXPECT_EQ(g["collectives_issued"], 4);
  EXPECT_EQ(g["collectives_completed"], 4);
  const std::vector<json> e = entries_of(r, id);
  ASSERT_EQ(e.size(), 4u);
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i]["seq"], i + 1);
    EXPECT_EQ(e[i]["state"], "completed");
    EXPECT_EQ(e[i]["step"], 7);
    EXPECT_LE(e[i]["issued_unix_s"].get<double>(), e[i]["completed_unix_s"].get<double>());
  }
  EXPECT_EQ(e[0]["op"], "all_reduce");
  EXPECT_EQ(e[0]["activity"], "B 2.0");
  EXPECT_EQ(e[0]["bytes"], 400);
  EXPECT_EQ(e[2]["activity"], "gradient reduction");
  EXPECT_EQ(e[2]["bytes"], 200);
  EXPECT_EQ(e[3]["op"], "barrier");
  EXPECT_EQ(r["rank"], world_rank());
  EXPECT_EQ(r["world"], world_size());
}

TEST(FlightRecorder, PointToPointCountedPerPeerInWorldRanks) {
  Communicator c(MPI_COMM_WORLD, "flt-p2p");
  const int n = c.size(), me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  PeerExchange px(c, std::chrono::seconds(60), 2, 64);
  float out[4] = {1, 2, 3, 4}, in[4] = {};
  for (int round = 0; round < 3; ++round) {
    px.send(out, 4, DType::F32, next, round, "a test message", {});
    (void)px.recv(in, 4, DType::F32, prev, round, "a test message");
  }
  px.wait_sends();
  const json r = record();
  size_t id = 0;
  const json& g = group_named(r, "flt-p2p-p2p", &id);
  EXPECT_EQ(g["sent_to"][std::to_string(next)], 3);
  EXPECT_EQ(g["received_from"][std::to_string(prev)], 3);
  EXPECT_EQ(g["collectives_issued"], 0);
  const std::vector<json> e = entries_of(r, id);
  ASSERT_EQ(e.size(), 6u);
  for (const json& x : e) {
    EXPECT_EQ(x["state"], "completed") << x.dump();
    EXPECT_EQ(x["peer"], x["kind"] == "send" ? next : prev);
    EXPECT_EQ(x["bytes"], 16);
  }
  EXPECT_EQ(e[4]["kind"], "send");
  EXPECT_EQ(e[4]["seq"], 3);
  EXPECT_EQ(e[4]["tag"], 2);
  EXPECT_EQ(e[5]["kind"], "recv");
  EXPECT_EQ(e[5]["seq"], 3);
}

TEST(FlightRecorder, RingKeepsTheLastEntriesAndWholeCounts) {
  Communicator c(MPI_COMM_WORLD, "flt-ring");
  const size_t ops = flight::kEntries + 100;
  for (size_t i = 0; i < ops; ++i) c.barrier();
  const json r = record();
  size_t id = 0;
  const json& g = group_named(r, "flt-ring", &id);
  EXPECT_EQ(g["collectives_issued"], ops);
  EXPECT_EQ(g["collectives_completed"], ops);
  EXPECT_EQ(r["entries"].size(), flight::kEntries);
  const std::vector<json> e = entries_of(r, id);
  ASSERT_EQ(e.size(), flight::kEntries);
  EXPECT_EQ(e.front()["seq"], ops - flight::kEntries + 1);  // oldest first
  EXPECT_EQ(e.back()["seq"], ops);
}

std::string temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "strata_flight_XXXXXX").string();
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(FlightRecorder, DumpWritesOnlyOnceEnabled) {
  const std::string dir = temp_dir();
  const std::string file = dir + "/flight/rank" + std::to_string(world_rank()) + ".json";
  EXPECT_FALSE(flight::dump("not enabled"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/flight"));
  flight::enable(dir + "/flight", std::chrono::seconds(0), "dp 0 tp 0 pp 0 on test");
  flight::set_activity(3, "optimizer");
  ASSERT_TRUE(flight::dump("abort: a test"));
  const json r = read_json(file);
  EXPECT_EQ(r["format"], "strata-flight-1");
  EXPECT_EQ(r["reason"], "abort: a test");
  EXPECT_EQ(r["identity"], "dp 0 tp 0 pp 0 on test");
  EXPECT_EQ(r["step"], 3);
  EXPECT_EQ(r["activity"], "optimizer");
  flight::disable();
  EXPECT_FALSE(flight::dump("disabled again"));
  EXPECT_EQ(read_json(file)["reason"], "abort: a test");
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, StillRankWritesASnapshotAtHalfTheWatch) {
  const std::string dir = temp_dir();
  const std::string file = dir + "/rank" + std::to_string(world_rank()) + ".json";
  flight::enable(dir, std::chrono::seconds(2), "still test");
  // Busy (a new activity every 100 ms) for 1.5 s: no snapshot.
  for (int i = 0; i < 15; ++i) {
    flight::set_activity(1, i % 2 ? "F 0.0" : "B 0.0");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(std::filesystem::exists(file));
  // Still for more than 1 s: one.
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  ASSERT_TRUE(std::filesystem::exists(file));
  const json r = read_json(file);
  EXPECT_EQ(r["reason"].get<std::string>().rfind("still: ", 0), 0u) << r["reason"];
  EXPECT_GE(r["still_for_s"].get<double>(), 1.0);
  flight::disable();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::comm
