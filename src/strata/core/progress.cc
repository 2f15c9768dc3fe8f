#include "strata/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "strata/core/memory.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

struct Task {
  std::string what;
  uint64_t total = 0;
  ProgressTask::Unit unit = ProgressTask::Unit::Bytes;
  Clock::time_point start;
  uint64_t done = 0;
};

struct State {
  std::mutex mu;
  bool live = false;
  bool shown = false;        // something is on the live line
  std::string status;        // the training's line, restored when a task ends
  std::vector<Task*> tasks;  // innermost last
  Clock::time_point last_draw;
};

State& state() {
  static State* s = new State;  // never destroyed: tasks may end during static destruction
  return *s;
}

// Rewrites the live line (mu held).
void draw(State& s, const std::string& text) {
  std::fputs("\r", stdout);
  std::fputs(text.c_str(), stdout);
  std::fputs("\x1b[K", stdout);
  std::fflush(stdout);
  s.shown = !text.empty();
}

std::string task_text(const Task& t) {
  const uint64_t done = t.done;
  const double secs = std::chrono::duration<double>(Clock::now() - t.start).count();
  const double rate = secs > 0 ? double(done) / secs : 0.0;
  const bool bytes = t.unit == ProgressTask::Unit::Bytes;
  auto amount = [&](double v) {
    if (bytes) return format_bytes(size_t(v));
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", v);
    return std::string(b);
  };
  std::string text = t.what + ": " + amount(double(done));
  if (t.total > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.0f%%)",
                  100.0 * double(std::min(done, t.total)) / double(t.total));
    text += " of " + amount(double(t.total)) + pct;
  }
  text += " | " + amount(rate) + "/s";
  if (t.total > 0 && rate > 0 && done < t.total) {
    text += " | ETA " + format_duration(double(t.total - done) / rate);
  }
  return text;
}

}  // namespace

bool decide_live_progress() {
  if (const char* p = std::getenv("STRATA_PROGRESS")) {
    if (std::strcmp(p, "live") == 0) return true;
    if (std::strcmp(p, "lines") == 0) return false;
  }
  const char* term = std::getenv("TERM");
  if (term == nullptr || std::strcmp(term, "dumb") == 0) return false;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr) {
    return false;  // a rank: its pty says nothing of where mpirun's output goes
  }
  return isatty(STDOUT_FILENO) == 1;
}

void set_live_progress(bool live) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.live = live;
}

bool live_progress() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.live;
}

void status_line(const std::string& text) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.status = text;
  if (s.live && s.tasks.empty()) draw(s, text);
}

void log_line(const std::string& line) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.live && s.shown) std::fputs("\r\x1b[K", stdout);
  std::fputs(line.c_str(), stdout);
  std::fputs("\n", stdout);
  if (s.live) {
    s.shown = false;
    const std::string again = s.tasks.empty() ? s.status : task_text(*s.tasks.back());
    if (!again.empty()) draw(s, again);
  }
  std::fflush(stdout);
}

void end_status_line() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.live && s.shown) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  s.shown = false;
  s.status.clear();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char b[32];
  if (seconds < 10) {
    std::snprintf(b, sizeof b, "%.1fs", seconds);
  } else if (seconds < 3600) {
    const long t = std::lround(seconds);
    std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
    if (t < 60) std::snprintf(b, sizeof b, "%lds", t);
  } else {
    const long m = std::lround(seconds / 60);
    std::snprintf(b, sizeof b, "%ldh%02ldm", m / 60, m % 60);
  }
  return b;
}

ProgressTask::ProgressTask(std::string what, uint64_t total, Unit unit) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Task* t = new Task;
  t->what = std::move(what);
  t->total = total;
  t->unit = unit;
  t->start = Clock::now();
  s.tasks.push_back(t);
  s.last_draw = Clock::time_point{};
}

ProgressTask::~ProgressTask() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  delete s.tasks.back();
  s.tasks.pop_back();
  if (s.live && s.shown) {
    draw(s, s.tasks.empty() ? s.status : task_text(*s.tasks.back()));
  }
}

void progress_advance(uint64_t n) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.tasks.empty()) return;
  Task* t = s.tasks.back();
  t->done += n;
  if (!s.live) return;
  const auto now = Clock::now();
  if (now - s.last_draw < std::chrono::milliseconds(100)) return;
  s.last_draw = now;
  draw(s, task_text(*t));
}

}  // namespace strata
