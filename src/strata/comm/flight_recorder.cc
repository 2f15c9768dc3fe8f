#include "strata/comm/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "strata/comm/mpi_runtime.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"

namespace strata::comm::flight {

namespace {

using clock = std::chrono::system_clock;

double now_s() {
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

struct Group {
  std::string name;
  std::vector<int> members;  // world ranks, by group rank
  int my_rank = 0;           // in the group
  uint64_t collectives_issued = 0, collectives_completed = 0;
  std::map<int, uint64_t> sent, received;  // by peer (group rank): messages issued
};

enum class State : uint8_t { Issued, Running, Completed, Failed };

struct Entry {
  uint64_t id = 0;  // 0: an empty slot
  int group = 0;
  Kind kind = Kind::Collective;
  State state = State::Issued;
  const char* op = "";
  int peer = 0;  // group rank (send, recv)
  int tag = 0;
  uint64_t seq = 0;  // the group's collective number, or the message number to/from peer
  uint64_t bytes = 0;
  int64_t step = 0;
  std::array<char, 64> activity{};
  double issued = 0, started = 0, completed = 0;
};

struct Recorder {
  std::mutex mu;
  std::vector<Group> groups;
  std::vector<Entry> ring = std::vector<Entry>(kEntries);
  uint64_t next_id = 1;
  int64_t step = 0;
  std::array<char, 64> activity{};
  double activity_since = now_s();
  double last_event = now_s();  // an operation issued or completed, or a new activity
  uint64_t stuck = 0;
  // Dumping.
  std::string dir, identity;
  std::chrono::seconds watch{0};
  bool enabled = false, snapshot_taken = false;
  std::thread watcher;
  std::condition_variable stop_cv;
  bool stop = false;
};

Recorder& rec() {
  static Recorder* r = new Recorder;  // never destroyed: a dying job's threads may still record
  return *r;
}

void copy_label(std::array<char, 64>& dst, std::string_view s) {
  const size_t n = std::min(s.size(), dst.size() - 1);
  std::memcpy(dst.data(), s.data(), n);
  dst[n] = '\0';
}

Entry* find(Recorder& r, uint64_t id) {
  Entry& e = r.ring[id % kEntries];
  return e.id == id ? &e : nullptr;
}

const char* state_name(State s) {
  switch (s) {
    case State::Issued:
      return "issued";
    case State::Running:
      return "running";
    case State::Completed:
      return "completed";
    case State::Failed:
      return "failed";
  }
  return "?";
}

const char* kind_name(Kind k) {
  return k == Kind::Collective ? "collective" : k == Kind::Send ? "send" : "recv";
}

// mu held.
nlohmann::json record(const Recorder& r, const std::string& reason) {
  using nlohmann::json;
  const double now = now_s();
  json j;
  j["format"] = "strata-flight-1";
  j["rank"] = world_rank();
  j["world"] = world_size();
  j["host"] = host_name();
  j["pid"] = int64_t(getpid());
  j["identity"] = r.identity;
  j["reason"] = reason;
  j["written_unix_s"] = now;
  j["step"] = r.step;
  j["activity"] = r.activity.data();
  j["activity_for_s"] = now - r.activity_since;
  j["still_for_s"] = now - r.last_event;
  j["stuck_id"] = r.stuck;
  json groups = json::array();
  for (size_t g = 0; g < r.groups.size(); ++g) {
    const Group& G = r.groups[g];
    json sent = json::object(), received = json::object();
    for (const auto& [peer, n] : G.sent) sent[std::to_string(G.members[size_t(peer)])] = n;
    for (const auto& [peer, n] : G.received) received[std::to_string(G.members[size_t(peer)])] = n;
    groups.push_back({{"id", g},
                      {"name", G.name},
                      {"members", G.members},
                      {"collectives_issued", G.collectives_issued},
                      {"collectives_completed", G.collectives_completed},
                      {"sent_to", sent},
                      {"received_from", received}});
  }
  j["groups"] = groups;
  std::vector<const Entry*> live;
  for (const Entry& e : r.ring) {
    if (e.id != 0) live.push_back(&e);
  }
  std::sort(live.begin(), live.end(), [](const Entry* a, const Entry* b) { return a->id < b->id; });
  json entries = json::array();
  for (const Entry* e : live) {
    const Group& G = r.groups[size_t(e->group)];
    json x = {{"id", e->id},
              {"group", e->group},
              {"kind", kind_name(e->kind)},
              {"op", e->op},
              {"seq", e->seq},
              {"bytes", e->bytes},
              {"step", e->step},
              {"activity", e->activity.data()},
              {"state", state_name(e->state)},
              {"issued_unix_s", e->issued}};
    if (e->kind != Kind::Collective) {
      x["peer"] = G.members[size_t(e->peer)];
      x["tag"] = e->tag;
    }
    if (e->state != State::Issued) x["started_unix_s"] = e->started;
    if (e->state == State::Completed || e->state == State::Failed) {
      x["completed_unix_s"] = e->completed;
    }
    entries.push_back(std::move(x));
  }
  j["entries"] = entries;
  return j;
}

bool write_locked(Recorder& r, const std::string& reason) {
  if (!r.enabled) return false;
  try {
    const std::string text = record(r, reason).dump(1) + "\n";
    std::filesystem::create_directories(r.dir);
    const std::string path =
        (std::filesystem::path(r.dir) / ("rank" + std::to_string(world_rank()) + ".json")).string();
    AtomicFile f(path, IoError::runtime);
    f.write(text);
    f.commit();
    return true;
  } catch (...) {
    return false;  // a full disk must not hide the abort that called us
  }
}

void watch_loop() {
  Recorder& r = rec();
  std::unique_lock<std::mutex> lock(r.mu);
  while (!r.stop) {
    r.stop_cv.wait_for(lock, std::chrono::milliseconds(250));
    if (r.stop || r.watch.count() <= 0) continue;
    const double still = now_s() - r.last_event;
    if (!r.snapshot_taken && still >= 0.5 * double(r.watch.count())) {
      r.snapshot_taken = true;
      write_locked(r, strata::detail::concat("still: no operation issued or completed and no new "
                                             "activity for ",
                                             int64_t(still), " s (snapshot)"));
    }
  }
}

void touch(Recorder& r) {
  r.last_event = now_s();
  r.snapshot_taken = false;
}

}  // namespace

void enable(const std::string& dir, std::chrono::seconds watch, std::string identity) {
  Recorder& r = rec();
  disable();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dir = dir;
  r.watch = watch;
  r.identity = std::move(identity);
  r.enabled = true;
  r.stop = false;
  touch(r);
  r.watcher = std::thread(watch_loop);
}

void disable() {
  Recorder& r = rec();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.enabled = false;
    r.stop = true;
    t = std::move(r.watcher);
  }
  r.stop_cv.notify_all();
  if (t.joinable()) t.join();
}

void set_activity(int64_t step, std::string_view what) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.step = step;
  if (std::string_view(r.activity.data()) != what) {
    copy_label(r.activity, what);
    r.activity_since = now_s();
  }
  touch(r);
}

int register_group(const std::string& name, MPI_Comm comm) {
  Group g;
  g.name = name;
  int size = 1;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &g.my_rank);
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) local[size_t(i)] = i;
  g.members.resize(size_t(size));
  MPI_Group_translate_ranks(mine, size, local.data(), world, g.members.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.groups.push_back(std::move(g));
  return int(r.groups.size()) - 1;
}

uint64_t issue(int group, Kind kind, const char* op, int peer, int tag, uint64_t bytes) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  Group& G = r.groups[size_t(group)];
  Entry& e = r.ring[r.next_id % kEntries];
  e.id = r.next_id++;
  e.group = group;
  e.kind = kind;
  e.state = State::Issued;
  e.op = op;
  e.peer = peer;
  e.tag = tag;
  e.seq = kind == Kind::Collective ? ++G.collectives_issued
          : kind == Kind::Send     ? ++G.sent[peer]
                                   : ++G.received[peer];
  e.bytes = bytes;
  e.step = r.step;
  e.activity = r.activity;
  e.issued = now_s();
  touch(r);
  return e.id;
}

void start(uint64_t id) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (Entry* e = find(r, id)) {
    e->state = State::Running;
    e->started = now_s();
  }
}

void complete(uint64_t id, bool failed) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  Entry* e = find(r, id);
  if (e == nullptr) return;
  if (e->state == State::Issued) e->started = now_s();
  e->state = failed ? State::Failed : State::Completed;
  e->completed = now_s();
  if (e->kind == Kind::Collective) ++r.groups[size_t(e->group)].collectives_completed;
  touch(r);
}

void mark_stuck(uint64_t id) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.stuck = id;
}

bool dump(const std::string& reason) {
  Recorder& r = rec();
  // A thread that died holding the lock cannot happen (nothing in it throws past the guard), but
  // an abort must not wait forever on a recorder: give up after a second.
  std::unique_lock<std::mutex> lock(r.mu, std::defer_lock);
  for (int i = 0; i < 100 && !lock.try_lock(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!lock.owns_lock()) return false;
  return write_locked(r, reason);
}

std::string to_json(const std::string& reason) {
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  return record(r, reason).dump(1);
}

}  // namespace strata::comm::flight
