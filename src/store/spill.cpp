// The spill (spill.h): refused records as checksummed JSON lines in a file
// on another file system, and their import.
#include "fullburn/spill.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fullburn/store_layout.h"

namespace fullburn {
namespace {

using nlohmann::json;

constexpr int kSpillFormat = 1;

std::string Hex(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

uint32_t Crc(const std::string& s) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

// The device a path (or, for one not there yet, its folder) lies on.
std::optional<dev_t> DeviceOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return st.st_dev;
  size_t slash = path.rfind('/');
  std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(folder.c_str(), &st) == 0) return st.st_dev;
  return std::nullopt;
}

// A folder of ours in `base` that this user may write; "" if not.
std::string Usable(const std::string& base, const std::string& leaf) {
  if (base.empty()) return "";
  std::string dir = base + "/" + leaf;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) return "";
  return ::access(dir.c_str(), W_OK) == 0 ? dir : "";
}

std::vector<std::pair<std::string, std::string>> Candidates() {
  const std::string uid = std::to_string(::getuid());
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  const char* tmp = std::getenv("TMPDIR");
  return {{runtime ? runtime : "", "fullburn"},
          {"/dev/shm", "fullburn-" + uid},
          {tmp && *tmp ? tmp : "/tmp", "fullburn-" + uid}};
}

json RunJson(const RunInfo& r) {
  json j{{"id", r.id},         {"name", r.name},         {"command", r.command},
         {"cwd", r.cwd},       {"host", r.host},         {"start_time", r.start_time},
         {"interval_s", r.interval_s}, {"config", r.config_json}, {"gpus", r.gpus_json},
         {"recorder_pid", r.recorder_pid}};
  if (r.parent_id) j["parent_id"] = *r.parent_id;
  if (r.recorder_start) j["recorder_start"] = *r.recorder_start;
  return j;
}

RunInfo RunFromJson(const json& j) {
  RunInfo r;
  r.id = j.value("id", int64_t{0});
  r.name = j.value("name", std::string("imported"));
  if (j.contains("command") && j["command"].is_array())
    for (const auto& a : j["command"])
      if (a.is_string()) r.command.push_back(a.get<std::string>());
  r.cwd = j.value("cwd", std::string());
  r.host = j.value("host", std::string());
  r.start_time = j.value("start_time", 0.0);
  r.interval_s = j.value("interval_s", 1.0);
  r.config_json = j.value("config", std::string("{}"));
  r.gpus_json = j.value("gpus", std::string("[]"));
  r.recorder_pid = j.value("recorder_pid", 0);
  if (j.contains("parent_id") && j["parent_id"].is_number_integer())
    r.parent_id = j["parent_id"].get<int64_t>();
  if (j.contains("recorder_start") && j["recorder_start"].is_number())
    r.recorder_start = j["recorder_start"].get<double>();
  return r;
}

// Each whole, checked line of a spill, in order; damaged ones counted.
struct SpillLines {
  std::vector<json> lines;
  int64_t skipped = 0;
  std::string first_skip;
};

Result<SpillLines> ReadLines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + path + ": " + std::strerror(errno));
  SpillLines out;
  std::string line;
  int64_t number = 0;
  auto skip = [&](const std::string& why) {
    if (out.skipped++ == 0) out.first_skip = "line " + std::to_string(number) + ": " + why;
  };
  while (std::getline(in, line)) {
    ++number;
    bool whole = !in.eof();  // the last line without its newline was cut short
    size_t tab = line.rfind('\t');
    if (!whole) {
      skip("cut short (no end of line)");
      continue;
    }
    if (tab == std::string::npos || line.size() - tab - 1 != 8) {
      skip("no checksum");
      continue;
    }
    std::string body = line.substr(0, tab);
    if (Hex(Crc(body)) != line.substr(tab + 1)) {
      skip("its checksum does not match (damaged)");
      continue;
    }
    json j = json::parse(body, nullptr, false);
    if (!j.is_object()) {
      skip("not a JSON object");
      continue;
    }
    out.lines.push_back(std::move(j));
  }
  return out;
}

}  // namespace

Result<std::string> SpillFolder(const Env& env, const std::string& store_path) {
  (void)env;
  std::optional<dev_t> store_dev = DeviceOf(store_path);
  std::string tried;
  for (const auto& [base, leaf] : Candidates()) {
    if (base.empty()) continue;
    std::optional<dev_t> dev = DeviceOf(base);
    if (!dev) continue;
    if (store_dev && *dev == *store_dev) {
      tried += (tried.empty() ? "" : ", ") + base + " (the store's file system)";
      continue;
    }
    std::string dir = Usable(base, leaf);
    if (!dir.empty()) return dir;
    tried += (tried.empty() ? "" : ", ") + base + " (not writable)";
  }
  return Status::NotFound("no folder on another file system than the store's to keep its refused "
                          "records in (tried " + (tried.empty() ? std::string("none") : tried) +
                          "): set XDG_RUNTIME_DIR or TMPDIR to one");
}

SpillFile::SpillFile(const Env* env, std::string store_path, RunInfo run)
    : env_(env), store_path_(std::move(store_path)), run_(std::move(run)) {}

SpillFile::~SpillFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string SpillFile::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}
int64_t SpillFile::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}
int64_t SpillFile::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

Status SpillFile::OpenLocked(const std::string& why) {
  if (fd_ >= 0) return Status::Ok();
  Result<std::string> dir = SpillFolder(*env_, store_path_);
  if (!dir.ok()) return dir.status();
  std::string path = *dir + "/" + StoreLayout(store_path_).SpillName(run_.id);
  // A second spill of the run (after one drained) gets the next free name.
  for (int n = 1; ::access(path.c_str(), F_OK) == 0; ++n)
    path = *dir + "/" + StoreLayout(store_path_).SpillName(run_.id, n);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) return Status::IoError("cannot create " + path + ": " + std::strerror(errno));
  path_ = path;
  bytes_ = 0;
  json header{{"spill", kSpillFormat}, {"store", store_path_}, {"run", RunJson(run_)},
              {"why", why},          {"at", env_->UnixSeconds()}};
  return WriteLocked(header.dump(), true);
}

Status SpillFile::WriteLocked(const std::string& body, bool always) {
  std::string line = body + "\t" + Hex(Crc(body)) + "\n";
  if (!always && bytes_ + static_cast<int64_t>(line.size()) > kSpillMaxBytes)
    return Status::ResourceExhausted("the spill " + path_ + " is full");
  // One write per line (O_APPEND): a line is whole or, cut by a crash, checked out on import.
  ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()))
    return Status::IoError("cannot write " + path_ + ": " +
                           (n < 0 ? std::strerror(errno) : std::string("short write")));
  bytes_ += static_cast<int64_t>(line.size());
  return Status::Ok();
}

Status SpillFile::AddRecords(const RunRecords& r, const std::string& why) {
  if (r.empty()) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = OpenLocked(why); !s.ok()) return s;
  json j = json::object();
  for (const StepRecord& s : r.steps) j["steps"].push_back(StepEventLine(s, run_.start_time));
  for (const RunEvent& e : r.events) j["events"].push_back({e.t, e.kind, e.data});
  for (const NamedSample& s : r.samples) j["samples"].push_back({s.name, s.t, s.v});
  for (const CheckpointRecord& c : r.checkpoints)
    j["checkpoints"].push_back({{"step", c.step}, {"t", c.t}, {"path", c.path}, {"bytes", c.bytes},
                                {"stall_s", c.stall_s}, {"write_s", c.write_s}});
  int64_t count = static_cast<int64_t>(r.steps.size() + r.events.size() + r.samples.size() +
                                       r.checkpoints.size());
  // Past 3/4 of the cap the samples go first: the steps say more per byte.
  bool samples_only = r.steps.empty() && r.events.empty() && r.checkpoints.empty();
  if (samples_only && bytes_ > kSpillMaxBytes / 4 * 3) {
    dropped_ += count;
    return Status::ResourceExhausted("the spill " + path_ + " is 3/4 full: samples dropped");
  }
  Status s = WriteLocked(j.dump(), !r.checkpoints.empty());  // checkpoints: few, needed to resume
  if (s.ok())
    written_ += count;
  else
    dropped_ += count;
  return s;
}

Status SpillFile::AddSnapshots(const std::vector<Snapshot>& snapshots, const std::string& why) {
  RunRecords r;
  for (const Snapshot& s : snapshots)
    for (const auto& [name, value] : Flatten(s))
      r.samples.push_back({name, s.unix_time - run_.start_time, value});
  return AddRecords(r, why);
}

Status SpillFile::AddEnd(double end_time, std::optional<int> exit_code, const std::string& status,
                         const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = OpenLocked(why); !s.ok()) return s;
  json end{{"end_time", end_time}, {"status", status}};
  end["exit_code"] = exit_code ? json(*exit_code) : json();
  Status s = WriteLocked(json{{"end", end}}.dump(), true);
  if (s.ok()) ++written_;
  return s;
}

Status SpillFile::DrainInto(RunStore* store, int64_t* imported) {
  std::lock_guard<std::mutex> lock(mu_);
  *imported = 0;
  if (fd_ < 0) return Status::Ok();
  Result<SpillImport> got = ImportSpill(store, path_);
  if (!got.ok()) return got.status();
  *imported = got->steps + got->samples + got->events + got->checkpoints;
  ::close(fd_);
  fd_ = -1;
  ::unlink(path_.c_str());
  path_.clear();
  written_ = 0;
  return Status::Ok();
}

Result<SpillImport> ImportSpill(RunStore* store, const std::string& path) {
  Result<SpillLines> read = ReadLines(path);
  if (!read.ok()) return read.status();
  SpillLines& lines = *read;
  if (lines.lines.empty() || !lines.lines.front().contains("spill") ||
      !lines.lines.front().contains("run") || !lines.lines.front()["run"].is_object())
    return Status::InvalidArgument(
        path + " is not a fullburn spill, or its header (its first line) is damaged" +
        (lines.skipped ? " (" + lines.first_skip + ")" : std::string()) +
        ": nothing imported");
  const json& header = lines.lines.front();
  if (header.value("spill", 0) > kSpillFormat)
    return Status::InvalidArgument(path + " was written by a newer fullburn (spill format " +
                                   std::to_string(header.value("spill", 0)) + "): upgrade fullburn");
  RunInfo run = RunFromJson(header["run"]);
  SpillImport out;
  out.skipped = lines.skipped;
  out.first_skip = lines.first_skip;
  // The same run (its id, start and name) takes the records; else it is made anew.
  Result<RunInfo> same = store->GetRun(std::to_string(run.id));
  if (same.ok() && std::fabs(same->start_time - run.start_time) < 1e-3 && same->name == run.name) {
    out.run_id = run.id;
  } else {
    RunInfo made = run;
    made.status = "running";
    Result<int64_t> id = store->BeginRun(made);
    if (!id.ok()) return id.status();
    out.run_id = *id;
    out.new_run = true;
  }
  std::optional<json> end;
  for (size_t i = 1; i < lines.lines.size(); ++i) {
    const json& j = lines.lines[i];
    RunRecords r;
    if (j.contains("steps") && j["steps"].is_array())
      for (const auto& line : j["steps"]) {
        if (!line.is_string()) continue;
        auto m = ParseEventLine(line.get<std::string>(), run.start_time);
        if (m.ok() && m->is_step) r.steps.push_back(m->step);
      }
    if (j.contains("samples") && j["samples"].is_array())
      for (const auto& s : j["samples"])
        if (s.is_array() && s.size() == 3 && s[0].is_string() && s[1].is_number() && s[2].is_number())
          r.samples.push_back({s[0].get<std::string>(), s[1].get<double>(), s[2].get<double>()});
    if (j.contains("events") && j["events"].is_array())
      for (const auto& e : j["events"])
        if (e.is_array() && e.size() == 3 && e[0].is_number() && e[1].is_string() && e[2].is_string())
          r.events.push_back({e[0].get<double>(), e[1].get<std::string>(), e[2].get<std::string>()});
    if (j.contains("checkpoints") && j["checkpoints"].is_array())
      for (const auto& c : j["checkpoints"])
        if (c.is_object())
          r.checkpoints.push_back({c.value("step", int64_t{0}), c.value("t", 0.0),
                                   c.value("path", std::string()), c.value("bytes", int64_t{0}),
                                   c.value("stall_s", 0.0), c.value("write_s", 0.0)});
    if (j.contains("end") && j["end"].is_object()) end = j["end"];
    if (!r.steps.empty()) {
      if (Status s = store->AppendSteps(out.run_id, r.steps); !s.ok()) return s;
      out.steps += static_cast<int64_t>(r.steps.size());
    }
    if (!r.samples.empty()) {
      if (Status s = store->AppendNamedSamples(out.run_id, r.samples); !s.ok()) return s;
      out.samples += static_cast<int64_t>(r.samples.size());
    }
    for (const CheckpointRecord& c : r.checkpoints) {
      if (Status s = store->AddCheckpoint(out.run_id, c); !s.ok()) return s;
      ++out.checkpoints;
    }
    for (const RunEvent& e : r.events) {
      Result<bool> added = store->AddEventOnce(out.run_id, e);
      if (!added.ok()) return added.status();
      out.events += *added;
    }
  }
  if (out.samples > 0)
    if (Status s = store->CountSnapshots(out.run_id); !s.ok()) return s;
  if (end) {
    Result<RunInfo> now = store->GetRun(std::to_string(out.run_id));
    if (now.ok() && !now->end_time) {
      std::optional<int> code;
      if ((*end).contains("exit_code") && (*end)["exit_code"].is_number_integer())
        code = (*end)["exit_code"].get<int>();
      if (Status s = store->FinishRun(out.run_id, (*end).value("end_time", run.start_time), code,
                                      (*end).value("status", std::string("finished")));
          !s.ok())
        return s;
    }
    out.end = true;
  }
  return out;
}

std::vector<StoreGap> FindStoreGaps(const Env& env, const std::string& store_path, int64_t run_id) {
  std::vector<StoreGap> out;
  const std::string prefix = StoreLayout(store_path).SpillPrefix(run_id);
  for (const auto& [base, leaf] : Candidates()) {
    if (base.empty()) continue;
    std::string dir = base + "/" + leaf;
    Result<std::vector<std::string>> names = env.ListDir(dir);
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      if (name.rfind(prefix, 0) != 0) continue;
      Result<SpillLines> read = ReadLines(dir + "/" + name);
      if (!read.ok() || read->lines.empty() || !read->lines.front().contains("spill")) continue;
      const json& header = read->lines.front();
      if (header.value("store", std::string()) != store_path) continue;
      StoreGap g;
      g.spill = dir + "/" + name;
      g.why = header.value("why", std::string());
      double start = header.contains("run") ? header["run"].value("start_time", 0.0) : 0.0;
      g.from_t = INFINITY;
      g.to_t = -INFINITY;
      auto seen = [&g](double t) {
        g.from_t = std::min(g.from_t, t);
        g.to_t = std::max(g.to_t, t);
      };
      for (const json& j : read->lines) {
        if (j.contains("steps"))
          for (const auto& line : j["steps"])
            if (line.is_string())
              if (auto m = ParseEventLine(line.get<std::string>(), start); m.ok() && m->is_step)
                seen(m->step.t - m->step.step_s), seen(m->step.t);
        if (j.contains("samples"))
          for (const auto& s : j["samples"])
            if (s.is_array() && s.size() == 3 && s[1].is_number()) seen(s[1].get<double>());
        if (j.contains("events"))
          for (const auto& e : j["events"])
            if (e.is_array() && !e.empty() && e[0].is_number()) seen(e[0].get<double>());
        if (j.contains("end") && j["end"].is_object()) {
          g.end_time = j["end"].value("end_time", start);
          g.status = j["end"].value("status", std::string("finished"));
          if (j["end"].contains("exit_code") && j["end"]["exit_code"].is_number_integer())
            g.exit_code = j["end"]["exit_code"].get<int>();
          seen(*g.end_time - start);
        }
      }
      if (g.from_t <= g.to_t) out.push_back(g);
    }
  }
  return out;
}

std::string FinishRunOrKeep(RunStore* store, SpillFile* spill, int64_t run_id, double end_time,
                            std::optional<int> exit_code, const std::string& status) {
  Status s = store->FinishRun(run_id, end_time, exit_code, status);
  if (!spill) return s.ok() ? "" : "the run's end could not be stored: " + s.message() + "\n";
  std::string out;
  if (!s.ok()) {
    Status kept = spill->AddEnd(end_time, exit_code, status, s.message());
    if (!kept.ok())
      out += "the run's end could not be stored (" + s.message() + ") nor kept (" + kept.message() + ")\n";
  }
  if (spill->empty()) return out;
  std::string path = spill->path();
  int64_t imported = 0;
  if (s.ok() && spill->DrainInto(store, &imported).ok())
    return out + "the " + std::to_string(imported) + " records kept in " + path +
           " while the store refused writes are stored\n";
  out += std::to_string(spill->written()) + " records the store refused" +
         (s.ok() ? "" : ", the run's end among them,") + " are kept in " + path +
         ": once it takes writes again (or into another, with --store), fullburn runs import " + path;
  if (spill->dropped() > 0)
    out += " (" + std::to_string(spill->dropped()) + " more were dropped past its cap of " +
           std::to_string(kSpillMaxBytes >> 20) + " MiB)";
  return out + "\n";
}

}  // namespace fullburn
