// Schema creation and migration. Each version is one SQL script applied in a
// transaction; PRAGMA user_version records the version reached, and
// application_id marks the file as a fullburn store.
#include <sqlite3.h>

#include "fullburn/store.h"

namespace fullburn {
namespace {

constexpr int kApplicationId = 0x46426E31;  // "FBn1"

const char* const kSchemaV1 = R"sql(
CREATE TABLE runs (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  name         TEXT NOT NULL,
  command      TEXT NOT NULL,           -- JSON array of argv
  cwd          TEXT NOT NULL DEFAULT '',
  host         TEXT NOT NULL DEFAULT '',
  start_time   REAL NOT NULL,           -- Unix seconds
  end_time     REAL,
  exit_code    INTEGER,
  status       TEXT NOT NULL,           -- running | finished | failed_to_start | detached
  recorder_pid INTEGER NOT NULL DEFAULT 0,
  interval_s   REAL NOT NULL DEFAULT 1.0,
  config       TEXT NOT NULL DEFAULT '{}',
  gpus         TEXT NOT NULL DEFAULT '[]',
  samples      INTEGER NOT NULL DEFAULT 0   -- snapshots stored
);
CREATE TABLE metrics (
  id   INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  unit TEXT NOT NULL DEFAULT ''
);
CREATE TABLE samples (
  run_id    INTEGER NOT NULL,
  metric_id INTEGER NOT NULL,
  t         REAL NOT NULL,               -- seconds since runs.start_time
  value     REAL NOT NULL,
  PRIMARY KEY (run_id, metric_id, t)
) WITHOUT ROWID;
)sql";

// v2: what `fullburn train` records besides telemetry.
const char* const kSchemaV2 = R"sql(
CREATE TABLE steps (
  run_id      INTEGER NOT NULL,
  rank        INTEGER NOT NULL DEFAULT 0,
  step        INTEGER NOT NULL,
  epoch       INTEGER NOT NULL,
  t           REAL NOT NULL,          -- seconds since runs.start_time, step end
  loss        REAL,                   -- NULL when not finite
  lr          REAL NOT NULL,
  loss_scale  REAL,
  samples     INTEGER NOT NULL,
  step_s      REAL NOT NULL,
  data_wait_s REAL, h2d_s REAL, forward_s REAL, backward_s REAL, optimizer_s REAL, comm_s REAL,
  skipped     INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, rank, step)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
  run_id  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  t       REAL NOT NULL,
  path    TEXT NOT NULL,
  bytes   INTEGER NOT NULL,
  stall_s REAL NOT NULL,
  write_s REAL NOT NULL,
  PRIMARY KEY (run_id, step)
);
CREATE TABLE events (
  run_id INTEGER NOT NULL,
  t      REAL NOT NULL,
  kind   TEXT NOT NULL,
  data   TEXT NOT NULL DEFAULT '{}'   -- JSON object
);
CREATE INDEX events_by_run ON events (run_id, t);
)sql";

// v3: a run can belong to another (a tuner's trials to their tuning).
const char* const kSchemaV3 = R"sql(
ALTER TABLE runs ADD COLUMN parent_id INTEGER;  -- NULL: a run of its own
CREATE INDEX runs_by_parent ON runs (parent_id);
)sql";

// v4: a running job's new steps found without reading all of its steps
// (fullburn serve polls them every second).
const char* const kSchemaV4 = R"sql(
CREATE INDEX steps_by_time ON steps (run_id, t);
)sql";
// v5: the recorder's own start, so its pid names one process (GpuHolders).
const char* const kSchemaV5 = R"sql(
ALTER TABLE runs ADD COLUMN recorder_start REAL;  -- Unix seconds; NULL: not recorded
)sql";
// Script i takes the store from version i to version i + 1.
const char* const kMigrations[] = {kSchemaV1, kSchemaV2, kSchemaV3, kSchemaV4, kSchemaV5};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kSchemaVersion);

}  // namespace

Status RunStore::Migrate() {
  sqlite3_stmt* st = nullptr;
  int version = 0, app_id = 0, tables = 0;
  auto scalar = [&](const char* sql, int* out) -> bool {
    if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return false;
    bool ok = sqlite3_step(st) == SQLITE_ROW;
    if (ok) *out = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return ok;
  };
  // One read transaction, so the three values come from one snapshot: read
  // one by one, another process's migration could commit between them and
  // its tables, without its application id, would read as a foreign file.
  if (Status s = Exec("BEGIN"); !s.ok()) return s;
  bool read = scalar("PRAGMA user_version", &version) && scalar("PRAGMA application_id", &app_id) &&
              scalar("SELECT count(*) FROM sqlite_master", &tables);
  Status read_error = read ? Status::Ok() : SqlError("cannot read");
  Exec("COMMIT");
  if (!read) return read_error;
  if (app_id != kApplicationId && tables > 0)
    return Status::Corruption(path_ +
                              " is an SQLite file but not a fullburn run store: pass --store with "
                              "another path (the file was left untouched)");
  if (version > kSchemaVersion)
    return Status::InvalidArgument(path_ + " has store schema v" + std::to_string(version) +
                                   ", newer than this fullburn (v" +
                                   std::to_string(kSchemaVersion) + "): upgrade fullburn");
  if (version == kSchemaVersion) return Status::Ok();
  if (Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  // Read again inside the write lock: another process may have migrated.
  if (!scalar("PRAGMA user_version", &version)) {
    Exec("ROLLBACK");
    return SqlError("cannot read");
  }
  if (version == kSchemaVersion) return Exec("COMMIT");
  Status s = Status::Ok();
  for (int v = version; v < kSchemaVersion && s.ok(); ++v) s = Exec(kMigrations[v]);
  if (s.ok()) s = Exec(("PRAGMA application_id = " + std::to_string(kApplicationId)).c_str());
  if (s.ok()) s = Exec(("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str());
  if (!s.ok()) {
    Exec("ROLLBACK");
    return s;
  }
  return Exec("COMMIT");
}

}  // namespace fullburn
