// checkpoint_stall: how long saving checkpoints held up the training loop.
// A wrapped job's torch.save is synchronous: serializing and writing a large
// state to a network file system can take seconds every few hundred steps,
// which no other rule names (the automatic markers keep it out of the step,
// so it is neither a slow step nor, when short, an idle phase).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "facts.h"
#include "fullburn/train_settings.h"

namespace fullburn::diagnose {

bool IsTimedSave(const RunEvent& e) {
  if (e.kind != "checkpoint") return false;
  auto data = nlohmann::json::parse(e.data, nullptr, false);
  return data.is_object() && data.contains("duration_s") && data["duration_s"].is_number();
}

int64_t Period(const std::vector<int64_t>& at, int64_t min_period) {
  if (at.size() < 3) return 0;
  std::map<int64_t, int> gaps;
  for (size_t i = 1; i < at.size(); ++i) ++gaps[at[i] - at[i - 1]];
  auto most = std::max_element(gaps.begin(), gaps.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  return most->second >= 0.75 * (at.size() - 1) && most->first >= min_period ? most->first : 0;
}

namespace {

using Save = CheckpointFacts::Save;

// A wrapped job's timed saves on `rank`, left as they came.
std::vector<Save> SavesFromEvents(const RunData& d, int rank, CheckpointFacts* c) {
  std::vector<Save> out;
  for (const RunEvent& e : d.events) {
    if (!IsTimedSave(e)) continue;
    auto data = nlohmann::json::parse(e.data);
    if (data.value("rank", 0) != rank) continue;
    double took = std::max(0.0, data["duration_s"].get<double>());
    if (data.value("background", false)) {
      c->background.push_back({e.t - took, e.t});
      continue;
    }
    Save s{e.t - took, e.t, took};
    if (data.contains("bytes") && data["bytes"].is_number_integer())
      s.bytes = data["bytes"].get<int64_t>();
    out.push_back(s);
    c->source = data.value("detected", "") == "automatic" ? "torch.save" : "phase";
    if (data.contains("path") && data["path"].is_string()) c->path = data["path"];
  }
  return out;
}

// fullburn train's: the loop stops for the snapshot right after the step.
std::vector<Save> SavesFromTrainer(const RunData& d, int rank, CheckpointFacts* c) {
  std::map<int64_t, double> step_end;
  for (const StepRecord& r : d.steps)
    if (r.rank == rank) step_end[r.step] = r.t;
  std::vector<Save> out;
  for (const CheckpointRecord& r : d.checkpoints) {
    if (!(r.stall_s > 0)) continue;
    auto end = step_end.find(r.step);
    double start = end != step_end.end() ? end->second : r.t - r.write_s - r.stall_s;
    out.push_back({start, start + r.stall_s, r.stall_s, r.bytes > 0 ? r.bytes : -1, r.step});
    c->source = "trainer";
    c->path = r.path;
  }
  return out;
}

// Saves after the same step (a model file and an optimizer file) are one.
std::vector<Save> Merged(std::vector<Save> saves) {
  std::sort(saves.begin(), saves.end(),
            [](const Save& a, const Save& b) { return a.start < b.start; });
  std::vector<Save> out;
  for (const Save& s : saves) {
    if (out.empty() || out.back().after_step != s.after_step) {
      out.push_back(s);
      continue;
    }
    Save& m = out.back();
    m.end = std::max(m.end, s.end);
    m.blocked_s += s.blocked_s;
    m.bytes = m.bytes >= 0 && s.bytes >= 0 ? m.bytes + s.bytes : -1;
  }
  return out;
}

}  // namespace

void GatherCheckpoints(const RunData& d, Facts* f) {
  CheckpointFacts& c = f->checkpoints;
  int rank = f->ranks.empty() ? 0 : f->ranks.front().rank;
  std::vector<Save> saves = SavesFromEvents(d, rank, &c);
  for (const Save& s : SavesFromTrainer(d, rank, &c)) saves.push_back(s);
  // The step a wrapped job's save came after: the last one that had ended.
  std::vector<std::pair<double, int64_t>> ends;
  for (const StepRecord& r : d.steps)
    if (r.rank == rank) ends.push_back({r.t, r.step});
  std::sort(ends.begin(), ends.end());
  for (Save& s : saves) {
    if (s.after_step > 0) continue;
    auto it = std::upper_bound(ends.begin(), ends.end(), std::make_pair(s.start + 1e-6, INT64_MAX));
    if (it != ends.begin()) s.after_step = std::prev(it)->second;
  }
  c.saves = Merged(saves);
  std::vector<int64_t> at;
  for (const Save& s : c.saves) c.blocked_s += s.blocked_s, at.push_back(s.after_step);
  c.period = Period(at, 1);
  if (auto settings = ReadStoredSettings(d.run.config_json); settings.ok())
    c.trainer_async = settings->checkpoint.async;
}

double SavesWithin(const CheckpointFacts& c, double start, double end) {
  double total = 0;
  for (const Save& s : c.saves) {
    double overlap = std::min(end, s.end) - std::max(start, s.start);
    if (overlap > 0) total += s.end > s.start ? overlap * s.blocked_s / (s.end - s.start) : 0;
  }
  return total;
}

double SavesAfter(const CheckpointFacts& c, int64_t step) {
  double total = 0;
  for (const Save& s : c.saves)
    if (s.after_step == step) total += s.blocked_s;
  return total;
}

namespace {

std::string Bytes(double b) {
  return b >= 1e9 ? fmt::format("{:.1f} GB", b / 1e9) : fmt::format("{:.0f} MB", b / 1e6);
}

// Bytes per second over the saves whose size is known; NaN with none.
double WriteRate(const CheckpointFacts& c) {
  double written = 0, written_s = 0;
  for (const Save& s : c.saves)
    if (s.bytes > 0) written += s.bytes, written_s += s.blocked_s;
  return written_s > 0 ? written / written_s : NAN;
}

// Saves every K steps costing `share` of the run: every K' costs kCheckpointTarget.
int64_t TargetPeriod(const CheckpointFacts& c, double share) {
  return static_cast<int64_t>(std::ceil(c.period * share / kCheckpointTarget));
}

std::string Evidence(const CheckpointFacts& c, double share) {
  std::vector<double> each, sizes;
  double longest = 0;
  for (const Save& s : c.saves) {
    each.push_back(s.blocked_s);
    longest = std::max(longest, s.blocked_s);
    if (s.bytes > 0) sizes.push_back(s.bytes);
  }
  const char* by = c.source == "torch.save" ? "torch.save, timed by the automatic markers"
                   : c.source == "phase"    ? "Markers.phase(\"checkpoint\")"
                                            : "the snapshot before each background write";
  std::string s = fmt::format(
      "{} checkpoint{} ({}) held up the training loop {:.1f} s, {} of the run (>= {}): {:.3g} s "
      "each (median; longest {:.3g} s)",
      c.saves.size(), c.saves.size() == 1 ? "" : "s", by, c.blocked_s, Percent(share), Percent(kMinShare),
      Median(each), longest);
  if (c.period > 0) s += fmt::format(", every {} steps", c.period);
  if (double rate = WriteRate(c); !sizes.empty() && !std::isnan(rate))
    s += fmt::format("; {} each at {}/s", Bytes(Median(sizes)), Bytes(rate));
  if (!c.path.empty()) s += "; the last: " + c.path;
  return s;
}

std::string LessOften(const CheckpointFacts& c, double share) {
  if (c.period <= 0) return "less often";
  return fmt::format("every {} steps instead of every {} (about {} of the run)",
                     TargetPeriod(c, share), c.period, Percent(kCheckpointTarget));
}

std::string Fix(const Facts& f, double share) {
  const CheckpointFacts& c = f.checkpoints;
  if (c.source == "trainer") {
    if (!c.trainer_async)
      return "checkpoint.async = true: the loop then waits only for the snapshot to host memory";
    std::string every = c.period > 0
                            ? fmt::format("checkpoint.every_steps = {}", TargetPeriod(c, share))
                            : "a larger checkpoint.every_steps or checkpoint.every_minutes";
    return fmt::format(fmt::runtime(FixFor(CauseId::kCheckpointStall, Framework::kFullburnTrain)),
                       fmt::arg("every", every));
  }
  std::string fix =
      fmt::format(fmt::runtime(FixFor(CauseId::kCheckpointStall, Framework::kPytorch)),
                  fmt::arg("less_often", LessOften(c, share)));
  if (double rate = WriteRate(c); rate < kSlowWrite)  // false for NaN: sizes unknown
    fix += fmt::format(
        "; the saves ran at {}/s: write to a local SSD or /dev/shm and copy to shared storage "
        "afterwards",
        Bytes(rate));
  return fix;
}

}  // namespace

void CheckpointRule(const Facts& f, std::vector<Finding>* out) {
  const CheckpointFacts& c = f.checkpoints;
  if (c.saves.empty() || f.wall_s <= 0) return;
  double share = c.blocked_s / f.wall_s;
  if (share < kMinShare) return;
  out->push_back({CauseId::kCheckpointStall, CauseOf(CauseId::kCheckpointStall).title,
                  Evidence(c, share), share, 0.9, Fix(f, share)});
}

}  // namespace fullburn::diagnose
