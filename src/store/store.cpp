#include "fullburn/store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "fullburn/spill.h"
#include "fullburn/store_layout.h"
#include "sqlite_util.h"

namespace fullburn {
namespace {

std::string HostName() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// A run left "running" by a recorder on this host that no longer exists was
// interrupted (the recorder was killed), unless the store refused its end,
// which then waits in a spill (spill.h): report it so.
void FixStatus(RunInfo* r, const std::string& store_path) {
  if (r->status != "running" || r->recorder_pid <= 0 || r->host != HostName()) return;
  if (::kill(r->recorder_pid, 0) == 0 || errno != ESRCH) return;
  r->status = "interrupted";
  for (const StoreGap& g : FindStoreGaps(*Env::Default(), store_path, r->id))
    if (g.end_time) {
      r->end_time = g.end_time;
      r->exit_code = g.exit_code;
      r->status = g.status;
    }
}

}  // namespace

std::string RunStore::DefaultPath() {
  std::string base;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) {
    base = x;
  } else {
    const char* home = std::getenv("HOME");
    base = std::string(home && *home ? home : ".") + "/.local/share";
  }
  return base + "/fullburn/runs.db";
}

Result<std::unique_ptr<RunStore>> RunStore::Open(const std::string& path) {
  std::string dir = StoreLayout(path).folder();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::NotFound("store directory " + dir +
                            " does not exist: create it or pass --store with another path");
  std::unique_ptr<RunStore> store(new RunStore());
  store->path_ = path;
  int rc = sqlite3_open_v2(path.c_str(), &store->db_,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK)
    return Status::IoError("cannot open the run store " + path + ": " +
                           (store->db_ ? sqlite3_errmsg(store->db_) : sqlite3_errstr(rc)) +
                           "; check that the directory is writable or pass --store");
  sqlite3_busy_timeout(store->db_, 5000);
  // journal_mode is the first statement that reads the file: a corrupt or
  // foreign file fails here, before anything is written to it.
  if (Status s = store->SwitchToWal(); !s.ok()) {
    if (sqlite3_errcode(store->db_) == SQLITE_NOTADB || sqlite3_errcode(store->db_) == SQLITE_CORRUPT)
      return Status::Corruption(path + " is not a fullburn run store or is corrupt (" +
                                sqlite3_errmsg(store->db_) +
                                "): move it aside or pass --store with another path; it was left "
                                "untouched");
    return s;
  }
  if (Status s = store->Exec("PRAGMA synchronous=NORMAL"); !s.ok()) return s;
  if (Status s = store->Migrate(); !s.ok()) return s;
  if (::stat(path.c_str(), &st) == 0) {
    store->file_dev_ = static_cast<uint64_t>(st.st_dev);
    store->file_ino_ = static_cast<uint64_t>(st.st_ino);
  }
  return store;
}

Status RunStore::StillThere() {
  if (file_ino_ == 0) return Status::Ok();
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0)
    return Status::IoError("the run store " + path_ + " was deleted while recording (" +
                           std::strerror(errno) + "): writes to it would be lost");
  if (static_cast<uint64_t>(st.st_ino) != file_ino_ || static_cast<uint64_t>(st.st_dev) != file_dev_)
    return Status::IoError("the run store " + path_ +
                           " was replaced by another file while recording: writes to the one "
                           "opened would be lost");
  return Status::Ok();
}

// Switching a new file to WAL takes an exclusive lock, and SQLite answers
// SQLITE_BUSY at once, without the busy handler, when another process is
// opening the same new file (two ranks starting together). Retry until the
// busy timeout instead of failing the run.
Status RunStore::SwitchToWal() {
  constexpr int kRetryMs = 10, kTimeoutMs = 5000;
  for (int waited = 0;; waited += kRetryMs) {
    Status s = Exec("PRAGMA journal_mode=WAL");
    if (s.ok() || sqlite3_errcode(db_) != SQLITE_BUSY || waited >= kTimeoutMs) return s;
    ::usleep(kRetryMs * 1000);
  }
}

RunStore::~RunStore() {
  if (insert_sample_) sqlite3_finalize(insert_sample_);
  if (db_) sqlite3_close_v2(db_);
}

Status RunStore::SqlError(const std::string& what) {
  int code = sqlite3_errcode(db_);
  std::string msg = "run store " + path_ + ": " + what + ": " + sqlite3_errmsg(db_);
  if (code == SQLITE_READONLY || code == SQLITE_CANTOPEN || code == SQLITE_PERM) {
    // SQLite's WAL needs its -shm and -wal beside the file even to read.
    std::string folder = StoreLayout(path_).folder();
    if (::access(folder.c_str(), W_OK) != 0)
      msg += " (its folder " + folder + " is not writable: " + std::strerror(errno) + ")";
    return Status::IoError(msg + "; check that the file and its directory are writable or pass --store");
  }
  if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)
    return Status::Corruption(msg + "; move the file aside or pass --store with another path");
  if (code == SQLITE_FULL) return Status::IoError(msg + "; free disk space");
  return Status::IoError(msg);
}

Status RunStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) == SQLITE_OK) return Status::Ok();
  sqlite3_free(err);
  return SqlError("cannot write");
}

Result<int64_t> RunStore::BeginRun(const RunInfo& run) {
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "INSERT INTO runs (name, command, cwd, host, start_time, status, recorder_pid, interval_s, "
      "config, gpus, parent_id, recorder_start) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)";
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return SqlError("cannot add a run");
  std::string cmd = nlohmann::json(run.command).dump();
  std::string host = run.host.empty() ? HostName() : run.host;
  sqlite3_bind_text(st, 1, run.name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, cmd.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 3, run.cwd.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 4, host.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(st, 5, run.start_time);
  sqlite3_bind_text(st, 6, run.status.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(st, 7, run.recorder_pid);
  sqlite3_bind_double(st, 8, run.interval_s);
  sqlite3_bind_text(st, 9, run.config_json.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 10, run.gpus_json.c_str(), -1, SQLITE_TRANSIENT);
  if (run.parent_id)
    sqlite3_bind_int64(st, 11, *run.parent_id);
  else
    sqlite3_bind_null(st, 11);
  std::optional<double> recorder_start = run.recorder_start;
  if (!recorder_start && run.recorder_pid == static_cast<int>(::getpid()))
    recorder_start = ProcessStartTime(*Env::Default(), run.recorder_pid);
  if (recorder_start)
    sqlite3_bind_double(st, 12, *recorder_start);
  else
    sqlite3_bind_null(st, 12);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return SqlError("cannot add a run");
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Result<int64_t> RunStore::MetricId(const std::string& name) {
  auto it = metric_ids_.find(name);
  if (it != metric_ids_.end()) return it->second;
  const MetricDef* def = FindMetric(name);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "INSERT OR IGNORE INTO metrics (name, unit) VALUES (?, ?)", -1, &st, nullptr);
  sqlite3_bind_text(st, 1, name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, def ? def->unit : "", -1, SQLITE_STATIC);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return SqlError("cannot add a metric");
  sqlite3_prepare_v2(db_, "SELECT id FROM metrics WHERE name = ?", -1, &st, nullptr);
  sqlite3_bind_text(st, 1, name.c_str(), -1, SQLITE_TRANSIENT);
  int64_t id = -1;
  if (sqlite3_step(st) == SQLITE_ROW) id = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  if (id < 0) return SqlError("cannot read a metric");
  metric_ids_[name] = id;
  return id;
}

Status RunStore::AppendSamples(int64_t run_id, double run_start, const std::vector<Snapshot>& batch) {
  std::vector<NamedSample> named;
  int64_t snapshots = 0;
  for (const Snapshot& snap : batch) {
    // Other ranks' samples (their process trees, other nodes' hosts) are part
    // of rank 0's snapshot count, not snapshots of their own.
    if (snap.rank == 0) ++snapshots;
    for (const auto& [name, value] : Flatten(snap)) named.push_back({name, snap.unix_time - run_start, value});
  }
  return AppendNamedSamples(run_id, named, snapshots);
}

Status RunStore::AppendNamedSamples(int64_t run_id, const std::vector<NamedSample>& samples, int64_t snapshots) {
  if (samples.empty() && snapshots == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = StillThere(); !s.ok()) return s;
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  auto roll_back = [this](Status s) {
    Exec("ROLLBACK");
    metric_ids_.clear();  // ids added in the rolled-back transaction are gone
    return s;
  };
  if (!insert_sample_ &&
      sqlite3_prepare_v2(
          db_, "INSERT OR REPLACE INTO samples (run_id, metric_id, t, value) VALUES (?,?,?,?)", -1,
          &insert_sample_, nullptr) != SQLITE_OK)
    return roll_back(SqlError("cannot write samples"));
  for (const NamedSample& sample : samples) {
    Result<int64_t> id = MetricId(sample.name);
    if (!id.ok()) return roll_back(id.status());
    sqlite3_reset(insert_sample_);
    sqlite3_bind_int64(insert_sample_, 1, run_id);
    sqlite3_bind_int64(insert_sample_, 2, *id);
    sqlite3_bind_double(insert_sample_, 3, sample.t);
    sqlite3_bind_double(insert_sample_, 4, sample.v);
    if (sqlite3_step(insert_sample_) != SQLITE_DONE)
      return roll_back(SqlError("cannot write samples"));
  }
  std::string count = "UPDATE runs SET samples = samples + " + std::to_string(snapshots) +
                      " WHERE id = " + std::to_string(run_id);
  Status s = Exec(count.c_str());
  if (s.ok()) s = Exec("COMMIT");
  return s.ok() ? s : roll_back(s);
}

Status RunStore::FinishRun(int64_t run_id, double end_time, std::optional<int> exit_code,
                           const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = StillThere(); !s.ok()) return s;
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db_, "UPDATE runs SET end_time = ?, exit_code = ?, status = ? WHERE id = ?", -1,
                     &st, nullptr);
  sqlite3_bind_double(st, 1, end_time);
  if (exit_code)
    sqlite3_bind_int(st, 2, *exit_code);
  else
    sqlite3_bind_null(st, 2);
  sqlite3_bind_text(st, 3, status.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 4, run_id);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? Status::Ok() : SqlError("cannot finish the run");
}

Result<std::vector<RunInfo>> RunStore::QueryRuns(const std::string& where, int64_t id) {
  std::string sql =
      "SELECT id, name, command, cwd, host, start_time, end_time, exit_code, status, recorder_pid, "
      "interval_s, config, gpus, samples, parent_id, recorder_start "
      "FROM runs " + where;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK)
    return SqlError("cannot read runs");
  if (id >= 0) sqlite3_bind_int64(st, 1, id);
  std::vector<RunInfo> runs;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    RunInfo r;
    r.id = sqlite3_column_int64(st, 0);
    r.name = ColumnText(st, 1);
    auto cmd = nlohmann::json::parse(ColumnText(st, 2), nullptr, false);
    if (cmd.is_array())
      for (const auto& a : cmd)
        if (a.is_string()) r.command.push_back(a.get<std::string>());
    r.cwd = ColumnText(st, 3);
    r.host = ColumnText(st, 4);
    r.start_time = sqlite3_column_double(st, 5);
    if (sqlite3_column_type(st, 6) != SQLITE_NULL) r.end_time = sqlite3_column_double(st, 6);
    if (sqlite3_column_type(st, 7) != SQLITE_NULL) r.exit_code = sqlite3_column_int(st, 7);
    r.status = ColumnText(st, 8);
    r.recorder_pid = sqlite3_column_int(st, 9);
    r.interval_s = sqlite3_column_double(st, 10);
    r.config_json = ColumnText(st, 11);
    r.gpus_json = ColumnText(st, 12);
    r.sample_count = sqlite3_column_int64(st, 13);
    if (sqlite3_column_type(st, 14) != SQLITE_NULL) r.parent_id = sqlite3_column_int64(st, 14);
    if (sqlite3_column_type(st, 15) != SQLITE_NULL) r.recorder_start = sqlite3_column_double(st, 15);
    FixStatus(&r, path_);
    runs.push_back(std::move(r));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return SqlError("cannot read runs");
  return runs;
}

Result<std::vector<RunInfo>> RunStore::ListRuns() {
  std::lock_guard<std::mutex> lock(mu_);
  return QueryRuns("ORDER BY id", -1);
}

Result<std::vector<RunInfo>> RunStore::ListRunning() {
  std::lock_guard<std::mutex> lock(mu_);
  Result<std::vector<RunInfo>> runs = QueryRuns("WHERE status = 'running' ORDER BY id", -1);
  if (!runs.ok()) return runs;
  std::vector<RunInfo> alive;  // a dead recorder's run reads "interrupted"
  for (RunInfo& r : *runs)
    if (r.status == "running") alive.push_back(std::move(r));
  return alive;
}

Result<RunInfo> RunStore::GetRun(const std::string& ref) {
  std::lock_guard<std::mutex> lock(mu_);
  Result<std::vector<RunInfo>> runs = Status::NotFound("");
  if (ref == "last") {
    runs = QueryRuns("ORDER BY id DESC LIMIT 1", -1);
  } else {
    char* end = nullptr;
    long long id = std::strtoll(ref.c_str(), &end, 10);
    if (ref.empty() || *end != '\0' || id < 0)
      return Status::InvalidArgument("'" + ref + "' is not a run id: give a number from 'fullburn runs list' or 'last'");
    runs = QueryRuns("WHERE id = ?", id);
  }
  if (!runs.ok()) return runs.status();
  if (runs->empty())
    return Status::NotFound(ref == "last" ? "the store " + path_ + " has no runs yet"
                                          : "no run " + ref + " in " + path_ + ": see 'fullburn runs list'");
  return runs->front();
}

Result<std::map<std::string, Series>> RunStore::LoadSamples(int64_t run_id, double after) {
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  // Metric by metric (CROSS JOIN fixes that order), each a range of the
  // primary key (run_id, metric_id, t): the readings after `after` are found
  // without reading the run's older ones.
  const char* sql =
      "SELECT m.name, s.t, s.value FROM metrics m CROSS JOIN samples s "
      "WHERE s.run_id = ? AND s.metric_id = m.id AND s.t > ? ORDER BY m.name, s.t";
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return SqlError("cannot read samples");
  sqlite3_bind_int64(st, 1, run_id);
  sqlite3_bind_double(st, 2, std::isinf(after) ? -1e300 : after);
  std::map<std::string, Series> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out[ColumnText(st, 0)].push_back({sqlite3_column_double(st, 1), sqlite3_column_double(st, 2)});
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return SqlError("cannot read samples");
  return out;
}

Status RunStore::DeleteRun(int64_t run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = std::to_string(run_id);
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  Status s = Status::Ok();
  for (const char* table : {"samples", "steps", "checkpoints", "events"})
    if (s.ok()) s = Exec(("DELETE FROM " + std::string(table) + " WHERE run_id = " + id).c_str());
  if (s.ok()) s = Exec(("DELETE FROM runs WHERE id = " + id).c_str());
  if (!s.ok()) {
    Exec("ROLLBACK");
    return s;
  }
  return Exec("COMMIT");
}

Result<int64_t> RunStore::FreeBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t values[2] = {0, 0};
  const char* pragmas[2] = {"PRAGMA freelist_count", "PRAGMA page_size"};
  for (int i = 0; i < 2; ++i) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, pragmas[i], -1, &st, nullptr) != SQLITE_OK)
      return SqlError("cannot read the free pages");
    if (sqlite3_step(st) == SQLITE_ROW) values[i] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  return values[0] * values[1];
}

Status RunStore::Vacuum() {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = Exec("VACUUM"); !s.ok()) return s;
  // The WAL file holds the rewritten pages until a checkpoint moves them.
  return Exec("PRAGMA wal_checkpoint(TRUNCATE)");
}

Result<std::string> RunStore::IntegrityCheck() {
  std::lock_guard<std::mutex> lock(mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "PRAGMA integrity_check", -1, &st, nullptr) != SQLITE_OK)
    return SqlError("cannot check");
  std::string out;
  while (sqlite3_step(st) == SQLITE_ROW) out += (out.empty() ? "" : "; ") + ColumnText(st, 0);
  sqlite3_finalize(st);
  return out;
}

Status BatchWriter::Add(const Snapshot& s) {
  pending_.push_back(s);
  // A store that stays unwritable past keep_s costs its oldest samples
  // rather than this process's memory.
  size_t old = 0;
  while (old < pending_.size() && pending_[old].mono_time < s.mono_time - keep_s_) ++old;
  if (old) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(old));
    dropped_ += static_cast<int64_t>(old);
  }
  if (s.mono_time - last_flush_ >= flush_every_s_ - 1e-6) {
    last_flush_ = s.mono_time;
    return Flush();
  }
  return last_error_;
}

Status BatchWriter::Flush(bool last) {
  if (pending_.empty()) return last_error_ = Status::Ok();
  last_error_ = store_->AppendSamples(run_id_, run_start_, pending_);
  if (last_error_.ok()) {
    pending_.clear();
    return last_error_;
  }
  // Else kept, and written with the next batch; refused for long enough
  // (or at the end), they go to the spill instead of waiting in memory.
  bool long_enough = pending_.back().mono_time - pending_.front().mono_time >= kSpillAfterS;
  if (spill_ && (last || long_enough)) {
    Status s = spill_->AddSnapshots(pending_, last_error_.message());
    if (s.ok()) spilled_ += static_cast<int64_t>(pending_.size());
    if (s.ok() || s.code() == Status::Code::kResourceExhausted) pending_.clear();  // a full spill counts them
  }
  return last_error_;
}

}  // namespace fullburn
