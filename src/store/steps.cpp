// The training tables of the run store (schema v2): steps, checkpoints, events.
#include <sqlite3.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "fullburn/spill.h"
#include "fullburn/store.h"
#include "sqlite_util.h"

namespace fullburn {
namespace {

// Infinity is a REAL to SQLite (a diverged loss keeps its sign); NaN is NULL.
void BindOptional(sqlite3_stmt* st, int col, const std::optional<double>& v) {
  if (v && !std::isnan(*v))
    sqlite3_bind_double(st, col, *v);
  else
    sqlite3_bind_null(st, col);
}

std::optional<double> ColumnOptional(sqlite3_stmt* st, int col) {
  if (sqlite3_column_type(st, col) == SQLITE_NULL) return std::nullopt;
  return sqlite3_column_double(st, col);
}

// Prepared statement that finalizes itself.
struct Statement {
  sqlite3_stmt* st = nullptr;
  ~Statement() { sqlite3_finalize(st); }
};

}  // namespace

Status RunStore::AppendSteps(int64_t run_id, const std::vector<StepRecord>& steps) {
  if (steps.empty()) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = StillThere(); !s.ok()) return s;
  Statement ins;
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO steps (run_id, rank, step, epoch, t, loss, lr, "
                         "loss_scale, samples, step_s, data_wait_s, h2d_s, forward_s, backward_s, "
                         "optimizer_s, comm_s, skipped) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &ins.st, nullptr) != SQLITE_OK)
    return SqlError("cannot write steps");
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  for (const StepRecord& r : steps) {
    sqlite3_reset(ins.st);
    sqlite3_bind_int64(ins.st, 1, run_id);
    sqlite3_bind_int(ins.st, 2, r.rank);
    sqlite3_bind_int64(ins.st, 3, r.step);
    sqlite3_bind_int(ins.st, 4, r.epoch);
    sqlite3_bind_double(ins.st, 5, r.t);
    BindOptional(ins.st, 6, r.loss);
    sqlite3_bind_double(ins.st, 7, r.lr);
    BindOptional(ins.st, 8, r.loss_scale);
    sqlite3_bind_int64(ins.st, 9, r.samples);
    sqlite3_bind_double(ins.st, 10, r.step_s);
    BindOptional(ins.st, 11, r.data_wait_s);
    BindOptional(ins.st, 12, r.h2d_s);
    BindOptional(ins.st, 13, r.forward_s);
    BindOptional(ins.st, 14, r.backward_s);
    BindOptional(ins.st, 15, r.optimizer_s);
    BindOptional(ins.st, 16, r.comm_s);
    sqlite3_bind_int(ins.st, 17, r.skipped ? 1 : 0);
    if (sqlite3_step(ins.st) != SQLITE_DONE) {
      Status s = SqlError("cannot write steps");
      Exec("ROLLBACK");
      return s;
    }
  }
  return Exec("COMMIT");
}

Result<std::vector<StepRecord>> RunStore::LoadSteps(int64_t run_id, double after) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q;
  // The whole run in primary-key order; the steps after `after` through the
  // time index (a poller's few new ones, sorted after).
  const bool whole = std::isinf(after);
  std::string sql =
      "SELECT rank, step, epoch, t, loss, lr, loss_scale, samples, step_s, data_wait_s, h2d_s, "
      "forward_s, backward_s, optimizer_s, comm_s, skipped FROM steps ";
  sql += whole ? "WHERE run_id = ? ORDER BY rank, step"
               : "INDEXED BY steps_by_time WHERE run_id = ? AND t > ? ORDER BY rank, step";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q.st, nullptr) != SQLITE_OK)
    return SqlError("cannot read steps");
  sqlite3_bind_int64(q.st, 1, run_id);
  if (!whole) sqlite3_bind_double(q.st, 2, after);
  std::vector<StepRecord> out;
  int rc;
  while ((rc = sqlite3_step(q.st)) == SQLITE_ROW) {
    StepRecord r;
    r.rank = sqlite3_column_int(q.st, 0);
    r.step = sqlite3_column_int64(q.st, 1);
    r.epoch = sqlite3_column_int(q.st, 2);
    r.t = sqlite3_column_double(q.st, 3);
    r.loss = ColumnOptional(q.st, 4).value_or(NAN);
    r.lr = sqlite3_column_double(q.st, 5);
    r.loss_scale = ColumnOptional(q.st, 6);
    r.samples = sqlite3_column_int64(q.st, 7);
    r.step_s = sqlite3_column_double(q.st, 8);
    r.data_wait_s = ColumnOptional(q.st, 9);
    r.h2d_s = ColumnOptional(q.st, 10);
    r.forward_s = ColumnOptional(q.st, 11);
    r.backward_s = ColumnOptional(q.st, 12);
    r.optimizer_s = ColumnOptional(q.st, 13);
    r.comm_s = ColumnOptional(q.st, 14);
    r.skipped = sqlite3_column_int(q.st, 15) != 0;
    out.push_back(r);
  }
  if (rc != SQLITE_DONE) return SqlError("cannot read steps");
  return out;
}

Status RunStore::AddCheckpoint(int64_t run_id, const CheckpointRecord& c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = StillThere(); !s.ok()) return s;
  Statement ins;
  if (sqlite3_prepare_v2(
          db_,
          "INSERT OR REPLACE INTO checkpoints (run_id, step, t, path, bytes, stall_s, "
          "write_s) VALUES (?,?,?,?,?,?,?)",
          -1, &ins.st, nullptr) != SQLITE_OK)
    return SqlError("cannot record a checkpoint");
  sqlite3_bind_int64(ins.st, 1, run_id);
  sqlite3_bind_int64(ins.st, 2, c.step);
  sqlite3_bind_double(ins.st, 3, c.t);
  sqlite3_bind_text(ins.st, 4, c.path.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(ins.st, 5, c.bytes);
  sqlite3_bind_double(ins.st, 6, c.stall_s);
  sqlite3_bind_double(ins.st, 7, c.write_s);
  return sqlite3_step(ins.st) == SQLITE_DONE ? Status::Ok()
                                             : SqlError("cannot record a checkpoint");
}

Result<std::vector<CheckpointRecord>> RunStore::LoadCheckpoints(int64_t run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q;
  if (sqlite3_prepare_v2(db_,
                         "SELECT step, t, path, bytes, stall_s, write_s FROM checkpoints "
                         "WHERE run_id = ? ORDER BY step",
                         -1, &q.st, nullptr) != SQLITE_OK)
    return SqlError("cannot read checkpoints");
  sqlite3_bind_int64(q.st, 1, run_id);
  std::vector<CheckpointRecord> out;
  int rc;
  while ((rc = sqlite3_step(q.st)) == SQLITE_ROW)
    out.push_back({sqlite3_column_int64(q.st, 0), sqlite3_column_double(q.st, 1),
                   ColumnText(q.st, 2), sqlite3_column_int64(q.st, 3),
                   sqlite3_column_double(q.st, 4), sqlite3_column_double(q.st, 5)});
  if (rc != SQLITE_DONE) return SqlError("cannot read checkpoints");
  return out;
}

Status RunStore::AddEvent(int64_t run_id, const RunEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = StillThere(); !s.ok()) return s;
  Statement ins;
  if (sqlite3_prepare_v2(db_, "INSERT INTO events (run_id, t, kind, data) VALUES (?,?,?,?)", -1,
                         &ins.st, nullptr) != SQLITE_OK)
    return SqlError("cannot record an event");
  sqlite3_bind_int64(ins.st, 1, run_id);
  sqlite3_bind_double(ins.st, 2, e.t);
  sqlite3_bind_text(ins.st, 3, e.kind.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(ins.st, 4, e.data.c_str(), -1, SQLITE_TRANSIENT);
  return sqlite3_step(ins.st) == SQLITE_DONE ? Status::Ok() : SqlError("cannot record an event");
}

Result<bool> RunStore::AddEventOnce(int64_t run_id, const RunEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement ins;
  if (sqlite3_prepare_v2(db_,
                         "INSERT INTO events (run_id, t, kind, data) SELECT ?1, ?2, ?3, ?4 WHERE NOT "
                         "EXISTS (SELECT 1 FROM events WHERE run_id = ?1 AND t = ?2 AND kind = ?3 "
                         "AND data = ?4)",
                         -1, &ins.st, nullptr) != SQLITE_OK)
    return SqlError("cannot record an event");
  sqlite3_bind_int64(ins.st, 1, run_id);
  sqlite3_bind_double(ins.st, 2, e.t);
  sqlite3_bind_text(ins.st, 3, e.kind.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(ins.st, 4, e.data.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(ins.st) != SQLITE_DONE) return SqlError("cannot record an event");
  return sqlite3_changes(db_) > 0;
}

Status RunStore::CountSnapshots(int64_t run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement up;
  if (sqlite3_prepare_v2(db_,
                         "UPDATE runs SET samples = max(samples, (SELECT count(DISTINCT t) FROM "
                         "samples WHERE run_id = ?1)) WHERE id = ?1",
                         -1, &up.st, nullptr) != SQLITE_OK)
    return SqlError("cannot count the snapshots");
  sqlite3_bind_int64(up.st, 1, run_id);
  return sqlite3_step(up.st) == SQLITE_DONE ? Status::Ok() : SqlError("cannot count the snapshots");
}

Result<std::vector<RunEvent>> RunStore::LoadEvents(int64_t run_id, double after) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement q;
  if (sqlite3_prepare_v2(db_,
                         "SELECT t, kind, data FROM events WHERE run_id = ? AND t > ? "
                         "ORDER BY t, rowid",
                         -1, &q.st, nullptr) != SQLITE_OK)
    return SqlError("cannot read events");
  sqlite3_bind_int64(q.st, 1, run_id);
  sqlite3_bind_double(q.st, 2, std::isinf(after) ? -1e300 : after);
  std::vector<RunEvent> out;
  int rc;
  while ((rc = sqlite3_step(q.st)) == SQLITE_ROW)
    out.push_back({sqlite3_column_double(q.st, 0), ColumnText(q.st, 1), ColumnText(q.st, 2)});
  if (rc != SQLITE_DONE) return SqlError("cannot read events");
  return out;
}

}  // namespace fullburn

namespace fullburn {

Result<RunData> RunStore::LoadRun(const std::string& ref) {
  RunData d;
  Result<RunInfo> run = GetRun(ref);
  if (!run.ok()) return run.status();
  d.run = *run;
  Result<std::map<std::string, Series>> samples = LoadSamples(d.run.id);
  if (!samples.ok()) return samples.status();
  d.samples = std::move(*samples);
  Result<std::vector<StepRecord>> steps = LoadSteps(d.run.id);
  if (!steps.ok()) return steps.status();
  d.steps = std::move(*steps);
  Result<std::vector<CheckpointRecord>> checkpoints = LoadCheckpoints(d.run.id);
  if (!checkpoints.ok()) return checkpoints.status();
  d.checkpoints = std::move(*checkpoints);
  Result<std::vector<RunEvent>> events = LoadEvents(d.run.id);
  if (!events.ok()) return events.status();
  d.events = std::move(*events);
  // What the store refused and a spill still holds: a stretch the run's
  // records lack, which the diagnosis must not read as idle.
  for (const StoreGap& g : FindStoreGaps(*Env::Default(), path_, d.run.id))
    d.events.push_back({g.from_t, kStoreGapEvent,
                        nlohmann::json{{"to", g.to_t}, {"why", g.why}, {"spill", g.spill}}.dump()});
  return d;
}

namespace {

// Drops the oldest past `max`; returns how many went.
template <typename T>
int64_t DropOldest(std::vector<T>* kept, size_t max) {
  if (kept->size() <= max) return 0;
  size_t extra = kept->size() - max;
  kept->erase(kept->begin(), kept->begin() + static_cast<std::ptrdiff_t>(extra));
  return static_cast<int64_t>(extra);
}

}  // namespace

void RunRecords::Append(RunRecords more) {
  auto move_to = [](auto* to, auto* from) {
    if (to->empty()) {
      to->swap(*from);
      return;
    }
    to->insert(to->end(), std::make_move_iterator(from->begin()),
               std::make_move_iterator(from->end()));
  };
  move_to(&steps, &more.steps);
  move_to(&events, &more.events);
  move_to(&samples, &more.samples);
  move_to(&checkpoints, &more.checkpoints);
}

void RecordWriter::Add(RunRecords more) {
  kept_.Append(std::move(more));
  dropped_ += DropOldest(&kept_.steps, max_kept_) + DropOldest(&kept_.events, max_kept_) +
              DropOldest(&kept_.samples, max_kept_);
}

bool RecordWriter::SpillKept(SpillFile* spill, const std::string& why) {
  if (kept_.empty()) return true;
  // A full spill counts what it drops: those are gone either way.
  Status s = spill->AddRecords(kept_, why);
  if (!s.ok() && s.code() != Status::Code::kResourceExhausted) return false;
  kept_ = RunRecords();
  return true;
}

Status RecordWriter::Flush() {
  // One at a time, so a refusal keeps only those not yet written.
  while (!kept_.checkpoints.empty()) {
    if (Status s = store_->AddCheckpoint(run_id_, kept_.checkpoints.front()); !s.ok()) return s;
    kept_.checkpoints.erase(kept_.checkpoints.begin());
  }
  if (!kept_.steps.empty()) {
    if (Status s = store_->AppendSteps(run_id_, kept_.steps); !s.ok()) return s;
    kept_.steps.clear();
  }
  if (!kept_.samples.empty()) {
    if (Status s = store_->AppendNamedSamples(run_id_, kept_.samples); !s.ok()) return s;
    kept_.samples.clear();
  }
  std::vector<RunEvent>& events = kept_.events;
  size_t written = 0;
  Status s = Status::Ok();
  while (written < events.size() && (s = store_->AddEvent(run_id_, events[written])).ok())
    ++written;
  events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(written));
  return s;
}

}  // namespace fullburn
