// fullburn train's tuning: its knobs (the batch-size search with the
// effective batch kept, loader, precision, pack, ...) one at a time, and the
// winner written as a complete config `fullburn train` takes as is.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "fullburn/atomic_file.h"
#include "fullburn/config.h"
#include "fullburn/pipeline.h"
#include "fullburn/report.h"
#include "fullburn/tuner.h"

namespace fullburn {
namespace {

class TrainTuner : public KnobTuner {
 public:
  TrainTuner(Tuning* tuning, TrialRunner* runner, const TrainTuneOptions& o)
      : KnobTuner(tuning, runner, o.min_gain, o.budget, "as given", "the starting config",
                  "at the start"),
        o_(o) {}

 private:
  std::vector<std::string> Order(const std::vector<Finding>& findings) override {
    return KnobOrder(findings, t_->plan().knobs);
  }

  std::vector<Candidate> Candidates(const std::string& knob, const std::vector<Finding>& findings,
                                    std::string* skip_reason) override {
    ctx_ = Context(findings);
    return KnobCandidates(knob, ctx_, skip_reason);
  }

  // The search trial chose a micro-batch; keep the effective batch by
  // accumulation, measuring again when that changes what was measured.
  Trial Settle(const std::string& knob, Trial search) override {
    if (knob != "batch") return search;
    const TuneContext& ctx = ctx_;
    Result<TrainSettings> searched = StoredSettings(search.run_id);
    const TrainSettings& best = ctx.settings;
    int64_t chosen = searched.ok() && !searched->train.batch_size.automatic
                         ? searched->train.batch_size.value
                         : 0;
    int64_t effective = best.train.batch_size.value * best.train.accumulate;
    if (chosen <= 0 || best.train.batch_size.automatic) {
      search.status = TrialStatus::kFailed;
      search.reason =
          "run " + std::to_string(search.run_id) + " does not record the chosen batch size";
      return search;
    }
    std::map<std::string, std::string> overrides = best_.overrides;
    overrides.erase("train.max_batch_size");
    if (!ctx.keep_effective_batch) {
      overrides["train.batch_size"] = std::to_string(chosen);
      search.overrides = overrides;
      search.value = std::to_string(chosen);
      return search;
    }
    auto [micro, accumulate] = KeepEffectiveBatch(chosen, effective);
    overrides["train.batch_size"] = std::to_string(micro);
    overrides["train.accumulate"] = std::to_string(accumulate);
    if (micro == chosen && accumulate == 1) {
      search.overrides = overrides;
      search.value = std::to_string(micro);
      return search;
    }
    search.verdict = fmt::format("search chose {}", chosen);
    t_->Record(search);
    return RunKnobTrial("batch", fmt::format("{} x {}", micro, accumulate), overrides);
  }

  TuneContext Context(const std::vector<Finding>& findings) {
    TuneContext ctx;
    auto run = t_->store()->GetRun(std::to_string(best_.run_id));
    if (run.ok()) {
      if (auto settings = ReadStoredSettings(run->config_json); settings.ok())
        ctx.settings = *settings;
      // Not options: what the trainer resolved them to, recorded beside them.
      auto stored = nlohmann::json::parse(run->config_json, nullptr, false);
      nlohmann::json resolved = stored.is_object() ? stored.value("resolved", nlohmann::json())
                                                   : nlohmann::json();
      if (resolved.is_object()) {
        ctx.data_path = resolved.value("data_path", "");
        ctx.val_path = resolved.value("val_path", "");
        ctx.cuda = resolved.value("device", "").rfind("cuda", 0) == 0;
      }
    }
    ctx.cores = RankCpus(ReadCpuView(t_->env()), 1);  // what one trial may use
    ctx.host_memory_bytes = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<double>(::sysconf(_SC_PAGESIZE));
    ctx.input_bound = InputBound(findings);
    ctx.knobs_chosen = !t_->plan().knobs.empty();
    ctx.keep_effective_batch = !o_.free_batch;
    ctx.pack_dir = t_->PackDir();
    ctx.data_is_pack = PackReader::IsPack(ctx.data_path);
    return ctx;
  }

  // A run's options as it stored them.
  Result<TrainSettings> StoredSettings(int64_t run_id) {
    auto run = t_->store()->GetRun(std::to_string(run_id));
    if (!run.ok()) return run.status();
    return ReadStoredSettings(run->config_json);
  }

  // The winner as a complete config file.
  std::string Conclude(const std::string& head, nlohmann::json* result, int* code) override {
    const TunePlan& p = t_->plan();
    std::vector<std::string> overrides = p.overrides, changed;
    for (const auto& [key, v] : best_.overrides) changed.push_back(key + "=" + v);
    overrides.insert(overrides.end(), changed.begin(), changed.end());
    auto config = Config::Load(p.config_path, overrides);
    std::string path =
        o_.output.empty() ? fmt::format("fullburn-tuned-{}.toml", t_->id()) : o_.output;
    double ratio = best_.measure.value / start_.measure.value;
    std::string header = fmt::format(
        "# fullburn tune (tuning run {}): {:.1f} {} with these settings, {:.1f} at the start "
        "({:.2f}x).\n"
        "# Changed: {}\n",
        t_->id(), best_.measure.value, best_.measure.unit, start_.measure.value, ratio,
        changed.empty() ? "nothing" : fmt::format("{}", fmt::join(changed, " ")));
    auto path_it = best_.overrides.find("data.path");
    if (packed_ && path_it != best_.overrides.end() && path_it->second == packed_->dst)
      header += fmt::format(
          "# data.path is a pack the tuner wrote; to rebuild it: fullburn pack {} {} --format raw "
          "--max-side {}\n",
          packed_->src, packed_->dst, packed_->max_side);
    Status written =
        config.ok() ? WriteFileAtomically(path, header + config->ToToml()) : config.status();
    std::string summary = head + "; ";
    summary += written.ok() ? "config written to " + path + " (fullburn train " + path + ")"
                            : "the config could not be written: " + written.message();
    (*result)["config_path"] = written.ok() ? path : "";
    if (!written.ok()) *code = 1;
    return summary;
  }

  TrainTuneOptions o_;
  TuneContext ctx_;  // the knob being tried's
};

}  // namespace

int TuneTrain(Tuning* t, TrialRunner* runner, const TrainTuneOptions& o) {
  return TrainTuner(t, runner, o).Run();
}

}  // namespace fullburn
