// The tuning loop: the record of a tuning (Tuning), one knob at a time from
// the best so far (KnobTuner), and a grid's combinations (TuneGrid). How a
// trial runs is the TrialRunner's.
#include "fullburn/tuner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fullburn/pipeline.h"
#include "fullburn/report.h"

namespace fullburn {

// ---- Tuning ------------------------------------------------------------------

Tuning::Tuning(RunStore* store, RunInfo run, const TunePlan& plan, const Env* env)
    : store_(store),
      run_(std::move(run)),
      plan_(plan),
      env_(env),
      start_(env->MonotonicSeconds()),
      layout_(store->path()) {
  ::mkdir(layout_.TuneLogs(run_.id).c_str(), 0755);  // the trials' output files
}

std::string Tuning::NextLog() const {
  return layout_.TrialLog(run_.id, static_cast<int>(trials_.size()) + 1);
}
std::string Tuning::LogDir() const { return layout_.TuneLogs(run_.id); }
std::string Tuning::PackDir() const { return layout_.TunePack(run_.id); }

bool Tuning::LengthenTrials(double factor) {
  double longer = plan_.trial_s * factor;
  if (env_->MonotonicSeconds() - start_ + 2 * longer > plan_.budget_s) return false;
  plan_.trial_s = longer;
  return true;
}

bool Tuning::BudgetHolds(double trial_s, double overhead_s) const {
  return env_->MonotonicSeconds() - start_ + trial_s + overhead_s <= plan_.budget_s;
}

bool Tuning::BudgetAllows() const {
  double longest = plan_.trial_s;
  for (const Trial& t : trials_)
    if (!t.stretched) longest = std::max(longest, t.wall_s);
  return env_->MonotonicSeconds() - start_ + longest <= plan_.budget_s;
}

void Tuning::Record(Trial t) {
  t.index = static_cast<int>(trials_.size()) + 1;
  if (t.status == TrialStatus::kInterrupted) interrupted_ = true;
  store_->AddEvent(run_.id,
                   {env_->UnixSeconds() - run_.start_time, "tune_trial", TrialJson(t).dump()});
  std::string line = fmt::format("tune: #{} {}={}: ", t.index, t.knob, t.value);
  if (t.status == TrialStatus::kOk)
    line += FormatMeasure(t.measure) + " " + t.measure.unit + " " + t.verdict;
  else
    line += TrialStatusName(t.status) + (t.reason.empty() ? "" : ": " + t.reason);
  if (t.run_id > 0) line += fmt::format(" (run {})", t.run_id);
  std::fprintf(stderr, "%s\n", line.c_str());
  trials_.push_back(std::move(t));
}

void Tuning::Finish(const std::string& summary, const nlohmann::json& result, int code) {
  nlohmann::json j = result;
  j["summary"] = summary;
  store_->AddEvent(run_.id, {env_->UnixSeconds() - run_.start_time, "tune_result", j.dump()});
  store_->FinishRun(run_.id, env_->UnixSeconds(), code, "finished");
  std::fputs(("\n" + RenderTrialTable(trials_) + "\n").c_str(), stdout);
  std::printf("%s\n", summary.c_str());
  std::fflush(stdout);
}

// ---- KnobTuner -------------------------------------------------------------

KnobTuner::KnobTuner(Tuning* t, TrialRunner* runner, double min_gain, std::string budget,
                     std::string start_value, std::string start_name, std::string versus)
    : t_(t),
      runner_(runner),
      min_gain_(min_gain),
      budget_(std::move(budget)),
      start_value_(std::move(start_value)),
      start_name_(std::move(start_name)),
      versus_(std::move(versus)) {}

int KnobTuner::Run() {
  // Too few steps in the start (a slow start-up, a machine busy with other
  // work): every trial is made twice as long, up to twice, while the budget
  // allows, rather than ending the tuning with nothing measured.
  Trial start = RunStart(start_value_, 2);
  if (start.status == TrialStatus::kOk) start.verdict = "start";
  bool ok = start.status == TrialStatus::kOk;
  t_->Record(start);
  if (!ok)
    return Finish(t_->interrupted() ? 130 : 1,
                  start_name_ + " failed (" + start.reason + "): nothing to compare with");
  best_ = t_->trials().back();
  MeasureNoise();
  start_ = best_;
  auto data = t_->store()->LoadRun(std::to_string(best_.run_id));
  std::vector<Finding> findings = data.ok() ? Diagnose(*data) : std::vector<Finding>{};
  std::vector<std::string> order = Order(findings);
  std::fprintf(
      stderr,
      "tune: run-to-run noise %.0f%%; the start's top finding is %s; knobs in this order: %s\n",
      noise_ * 100, findings.empty() ? "none" : CauseName(findings.front().cause),
      fmt::format("{}", fmt::join(order, ", ")).c_str());
  for (size_t k = 0; k < order.size() && !t_->interrupted(); ++k) {
    if (!TryKnob(order[k], findings)) {
      for (size_t r = k; r < order.size(); ++r) Skip(order[r], "budget (" + budget_ + ") used up");
      break;
    }
  }
  return Finish(t_->interrupted() ? 130 : 0, "");
}

Trial KnobTuner::RunStart(const std::string& value, int lengthen) {
  Trial trial = RunOne("start", value, {});
  for (int i = 0; i < lengthen && trial.too_short && !t_->interrupted() && t_->LengthenTrials(2);
       ++i) {
    t_->Record(trial);
    std::fprintf(stderr, "tune: too few steps to measure: trials lengthened to %s\n",
                 FormatDuration(t_->plan().trial_s).c_str());
    trial = RunOne("start", value, {});
  }
  return trial;
}

// The start again: windows within one trial vary less than whole trials do
// (other load, clocks, caches), so a change must also beat the difference
// between two runs of the same settings.
void KnobTuner::MeasureNoise() {
  if (!t_->BudgetAllows()) return;
  // The machine slowed since the start (other work): once more, longer, as
  // for the start, rather than tuning without knowing the noise.
  Trial again = RunStart("again", 1);
  if (again.status == TrialStatus::kOk) {
    double a = best_.measure.value, b = again.measure.value;
    noise_ = std::abs(a - b) / ((a + b) / 2);
    again.verdict = fmt::format("run-to-run noise {:.0f}%", noise_ * 100);
    best_.measure.value = (a + b) / 2;
    best_.measure.spread = std::max(best_.measure.spread, again.measure.spread);
  }
  t_->Record(again);
}

bool KnobTuner::TryKnob(const std::string& knob, const std::vector<Finding>& findings) {
  std::string skip;
  std::vector<Candidate> candidates = Candidates(knob, findings, &skip);
  if (!skip.empty()) Skip(knob, skip);
  for (const Candidate& c : candidates) {
    if (t_->interrupted()) return true;
    if (!t_->BudgetAllows()) return false;
    std::map<std::string, std::string> merged = OnBest(c);
    // The pack knob's data, written once per tuning into its directory. The
    // time it takes counts against the budget like a trial's.
    if (c.pack && !PackReader::IsPack(c.pack->dst)) {
      if (Status packed = runner_->WritePack(*c.pack); !packed.ok()) {
        Trial failed;
        failed.knob = knob;
        failed.value = c.value;
        failed.overrides = merged;
        failed.status = TrialStatus::kFailed;
        failed.reason = packed.message();
        t_->Record(failed);
        continue;
      }
      packed_ = *c.pack;
    }
    Trial trial = RunKnobTrial(knob, c.value, merged);
    if (trial.status == TrialStatus::kOk) trial = Settle(knob, trial);
    Judge(&trial);
  }
  return true;
}

Trial KnobTuner::RunOne(const std::string& knob, const std::string& value,
                        const std::map<std::string, std::string>& overrides) {
  Trial trial = NewTrial(knob, value, overrides);
  runner_->Run(*t_, &trial);
  Check(&trial);
  return trial;
}

Trial KnobTuner::RunKnobTrial(const std::string& knob, const std::string& value,
                              const std::map<std::string, std::string>& overrides) {
  Trial trial = RunOne(knob, value, overrides);
  // The start was measured with this length, so a value that leaves too few
  // steps, or none, starts slower (or runs far slower, which a longer trial
  // measures too, roughly).
  if (!(trial.too_short || trial.no_steps) || t_->interrupted() || runner_->Interrupted())
    return trial;
  const double was = t_->plan().trial_s, longer = was * kSlowStartStretch;
  const char* what = trial.no_steps ? "no step" : "too few steps";
  // The trial's start-up and stop come on top of its length, in the budget too.
  if (!t_->BudgetHolds(longer, std::max(0.0, trial.wall_s - was))) {
    trial.reason =
        fmt::format("{} in {} (a slower start), and the budget has no room for a {} trial", what,
                    FormatDuration(was), FormatDuration(longer));
    return trial;
  }
  trial.reason =
      fmt::format("{} in {}: tried again at {}", what, FormatDuration(was), FormatDuration(longer));
  t_->Record(trial);
  std::fprintf(stderr, "tune: %s=%s: %s in %s (a slower start): once more at %s\n", knob.c_str(),
               value.c_str(), what, FormatDuration(was).c_str(), FormatDuration(longer).c_str());
  t_->SetTrialLength(longer);
  Trial again = RunOne(knob, value, overrides);
  t_->SetTrialLength(was);
  again.stretched = true;
  return again;
}

Trial KnobTuner::NewTrial(const std::string& knob, const std::string& value,
                          const std::map<std::string, std::string>& overrides) const {
  Trial trial;
  trial.knob = knob;
  trial.value = value;
  trial.overrides = overrides;
  trial.log = t_->NextLog();
  return trial;
}

std::map<std::string, std::string> KnobTuner::OnBest(const Candidate& c) const {
  std::map<std::string, std::string> merged = best_.overrides;
  for (const auto& [key, v] : c.overrides) merged[key] = v;
  return merged;
}

void KnobTuner::Judge(Trial* trial) {
  bool kept = false;
  if (trial->status == TrialStatus::kOk)
    trial->verdict = Verdict(*trial, best_, std::max(min_gain_, noise_), &kept);
  t_->Record(*trial);
  if (kept) best_ = t_->trials().back();
}

void KnobTuner::Skip(const std::string& knob, const std::string& reason) {
  Trial t;
  t.knob = knob;
  t.value = "-";
  t.status = TrialStatus::kSkipped;
  t.reason = reason;
  t_->Record(t);
}

int KnobTuner::Finish(int code, const std::string& failure) {
  nlohmann::json result{{"objective", ObjectiveName(t_->plan().objective)}};
  if (!failure.empty()) {
    t_->Finish("tuning " + std::to_string(t_->id()) + " stopped: " + failure, result, code);
    return code;
  }
  double ratio = best_.measure.value / start_.measure.value;
  std::string head = fmt::format("tuning {}: {:.1f} {} vs {:.1f} {} ({:.2f}x){}", t_->id(),
                                 best_.measure.value, best_.measure.unit, start_.measure.value,
                                 versus_, ratio, t_->interrupted() ? ", interrupted" : "");
  result["start"] = start_.measure.value;
  result["best"] = best_.measure.value;
  result["ratio"] = ratio;
  result["best_trial"] = best_.index;
  result["overrides"] = best_.overrides;
  std::string summary = Conclude(head, &result, &code);
  t_->Finish(summary, result, code);
  return code;
}

// ---- --grid: any command -----------------------------------------------------

int TuneGrid(Tuning* t, TrialRunner* runner, const std::vector<std::string>& command,
             double min_gain, const std::string& budget) {
  const TunePlan& p = t->plan();
  std::vector<std::map<std::string, std::string>> combos = ExpandGrid(p.axes);
  size_t i = 0;
  for (; i < combos.size() && !t->interrupted(); ++i) {
    if (!t->trials().empty() && !t->BudgetAllows()) break;
    Trial trial;
    trial.knob = "grid";
    trial.value = GridValue(p.axes, combos[i]);
    trial.overrides = combos[i];
    trial.log = t->NextLog();
    runner->Run(*t, &trial);
    trial.verdict = GridVerdict(trial, t->trials(), min_gain);
    t->Record(trial);
  }
  for (; i < combos.size(); ++i) {
    Trial skipped;
    skipped.knob = "grid";
    skipped.value = GridValue(p.axes, combos[i]);
    skipped.status = TrialStatus::kSkipped;
    skipped.reason = t->interrupted() ? "interrupted" : "budget (" + budget + ") used up";
    t->Record(skipped);
  }
  int code = t->interrupted() ? 130 : 0;
  nlohmann::json result{{"objective", ObjectiveName(p.objective)}};
  int best_index = BestTrial(t->trials());
  if (best_index < 0) {
    t->Finish(
        fmt::format(
            "tuning {}: no trial could be measured (the reasons are above; the outputs in {})",
            t->id(), t->LogDir()),
        result, code ? code : 1);
    return code ? code : 1;
  }
  const Trial& best = t->trials()[best_index];
  std::string joined = JoinedCommand(*Substitute(command, best.overrides));
  result["best"] = best.measure.value;
  result["best_trial"] = best.index;
  result["overrides"] = best.overrides;
  result["command"] = joined;
  std::string ties;
  result["ties"] = nlohmann::json::array();
  for (int i : TiedWithBest(t->trials(), best_index, min_gain)) {
    const Trial& tie = t->trials()[i];
    result["ties"].push_back(tie.index);
    ties += fmt::format("{}#{} {}", ties.empty() ? "" : ", ", tie.index, tie.value);
  }
  if (!ties.empty())
    ties = fmt::format(
        "\n  as fast within the noise (pick the one that costs least; --min-gain {:.0f}%): {}",
        min_gain * 100, ties);
  t->Finish(fmt::format("tuning {}: best {} at {:.1f} {} (trial #{}, run {}){}\n  {}{}", t->id(),
                        best.value, best.measure.value, best.measure.unit, best.index, best.run_id,
                        t->interrupted() ? ", interrupted" : "", joined, ties),
            result, code);
  return code;
}

}  // namespace fullburn
