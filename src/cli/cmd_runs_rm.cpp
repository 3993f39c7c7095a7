// fullburn runs rm: delete runs by id, by age or beyond the newest N, with
// their parts (a tuning's trials) and, when asked, their checkpoint files;
// give the space back to the disk with --vacuum.
//
// Nothing is deleted unless every named run exists and none is being
// recorded; a run being recorded is never picked by --older-than or --keep.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "cli.h"
#include "fullburn/store_layout.h"
#include "fullburn/report.h"
#include "fullburn/tune.h"

namespace fullburn::cli {
namespace {

struct RemoveOptions {
  CommonOptions common;
  std::vector<std::string> runs;
  std::string older_than;
  int keep = -1;
  bool checkpoints = false, dry_run = false, force = false, vacuum = false;
};

bool BeingRecorded(const RunInfo& r) { return r.status == "running"; }

// "7", "last" or "3-9" (every stored run in the range) -> run ids.
Status ResolveRef(const std::string& ref, const std::vector<RunInfo>& runs, RunStore& store,
                  std::set<int64_t>* out) {
  size_t dash = ref.find('-');
  if (dash == std::string::npos || dash == 0) {
    Result<RunInfo> r = store.GetRun(ref);
    if (!r.ok()) return r.status();
    out->insert(r->id);
    return Status::Ok();
  }
  char* end = nullptr;
  long long from = std::strtoll(ref.c_str(), &end, 10);
  long long to = end == ref.c_str() + dash ? std::strtoll(ref.c_str() + dash + 1, &end, 10) : -1;
  if (*end != '\0' || to < from)
    return Status::InvalidArgument("'" + ref + "' is not a run range: write FIRST-LAST, e.g. 3-9");
  size_t before = out->size();
  for (const RunInfo& r : runs)
    if (r.id >= from && r.id <= to) out->insert(r.id);
  if (out->size() == before)
    return Status::NotFound("no runs " + ref + " in " + store.path() +
                            ": see 'fullburn runs list'");
  return Status::Ok();
}

// The top-level runs (not a part of a stored run) that --older-than and
// --keep pick; runs being recorded are skipped and named in `skipped`.
Result<std::set<int64_t>> Filtered(const RemoveOptions& o, const std::vector<RunInfo>& runs,
                                   std::vector<int64_t>* skipped) {
  std::set<int64_t> ids;
  for (const RunInfo& r : runs) ids.insert(r.id);
  std::vector<const RunInfo*> top;
  for (const RunInfo& r : runs)
    if (!r.parent_id || !ids.count(*r.parent_id)) top.push_back(&r);
  std::sort(top.begin(), top.end(), [](auto* a, auto* b) { return a->id > b->id; });
  double cutoff = INFINITY;
  if (!o.older_than.empty()) {
    Result<double> age = ParseDuration(o.older_than);
    if (!age.ok()) return Status::InvalidArgument("--older-than: " + age.status().message());
    cutoff = static_cast<double>(std::time(nullptr)) - *age;
  }
  std::set<int64_t> out;
  for (size_t i = 0; i < top.size(); ++i) {
    const RunInfo& r = *top[i];
    if (o.keep >= 0 && i < static_cast<size_t>(o.keep)) continue;
    if (r.start_time >= cutoff) continue;
    if (BeingRecorded(r))
      skipped->push_back(r.id);
    else
      out.insert(r.id);
  }
  return out;
}

int64_t FileBytes(const std::string& path) {
  std::error_code missing;
  uintmax_t bytes = std::filesystem::file_size(path, missing);
  return missing ? 0 : static_cast<int64_t>(bytes);
}

int64_t StoreBytes(const std::string& path) { return FileBytes(path) + FileBytes(path + "-wal"); }

// The checkpoint files of the deleted runs still on disk, less those a kept
// run also recorded (a run resumed from them).
Result<std::vector<std::string>> CheckpointFiles(RunStore& store, const std::set<int64_t>& doomed,
                                                 const std::vector<RunInfo>& runs) {
  std::set<std::string> theirs, kept;
  for (const RunInfo& r : runs) {
    auto records = store.LoadCheckpoints(r.id);
    if (!records.ok()) return records.status();
    for (const CheckpointRecord& c : *records) (doomed.count(r.id) ? theirs : kept).insert(c.path);
  }
  std::vector<std::string> out;
  for (const std::string& p : theirs)
    if (!kept.count(p) && ::access(p.c_str(), F_OK) == 0) out.push_back(p);
  return out;
}

// Deletes the files, then their folders where that leaves them empty.
void DeleteCheckpointFiles(const std::vector<std::string>& files) {
  std::set<std::string> dirs;
  for (const std::string& f : files) {
    if (::unlink(f.c_str()) != 0)
      std::fprintf(stderr, "fullburn: cannot delete checkpoint %s: %s\n", f.c_str(),
                   std::strerror(errno));
    dirs.insert(std::filesystem::path(f).parent_path().string());
  }
  for (const std::string& d : dirs) ::rmdir(d.c_str());  // fails, as it should, unless empty
}

std::string Plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

int Remove(const RemoveOptions& o) {
  bool filters = !o.older_than.empty() || o.keep >= 0;
  if (o.runs.empty() && !filters && !o.vacuum)
    return Fail(
        "runs rm: name the runs (RUN ..., FIRST-LAST), or pick them with --older-than "
        "30d and/or --keep 20 (see 'fullburn runs rm --help')");
  if (!o.runs.empty() && filters)
    return Fail("runs rm: give run ids or --older-than/--keep, not both");
  auto opened = OpenStore(o.common);
  if (!opened.ok()) return Fail(opened.status().message());
  RunStore& store = **opened;
  auto runs = store.ListRuns();
  if (!runs.ok()) return Fail(runs.status().message());

  std::set<int64_t> chosen;
  std::vector<int64_t> skipped;
  for (const std::string& ref : o.runs)
    if (Status s = ResolveRef(ref, *runs, store, &chosen); !s.ok()) return Fail(s.message());
  if (filters) {
    auto picked = Filtered(o, *runs, &skipped);
    if (!picked.ok()) return Fail(picked.status().message());
    chosen = *picked;
  }
  std::set<int64_t> doomed = WithParts(chosen, *runs);
  for (const RunInfo& r : *runs) {
    if (doomed.count(r.id) && BeingRecorded(r) && !o.force)
      return Fail(fmt::format(
          "run {} \"{}\" is being recorded (recorder pid {} on {}): stop its job first, or "
          "--force if that recorder is gone; nothing was deleted",
          r.id, r.name, r.recorder_pid, r.host));
    if (o.vacuum && !doomed.count(r.id) && BeingRecorded(r))
      return Fail(fmt::format(
          "--vacuum: run {} \"{}\" is being recorded, and its recorder would fail while the store "
          "is rewritten: vacuum once it ends; nothing was deleted",
          r.id, r.name));
  }
  auto files = CheckpointFiles(store, doomed, *runs);
  if (!files.ok()) return Fail(files.status().message());
  int64_t file_bytes = 0;
  for (const std::string& f : *files) file_bytes += FileBytes(f);

  const char* verb = o.dry_run ? "would delete" : "deleted";
  for (const RunInfo& r : *runs) {
    if (!chosen.count(r.id)) continue;
    std::set<int64_t> with_parts = WithParts({r.id}, *runs);
    size_t parts = with_parts.size() - 1;
    std::printf("%s run %lld \"%s\"%s\n", verb, static_cast<long long>(r.id), r.name.c_str(),
                parts ? (" and its " + Plural(parts, "part", "parts")).c_str() : "");
    if (o.dry_run) continue;
    for (int64_t id : with_parts) {
      if (Status s = store.DeleteRun(id); !s.ok()) return Fail(s.message(), 1);
      // Its stacks are the run's record too (a profiler trace, once written,
      // is the user's file to keep: analyze reads it without the run).
      std::string stacks = StoreLayout(store.path()).Stacks(id);
      ::unlink(stacks.c_str());
      ::unlink((stacks + ".log").c_str());
    }
  }
  for (int64_t id : skipped)
    std::printf("kept run %lld: it is being recorded\n", static_cast<long long>(id));
  if (filters && chosen.empty()) std::printf("no run matches: nothing to delete\n");
  if (!files->empty()) {
    std::string what = Plural(files->size(), "checkpoint file", "checkpoint files") + " (" +
                       FormatBytes(static_cast<double>(file_bytes)) + ")";
    if (o.checkpoints && !o.dry_run) DeleteCheckpointFiles(*files);
    if (o.checkpoints)
      std::printf("%s %s\n", verb, what.c_str());
    else
      std::printf("kept their %s, e.g. %s: --checkpoints deletes them too\n", what.c_str(),
                  files->front().c_str());
  }
  if (o.dry_run) return 0;
  if (o.vacuum) {
    int64_t before = StoreBytes(store.path());
    if (Status s = store.Vacuum(); !s.ok()) return Fail(s.message(), 1);
    std::printf("store %s: %s -> %s\n", store.path().c_str(),
                FormatBytes(static_cast<double>(before)).c_str(),
                FormatBytes(static_cast<double>(StoreBytes(store.path()))).c_str());
  } else if (auto free = store.FreeBytes(); free.ok() && *free >= (1 << 20)) {
    std::printf(
        "%s free inside the store, reused by new runs: --vacuum gives it back to the disk\n",
        FormatBytes(static_cast<double>(*free)).c_str());
  }
  return 0;
}

}  // namespace

void SetupRunsRemove(CLI::App* runs) {
  auto o = std::make_shared<RemoveOptions>();
  CLI::App* rm = runs->add_subcommand(
      "rm", "Delete runs (by id, by age or all but the newest) with their samples and parts");
  rm->add_option("RUN", o->runs, "Run ids, 'last' or ranges (3-9); a tuning goes with its trials");
  rm->add_option("--older-than", o->older_than,
                 "Runs started longer ago than this (12h, 30d); never one being recorded");
  rm->add_option("--keep", o->keep, "All but the newest N runs (with --older-than: both must hold)")
      ->check(CLI::NonNegativeNumber);
  rm->add_flag("--checkpoints", o->checkpoints,
               "Also delete their checkpoint files (not those a kept run resumed from)");
  rm->add_flag("--dry-run", o->dry_run, "Print what would be deleted; change nothing");
  rm->add_flag(
      "--force", o->force,
      "Also runs still marked as being recorded (a recorder on another host that is gone)");
  rm->add_flag("--vacuum", o->vacuum,
               "Then give the freed space back to the disk (no run may be being recorded)");
  AddStoreOption(rm, &o->common);
  rm->callback([o] { ExitCode() = Remove(*o); });
}

}  // namespace fullburn::cli
