// The hang doctor (monitor/hang_doctor.h) on flight records made here, one situation each: a rank
// stuck outside communication, a chain of waits through a pipeline receive, a rank that left no
// record, a deadlock, nobody waiting, and records it must refuse. The records of real hung jobs
// are diagnosed by tests/monitor/hang_doctor_test.sh.
#include "strata/monitor/hang_doctor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "tests/temp_dir_test.h"

namespace strata::monitor {
namespace {

using nlohmann::json;

// A rank's record with the groups every rank of a world of 4 makes: "dp" {0,1,2,3} and "pp-p2p"
// over {r, r^1} (the pair), as comm/flight_recorder.cc writes them.
struct Rank {
  json j;
  Rank(int rank, int world, const std::string& activity, int64_t step) {
    j = {{"format", "strata-flight-1"},
         {"rank", rank},
         {"world", world},
         {"identity", "dp " + std::to_string(rank) + " on test"},
         {"reason", "abort: test"},
         {"written_unix_s", 100.0},
         {"step", step},
         {"activity", activity},
         {"activity_for_s", 4.0},
         {"still_for_s", 4.0},
         {"stuck_id", 0},
         {"groups", json::array()},
         {"entries", json::array()}};
  }
  // A group; returns its id.
  size_t group(const std::string& name, std::vector<int> members, uint64_t issued,
               json sent_to = json::object()) {
    j["groups"].push_back({{"name", name},
                           {"members", members},
                           {"collectives_issued", issued},
                           {"collectives_completed", issued},
                           {"sent_to", sent_to},
                           {"received_from", json::object()}});
    return j["groups"].size() - 1;
  }
  void entry(size_t group, const std::string& kind, uint64_t seq, const std::string& state,
             int peer = -1, const std::string& activity = "B 0.0") {
    json e = {{"id", j["entries"].size() + 1},
              {"group", group},
              {"kind", kind},
              {"op", kind == "collective" ? "all_reduce" : kind},
              {"seq", seq},
              {"bytes", 4096},
              {"step", j["step"]},
              {"activity", activity},
              {"state", state},
              {"issued_unix_s", 90.0}};
    if (kind != "collective") e["peer"] = peer, e["tag"] = 3;
    j["entries"].push_back(e);
  }
};

std::string joined(const Diagnosis& d) {
  std::string s;
  for (const std::string& l : d.lines) s += l + "\n";
  return s;
}

TEST(HangDoctor, NamesTheRankThatNeverReachedTheCollective) {
  std::vector<json> recs;
  for (int r = 0; r < 4; ++r) {
    Rank x(r, 4, r == 2 ? "injected hang (hang)" : "gradient reduction", 3);
    const size_t dp = x.group("dp", {0, 1, 2, 3}, r == 2 ? 4 : 5);
    x.entry(dp, "collective", 4, "completed");
    if (r != 2) x.entry(dp, "collective", 5, "running", -1, "gradient reduction");
    recs.push_back(x.j);
  }
  const Diagnosis d = diagnose(recs);
  EXPECT_EQ(d.roots, std::vector<int>{2}) << joined(d);
  EXPECT_FALSE(d.deadlock);
  const std::string s = joined(d);
  EXPECT_NE(s.find("ranks 0, 1 and 3 wait in dp all_reduce #5 (4.0 KiB), issued at step 3 in "
                   "\"gradient reduction\"; waiting 10.0 s"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("diagnosis: rank 2 (dp 2 on test) stopped at step 3 in \"injected hang "
                   "(hang)\" for 4.0 s: it holds the job"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("last operations: dp all_reduce #4"), std::string::npos) << s;
}

TEST(HangDoctor, FollowsAWaitingRankToTheOneItWaitsFor) {
  // Rank 3 waits in dp #5 for rank 1; rank 1 waits in a receive from rank 0, which never sent
  // it (it stopped in its forward).
  std::vector<json> recs;
  for (int r = 0; r < 4; ++r) {
    Rank x(r, 4, r == 0 ? "injected hang (hang-forward)" : "recv-act 0.0 from 0", 3);
    const size_t dp = x.group("dp", {0, 1, 2, 3}, r == 0 || r == 1 ? 4 : 5);
    const int pair = r ^ 1;
    const size_t p2p = x.group("pp-p2p", {std::min(r, pair), std::max(r, pair)}, 0,
                               {{std::to_string(pair), r == 0 ? 8 : 9}});
    if (r >= 2) x.entry(dp, "collective", 5, "running");
    if (r == 1) x.entry(p2p, "recv", 9, "running", 0, "recv-act 0.0 from 0");
    recs.push_back(x.j);
  }
  const Diagnosis d = diagnose(recs);
  EXPECT_EQ(d.roots, std::vector<int>{0}) << joined(d);
  const std::string s = joined(d);
  EXPECT_NE(s.find("rank 1 waits in pp-p2p recv #9 from rank 0 (tag 3, 4.0 KiB)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("rank 1 (dp 1 on test) never reached what ranks 2 and 3 wait in: it waits "
                   "itself, in pp-p2p recv #9 from rank 0"),
            std::string::npos)
      << s;
}

TEST(HangDoctor, ARankWithoutARecordIsTheRootWhenAllOthersReachedTheOperation) {
  std::vector<json> recs;
  for (int r : {0, 1, 3}) {
    Rank x(r, 4, "gradient reduction", 6);
    const size_t dp = x.group("dp", {0, 1, 2, 3}, 2);
    x.entry(dp, "collective", 2, "running");
    recs.push_back(x.j);
  }
  const Diagnosis d = diagnose(recs);
  EXPECT_EQ(d.roots, std::vector<int>{2}) << joined(d);
  const std::string s = joined(d);
  EXPECT_NE(s.find("flight records of 3 of 4 ranks; none from rank 2"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 2 left no record"), std::string::npos) << s;
}

TEST(HangDoctor, ACycleOfWaitsIsADeadlock) {
  // Ranks 0 and 1 each wait in a receive the other never sent (both receive first).
  std::vector<json> recs;
  for (int r = 0; r < 2; ++r) {
    Rank x(r, 2, "recv-grad 0.0", 1);
    const size_t p2p = x.group("pp-p2p", {0, 1}, 0, json::object());
    x.entry(p2p, "recv", 1, "running", 1 - r);
    recs.push_back(x.j);
  }
  const Diagnosis d = diagnose(recs);
  EXPECT_TRUE(d.deadlock) << joined(d);
  EXPECT_TRUE(d.roots.empty());
  EXPECT_NE(joined(d).find("a deadlock: ranks 0 and 1 wait for each other"), std::string::npos);
}

TEST(HangDoctor, GroupsOfTheSameNameAreMatchedByMembersAndOrder) {
  // Two "tp" groups per rank over the same pair, made in the same order everywhere: rank 0 waits
  // in the second one's #3, which rank 1 reached (its second group issued 3); the first one's
  // counts (rank 1 issued 1) must not be read for it.
  std::vector<json> recs;
  for (int r = 0; r < 2; ++r) {
    Rank x(r, 2, "F 0.0", 2);
    x.group("tp", {0, 1}, r == 0 ? 1 : 1);
    const size_t second = x.group("tp", {0, 1}, 3);
    x.entry(second, "collective", 3, "running");
    recs.push_back(x.j);
  }
  const Diagnosis d = diagnose(recs);
  EXPECT_TRUE(d.roots.empty()) << joined(d);
  EXPECT_FALSE(d.deadlock);
  EXPECT_NE(joined(d).find("every member reached the operations"), std::string::npos) << joined(d);
}

TEST(HangDoctor, NobodyWaitingReportsEachRanksActivity) {
  std::vector<json> recs;
  for (int r = 0; r < 2; ++r) {
    Rank x(r, 2, r ? "validation" : "checkpoint save", 9);
    x.group("dp", {0, 1}, 7);
    recs.push_back(x.j);
  }
  const std::string s = joined(diagnose(recs));
  EXPECT_NE(s.find("no rank waits in an operation"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 1 (dp 1 on test) at step 9 in \"validation\""), std::string::npos) << s;
}

class HangDoctorFiles : public strata::test::TempDirTest {};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST_F(HangDoctorFiles, RefusesWhatIsNotOneJobsRecords) {
  EXPECT_NE(input_error([&] { read_flight_records(path("none")); }).find("is not a directory"),
            std::string::npos);
  EXPECT_NE(input_error([&] { read_flight_records(dir_.string()); }).find("no flight records"),
            std::string::npos);
  write(path("rank0.json"), "{\"format\": \"strata-flight-1\", \"rank\": 0");
  EXPECT_NE(
      input_error([&] { read_flight_records(dir_.string()); }).find("rank0.json is not valid JSON"),
      std::string::npos);
  write(path("rank0.json"), "{\"rank\": 0}");
  EXPECT_NE(
      input_error([&] { read_flight_records(dir_.string()); }).find("no format strata-flight-1"),
      std::string::npos);
  write(path("rank0.json"), Rank(0, 2, "x", 1).j.dump());
  write(path("rank1.json"), Rank(1, 4, "x", 1).j.dump());
  EXPECT_NE(
      input_error([&] { read_flight_records(dir_.string()); }).find("disagree on the world size"),
      std::string::npos);
  Rank bad(1, 2, "x", 1);
  bad.entry(5, "collective", 1, "running");  // a group that does not exist
  write(path("rank1.json"), bad.j.dump());
  EXPECT_NE(input_error([&] { read_flight_records(dir_.string()); }).find("an entry without"),
            std::string::npos);
  write(path("rank1.json"), Rank(1, 2, "x", 1).j.dump());
  EXPECT_EQ(read_flight_records(dir_.string()).size(), 2u);
}

}  // namespace
}  // namespace strata::monitor
