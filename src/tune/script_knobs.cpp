// The knobs of an unchanged PyTorch script: DataLoader arguments and torch
// threads, which python/fullburn_autosteps/ (tune_settings.py) applies from
// FULLBURN_TUNE_SET.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "fullburn/tune.h"

namespace fullburn {

const std::vector<KnobDef>& ScriptKnobs() {
  static const std::vector<KnobDef> knobs = {
      {"workers", "num_workers", "DataLoader worker processes"},
      {"prefetch", "prefetch_factor", "Batches each DataLoader worker prepares ahead"},
      {"persistent_workers", "persistent_workers",
       "DataLoader workers kept from one epoch to the next"},
      {"pin_memory", "pin_memory", "DataLoader batches in pinned memory (CUDA)"},
      {"threads", "threads", "torch.set_num_threads of the training process"},
      {"swap", "loader",
       "fullburn.ImageLoader in place of an ImageFolder DataLoader (same augmentation, C++ "
       "threads)"},
  };
  return knobs;
}

ScriptSettings ScriptSettings::FromEvents(const std::vector<RunEvent>& events, int rank) {
  ScriptSettings s;
  auto get = [](const nlohmann::json& d, const char* key, int* out) {
    if (d.contains(key) && d[key].is_boolean())
      *out = d[key].get<bool>() ? 1 : 0;
    else if (d.contains(key) && d[key].is_number_integer())
      *out = d[key].get<int>();
  };
  bool torch_seen = false;
  for (const RunEvent& e : events) {
    auto d = nlohmann::json::parse(e.data, nullptr, false);
    if (!d.is_object() || d.value("rank", 0) != rank) continue;
    if (e.kind == "dataloader" && !s.has_loader) {  // the first: the training loader
      s.has_loader = true;
      get(d, "num_workers", &s.num_workers);
      get(d, "prefetch_factor", &s.prefetch_factor);
      get(d, "persistent_workers", &s.persistent_workers);
      get(d, "pin_memory", &s.pin_memory);
      if (d.contains("dataset") && d["dataset"].is_string()) s.dataset = d["dataset"].get<std::string>();
      if (d.contains("swapped") && d["swapped"].is_string()) s.loader = "fullburn";
    } else if (e.kind == "torch" && !torch_seen) {
      torch_seen = true;
      get(d, "threads", &s.threads);
    }
  }
  return s;
}

int ScriptRanks(const std::vector<RunEvent>& events) {
  std::set<int> ranks;
  for (const RunEvent& e : events) {
    if (e.kind != "torch") continue;
    auto d = nlohmann::json::parse(e.data, nullptr, false);
    if (d.is_object() && d.value("rank", 0) >= 0) ranks.insert(d.value("rank", 0));
  }
  return std::max<int>(1, static_cast<int>(ranks.size()));
}

namespace {

std::vector<Candidate> Values(const std::string& key, const std::vector<int>& values, int current) {
  std::vector<Candidate> out;
  std::set<int> seen = {current};
  for (int v : values)
    if (v >= 0 && seen.insert(v).second)
      out.push_back({std::to_string(v), {{key, std::to_string(v)}}, std::nullopt});
  return out;
}

}  // namespace

std::vector<Candidate> ScriptKnobCandidates(const std::string& knob, const ScriptContext& ctx,
                                            std::string* skip) {
  const ScriptSettings& c = ctx.current;
  int cores = std::max(1, ctx.cores);
  std::vector<Candidate> out;
  if (knob == "threads") {
    out = Values("threads", {std::max(1, cores / 2), cores}, c.threads);
  } else if (!c.has_loader) {
    *skip = "the script's steps read no torch DataLoader";
  } else if (knob == "swap") {
    // The automatic markers swap only an ImageFolder whose transforms the
    // loader reproduces (RandomResizedCrop or Resize + CenterCrop, flip,
    // ToTensor, Normalize); any other fails the trial with its reason.
    if (c.loader == "fullburn")
      *skip = "already fullburn.ImageLoader";
    else if (c.dataset != "ImageFolder")
      *skip = c.dataset.empty() ? "the DataLoader's dataset was not recorded"
                                : "its dataset is a " + c.dataset + ", not an ImageFolder";
    else
      out = {{"fullburn.ImageLoader", {{"loader", "fullburn"}}, std::nullopt}};
  } else if (knob == "workers") {
    // Twice the cores too: workers that wait on storage or the network
    // rather than decode (docs/diagnosis.md, input_workers).
    out = Values("num_workers", {0, std::max(1, cores / 2), cores, 2 * cores}, c.num_workers);
  } else if (c.num_workers <= 0 && knob != "pin_memory") {
    *skip = "num_workers = 0: no worker processes to tune";
  } else if (knob == "prefetch") {
    out = Values("prefetch_factor", {4, 8}, c.prefetch_factor < 0 ? 2 : c.prefetch_factor);
  } else if (knob == "persistent_workers") {
    if (c.persistent_workers != 1) out = {{"true", {{"persistent_workers", "true"}}, std::nullopt}};
  } else if (knob == "pin_memory") {
    if (!ctx.cuda)
      *skip = "no GPU sampled: nothing to copy from pinned memory";
    else if (c.pin_memory != 1)
      out = {{"true", {{"pin_memory", "true"}}, std::nullopt}};
  } else {
    *skip = "unknown knob";
  }
  if (out.empty() && skip->empty()) *skip = "already at every value tried";
  return out;
}

std::vector<std::string> ScriptKnobOrder(const std::vector<Finding>& findings,
                                         const std::vector<std::string>& selected) {
  if (InputBound(findings))
    return OnlySelected(
        {"workers", "prefetch", "persistent_workers", "pin_memory", "swap", "threads"}, selected);
  return OnlySelected({"threads", "workers", "pin_memory", "prefetch", "persistent_workers", "swap"},
                      selected);
}

nlohmann::json ScriptSettingsJson(const std::map<std::string, std::string>& overrides) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, v] : overrides) {
    if (v == "true" || v == "false")
      j[key] = v == "true";
    else if (key == "loader")
      j[key] = v;
    else
      j[key] = std::stoi(v);
  }
  return j;
}

std::string ScriptAdvice(const std::map<std::string, std::string>& overrides) {
  std::string loader, threads;
  bool swapped = false;
  for (const auto& [key, v] : overrides) {
    std::string value = v == "true" ? "True" : v == "false" ? "False" : v;
    if (key == "threads")
      threads = "torch.set_num_threads(" + value + ")";
    else if (key == "loader")
      swapped = v == "fullburn";
    else
      loader += (loader.empty() ? "" : ", ") + key + "=" + value;
  }
  // Swapped, the DataLoader's own settings no longer apply.
  std::string out =
      swapped ? "import fullburn; loader = fullburn.ImageLoader(root, batch_size) in place of "
                "ImageFolder + DataLoader (docs/python.md)"
              : loader.empty() ? "" : "DataLoader(" + loader + ")";
  if (!threads.empty()) out += (out.empty() ? "" : "; ") + threads;
  return out.empty() ? "nothing to change" : out;
}

std::string ScriptSettingsMismatch(const std::map<std::string, std::string>& overrides,
                                   const ScriptSettings& recorded) {
  for (const auto& [key, v] : overrides) {
    if (key == "loader") {
      if (recorded.loader != v)
        return "fullburn.ImageLoader was asked in place of the DataLoader and the run did not "
               "take it (its transforms are not ones the loader reproduces; see the trial's log)";
      continue;
    }
    if (recorded.loader == "fullburn") continue;  // swapped: the DataLoader's settings are moot
    int asked = v == "true" ? 1 : v == "false" ? 0 : std::stoi(v);
    int had = key == "num_workers"          ? recorded.num_workers
              : key == "prefetch_factor"    ? recorded.prefetch_factor
              : key == "persistent_workers" ? recorded.persistent_workers
              : key == "pin_memory"         ? recorded.pin_memory
                                            : recorded.threads;
    if (had != asked)
      return had < 0 ? fmt::format("the run did not record its {} ({} was asked)", key, v)
                     : fmt::format("{} {} was asked, the run had {}", key, v, had);
  }
  return "";
}

}  // namespace fullburn
