// The monitored process tree: the root and every descendant, found by walking
// /proc/<pid>/stat parent links on each sample (so data-loader workers forked
// by any thread are seen). CPU % sums per-process utime+stime deltas, keyed by
// (pid, start time) so a reused pid is not mistaken for an old process.
//
// Cost: a process outside the tree never joins it (a new child is a new pid),
// so pids known to be outside are not read again until the next full scan,
// once a second; a pid reused within that second is picked up by it.
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "fullburn/telemetry.h"
#include "parse.h"

namespace fullburn {
namespace {

struct ProcStat {
  int pid = 0, ppid = 0;
  char state = '?';
  uint64_t utime = 0, stime = 0, start = 0, threads = 0, rss_pages = 0;
};

// Parses /proc/<pid>/stat. The command name may hold spaces and parentheses,
// so fields are counted from the last ')'.
bool ParseStat(const std::string& text, ProcStat* out) {
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  out->pid = std::atoi(text.c_str());
  const char* p = text.data() + close + 1;
  const char* end = text.data() + text.size();
  const char* word;
  size_t len;
  if (!parse::Word(&p, end, &word, &len)) return false;  // field 3, the state
  out->state = word[0];
  // Field numbers as in proc(5).
  for (int field = 4; field <= 24; ++field) {
    uint64_t v = 0;
    if (!parse::U64(&p, end, &v)) {
      if (!parse::Word(&p, end, &word, &len)) return false;  // a signed field
      continue;
    }
    switch (field) {
      case 4: out->ppid = static_cast<int>(v); break;
      case 14: out->utime = v; break;
      case 15: out->stime = v; break;
      case 20: out->threads = v; break;
      case 22: out->start = v; break;
      case 24: out->rss_pages = v; return true;
      default: break;
    }
  }
  return false;
}

bool IsPid(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

Result<ProcessIdentity> ReadProcessIdentity(const Env& env, int pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  Result<std::string> text = env.ReadFile(path);
  ProcStat st;
  if (!text.ok() || !ParseStat(*text, &st))
    return Status::NotFound("no process " + std::to_string(pid));
  return ProcessIdentity{st.state, st.start};
}

void ProcTreeCollector::Collect(ProcTreeSample* out) {
  Result<std::vector<std::string>> names = env_->ListDir("/proc");
  if (!names.ok()) return;
  double now = env_->MonotonicSeconds();
  bool full_scan = last_full_scan_ < 0 || now - last_full_scan_ >= 1.0;
  if (full_scan) last_full_scan_ = now;
  std::unordered_map<int, ProcStat> stats;
  std::unordered_multimap<int, int> children;
  std::unordered_set<int> outside;
  for (const std::string& name : *names) {
    if (!IsPid(name)) continue;
    int pid = std::atoi(name.c_str());
    if (!full_scan && outside_.count(pid)) {
      outside.insert(pid);
      continue;
    }
    Result<std::string> text = env_->ReadFile("/proc/" + name + "/stat");
    ProcStat st;
    if (!text.ok() || !ParseStat(*text, &st)) continue;  // exited meanwhile
    stats[st.pid] = st;
    children.emplace(st.ppid, st.pid);
  }
  if (!stats.count(root_pid_)) {
    outside_.clear();
    out->processes = 0;  // the root has exited: the tree is empty, a true 0
    out->threads = 0;
    out->rss_bytes = 0;
    return;
  }
  std::vector<int> todo = {root_pid_};
  if (adopter_pid_ > 0) {
    auto adopted = children.equal_range(adopter_pid_);
    for (auto it = adopted.first; it != adopted.second; ++it)
      if (it->second != root_pid_ && it->second != adopter_pid_) todo.push_back(it->second);
  }
  std::unordered_map<Key, uint64_t, KeyHash> ticks_now;
  uint64_t threads = 0, rss_pages = 0, delta = 0;
  // /proc is read one file at a time, so a pid reused meanwhile can make
  // the parent links a cycle: each process is counted once.
  std::unordered_set<int> visited;
  while (!todo.empty()) {
    int pid = todo.back();
    todo.pop_back();
    if (!visited.insert(pid).second) continue;
    const ProcStat& st = stats[pid];
    out->pids.push_back(pid);
    threads += st.threads;
    rss_pages += st.rss_pages;
    Key key{pid, st.start};
    uint64_t ticks = st.utime + st.stime;
    ticks_now[key] = ticks;
    auto was = last_ticks_.find(key);
    uint64_t before = was == last_ticks_.end() ? 0 : was->second;
    delta += ticks >= before ? ticks - before : 0;
    auto range = children.equal_range(pid);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second != pid) todo.push_back(it->second);
  }
  for (const auto& kv : stats)
    if (!ticks_now.count(Key{kv.first, kv.second.start})) outside.insert(kv.first);
  outside_ = std::move(outside);
  out->processes = static_cast<double>(out->pids.size());
  out->threads = static_cast<double>(threads);
  out->rss_bytes = static_cast<double>(rss_pages) * env_->PageSize();
  if (last_time_ >= 0 && now > last_time_)
    out->cpu_util = 100.0 * delta / env_->ClockTicksPerSecond() / (now - last_time_);
  last_time_ = now;
  last_ticks_ = std::move(ticks_now);
}

}  // namespace fullburn
