// Several files: one per rank, read one after another (each is freed once
// analysed), then compared: are they one run, and which rank straggles.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "internal.h"

namespace fullburn {
namespace {

namespace fs = std::filesystem;


bool IsTraceName(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".json") || ends(".json.gz");
}

// Files as given; a folder's trace files by name.
Result<std::vector<std::string>> ExpandPaths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      files.push_back(p);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(p, ec))
      if (entry.is_regular_file(ec) && IsTraceName(entry.path().filename().string()))
        found.push_back(entry.path().string());
    if (ec) return Status::IoError(p + ": cannot list the folder: " + ec.message());
    if (found.empty())
      return Status::NotFound(p + ": no *.json or *.json.gz trace files in the folder");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// Files of one job agree on world size, name distinct ranks and overlap in
// time; anything else is files of different runs.
std::string MixedRuns(const std::vector<RankReport>& ranks) {
  std::map<int, std::string> seen;
  for (const RankReport& r : ranks) {
    if (r.world_size != ranks.front().world_size)
      return fmt::format("{} says world size {}, {} says {}", r.path, r.world_size,
                         ranks.front().path, ranks.front().world_size);
    auto [it, fresh] = seen.emplace(r.rank, r.path);
    if (!fresh && r.rank_from_trace)
      return fmt::format("{} and {} both say rank {}", it->second, r.path, r.rank);
  }
  for (size_t i = 0; i < ranks.size(); ++i)
    for (size_t j = i + 1; j < ranks.size(); ++j) {
      const RankReport& a = ranks[i];
      const RankReport& b = ranks[j];
      if (!a.absolute_clock || !b.absolute_clock) continue;
      if (a.abs_end_us < b.abs_start_us || b.abs_end_us < a.abs_start_us)
        return fmt::format("{} and {} were recorded at different times (no overlap)", a.path,
                           b.path);
    }
  return "";
}

void CompareRanks(TraceReport* rep) {
  std::vector<const RankReport*> with_comm, with_host;
  for (const RankReport& r : rep->ranks) {
    if (r.comm.kernels > 0) with_comm.push_back(&r);
    if (r.comm.host_collectives > 0) with_host.push_back(&r);
  }
  // Gloo's collectives run on the host: their spans stand in for kernels.
  bool host = with_comm.size() < 2 && with_host.size() >= 2;
  if (host) with_comm = with_host;
  if (with_comm.size() < 2) {
    if (rep->ranks.size() > 1)
      rep->cross.note =
          "fewer than two ranks ran communication kernels or Gloo collectives: no straggler to "
          "find";
    return;
  }
  auto comm_us = [host](const RankReport* r) {
    return host ? r->comm.host_collective_us : r->comm.comm_us;
  };
  const RankReport* slow = *std::min_element(
      with_comm.begin(), with_comm.end(),
      [&](const RankReport* a, const RankReport* b) { return comm_us(a) < comm_us(b); });
  rep->cross.compared = true;
  rep->cross.basis = host ? "Gloo collectives on the host" : "communication kernels";
  rep->cross.straggler = slow->rank;
  rep->cross.straggler_comm_us = comm_us(slow);
  for (const RankReport* r : with_comm)
    if (r != slow) rep->cross.waited_us[r->rank] = comm_us(r) - comm_us(slow);
}

// uneven_ranks: the rank that waited longest for the straggler, as a share
// of its kernel span.
void UnevenRanks(const TraceReport& rep, std::vector<Finding>* out) {
  if (!rep.cross.compared) return;
  int worst = -1;
  double worst_share = 0, worst_us = 0;
  for (const RankReport& r : rep.ranks) {
    auto it = rep.cross.waited_us.find(r.rank);
    if (it == rep.cross.waited_us.end() || r.temporal.span_us <= 0) continue;
    double share = it->second / r.temporal.span_us;
    if (share > worst_share) {
      worst = r.rank;
      worst_share = share;
      worst_us = it->second;
    }
  }
  if (worst < 0 || worst_share < CauseOf(CauseId::kUnevenRanks).trace_share) return;
  Finding f;
  f.cause = CauseId::kUnevenRanks;
  f.title = fmt::format("rank {} straggles: the other ranks wait for it in collectives",
                        rep.cross.straggler);
  f.evidence = fmt::format(
      "rank {} spent the least time in {} ({:.1f} ms); rank {} spent {:.1f} ms more, waiting "
      "for it ({:.1f}% of its kernel span)",
      rep.cross.straggler, rep.cross.basis, rep.cross.straggler_comm_us / 1e3, worst,
      worst_us / 1e3, 100 * worst_share);
  f.share_lost = worst_share;
  f.confidence = 0.7;
  f.fix = fmt::format(
      "look at rank {}'s input, clocks, PCIe and neighbours (its own trace's findings say what "
      "held it); equal shards and batch sizes across ranks",
      rep.cross.straggler);
  out->push_back(f);
}

// Per cause, the worst rank's finding (named when there are several);
// communication from the straggler (the others' includes waiting for it);
// plus uneven_ranks.
std::vector<Finding> JobFindings(const TraceReport& rep) {
  bool several = rep.ranks.size() > 1;
  std::map<std::string, Finding> worst;
  for (const RankReport& r : rep.ranks)
    for (Finding f : r.findings) {
      if (f.cause == CauseId::kHealthy) continue;
      if (f.cause == CauseId::kCommunication && rep.cross.compared && r.rank != rep.cross.straggler)
        continue;
      if (several) f.evidence = fmt::format("rank {}: {}", r.rank, f.evidence);
      auto it = worst.find(f.name());
      if (it == worst.end() || it->second.share_lost < f.share_lost) worst[f.name()] = f;
    }
  std::vector<Finding> out;
  for (auto& [cause, f] : worst) out.push_back(f);
  UnevenRanks(rep, &out);
  analyze::SortFindings(&out);
  if (!out.empty()) return out;
  Finding h;
  h.cause = CauseId::kHealthy;
  h.title = "no idle cause costs 5% of the GPU's time";
  h.evidence = "communication on the non-straggling ranks is waiting for the straggler";
  h.confidence = 0.5;
  for (const RankReport& r : rep.ranks)
    if (!r.findings.empty() && r.findings.back().cause == CauseId::kHealthy) {
      h = r.findings.back();
      if (several) h.evidence = fmt::format("rank {}: {}", r.rank, h.evidence);
      break;
    }
  out.push_back(h);
  return out;
}

}  // namespace

Result<RankReport> AnalyzeTraceFile(const std::string& path, int rank,
                                    const AnalyzeOptions& options) {
  Result<analyze::RawTrace> raw = analyze::ReadTrace(path);
  if (!raw.ok()) return raw.status();
  Result<RankReport> r = analyze::AnalyzeRaw(*raw, rank, options);
  if (r.ok()) r->findings = RankFindings(*r);
  return r;
}

Result<TraceReport> AnalyzeTraces(const std::vector<std::string>& paths,
                                  const AnalyzeOptions& options) {
  Result<std::vector<std::string>> files = ExpandPaths(paths);
  if (!files.ok()) return files.status();
  TraceReport rep;
  for (size_t i = 0; i < files->size(); ++i) {
    Result<RankReport> r = AnalyzeTraceFile((*files)[i], static_cast<int>(i), options);
    if (r.ok())
      rep.ranks.push_back(std::move(*r));
    else
      rep.errors.push_back(r.status().message());
  }
  if (rep.ranks.empty())
    return Status::InvalidArgument(rep.errors.size() == 1
                                       ? rep.errors.front()
                                       : fmt::format("none of the {} files could be analysed; "
                                                     "the first: {}",
                                                     rep.errors.size(), rep.errors.front()));
  std::sort(rep.ranks.begin(), rep.ranks.end(),
            [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  if (rep.ranks.size() > 1) {
    bool named = std::all_of(rep.ranks.begin(), rep.ranks.end(),
                             [](const RankReport& r) { return r.rank_from_trace; });
    if (!named)
      rep.notes.push_back(
          "not every trace names its rank (distributedInfo): those are numbered "
          "in the order of the files");
    std::string mixed = MixedRuns(rep.ranks);
    if (!mixed.empty()) {
      rep.mixed_runs = true;
      rep.cross.note = "files of different runs: " + mixed +
                       "; each is analysed on its own, ranks are not compared (analyse each "
                       "run's folder separately)";
      rep.notes.push_back(rep.cross.note);
    } else {
      CompareRanks(&rep);
    }
  }
  if (options.rank) {
    std::vector<RankReport> kept;
    std::string present;
    for (RankReport& r : rep.ranks) {
      present += (present.empty() ? "" : ", ") + std::to_string(r.rank);
      if (r.rank == *options.rank) kept.push_back(std::move(r));
    }
    if (kept.empty())
      return Status::NotFound(
          fmt::format("--rank {}: no trace of that rank (ranks: {})", *options.rank, present));
    rep.ranks = std::move(kept);
  }
  if (!rep.mixed_runs) rep.findings = JobFindings(rep);
  return rep;
}

}  // namespace fullburn
