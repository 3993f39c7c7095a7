// The knobs `fullburn tune` turns, the values it tries, and their order.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "fullburn/config.h"
#include "fullburn/tune.h"

namespace fullburn {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string Text(int64_t v) { return std::to_string(v); }
std::string Text(bool v) { return v ? "true" : "false"; }

// One override per value, the current value left out, in the order given.
std::vector<Candidate> Values(const std::string& key, const std::vector<std::string>& values,
                              const std::string& current) {
  std::vector<Candidate> out;
  std::set<std::string> seen = {current};
  for (const std::string& v : values) {
    if (!seen.insert(v).second) continue;
    std::string shown =
        v == "0" && (key == "data.threads" || key == "data.prefetch" || key == "train.threads")
            ? "0 (auto)"
            : v;
    out.push_back({shown, {{key, v}}, std::nullopt});
  }
  return out;
}

std::vector<Candidate> BatchCandidates(const TuneContext& ctx, std::string* skip) {
  const TrainSettings& s = ctx.settings;
  if (s.train.batch_size.automatic) {
    *skip = "train.batch_size is already auto (searched)";
    return {};
  }
  int64_t batch = s.train.batch_size.value,
          accumulate = std::max<int64_t>(1, s.train.accumulate);
  int64_t effective = batch * accumulate;
  if (!ctx.keep_effective_batch)
    return {{"auto (largest that fits)", {{"train.batch_size", "auto"}}, std::nullopt}};
  if (accumulate == 1) {
    *skip = "the effective batch (" + std::to_string(effective) +
            ") is already one micro-batch; --free-batch lets the search change it";
    return {};
  }
  return {{"auto (<= " + std::to_string(effective) + ")",
           {{"train.batch_size", "auto"},
            {"train.max_batch_size", std::to_string(effective)},
            {"train.accumulate", "1"}},
           std::nullopt}};
}

// The images as a raw pack in the tuning's directory; the held-out split
// stays where it was (an empty data.path meant the default's split too).
std::vector<Candidate> PackCandidates(const TuneContext& ctx, std::string* skip) {
  const std::string &source = ctx.settings.data.source, &src = ctx.data_path;
  if (!ctx.input_bound && !ctx.knobs_chosen) {
    *skip = "the input pipeline is not the bottleneck";
  } else if (source != "images") {
    *skip = "data.source = " + source + " has no images to pack";
  } else if (ctx.data_is_pack) {
    *skip = "the data is already a pack";
  } else if (src.empty() || ctx.pack_dir.empty()) {
    *skip = "the runs do not record where their images are";
  } else {
    int side = PackMaxSide(static_cast<int>(ctx.settings.data.image_size));
    Candidate c{"raw, max side " + std::to_string(side),
                {{"data.path", ctx.pack_dir}},
                PackJob{src, ctx.pack_dir, side}};
    if (ctx.settings.data.val_path.empty() && !ctx.val_path.empty())
      c.overrides["data.val_path"] = ctx.val_path;
    return {c};
  }
  return {};
}

}  // namespace

int PackMaxSide(int image_size) { return 2 * std::max(1, image_size); }

const std::vector<KnobDef>& TuneKnobs() {
  static const std::vector<KnobDef> knobs = {
      {"batch", "train.batch_size",
       "Micro-batch from the batch-size search; train.accumulate keeps the effective batch"},
      {"loader_threads", "data.threads", "Loader worker threads"},
      {"prefetch", "data.prefetch", "Batches the loader prepares ahead"},
      {"threads", "train.threads", "Intra-op threads of the training step"},
      {"precision", "train.precision", "bf16 (and fp16 on CUDA) autocast"},
      {"channels_last", "model.channels_last", "Channels-last memory format (ResNets)"},
      {"pack", "data.path",
       "A packed copy of the images (decoded pixels read through mmap: no JPEG decoding), when the "
       "input pipeline "
       "is the bottleneck"},
      {"cache", "data.cache_mb",
       "RAM cache of encoded images, when the input pipeline is the bottleneck"},
      {"cudnn_benchmark", "train.cudnn_benchmark",
       "cuDNN picks the fastest convolution algorithms (CUDA)"},
      {"cuda_graphs", "", "The whole step captured in a CUDA graph (CUDA)"},
  };
  return knobs;
}

Result<std::vector<std::string>> ParseKnobList(const std::string& csv) {
  return ParseKnobList(csv, TuneKnobs());
}

Result<std::vector<std::string>> ParseKnobList(const std::string& csv,
                                               const std::vector<KnobDef>& knobs) {
  std::vector<std::string> out;
  std::string names;
  for (const KnobDef& k : knobs) names += (names.empty() ? "" : ", ") + std::string(k.name);
  size_t pos = 0;
  while (pos <= csv.size()) {
    size_t comma = csv.find(',', pos);
    std::string name =
        csv.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? csv.size() + 1 : comma + 1;
    if (name.empty()) continue;
    auto it = std::find_if(knobs.begin(), knobs.end(),
                           [&](const KnobDef& k) { return name == k.name || name == k.key; });
    if (it == knobs.end()) {
      std::string best;
      size_t best_d = 4;
      for (const KnobDef& k : knobs) {
        size_t d = std::min(EditDistance(name, k.name), EditDistance(name, k.key));
        if (d < best_d) best_d = d, best = k.name;
      }
      // Named as a config key would be ("batch_size", "num_workers"): the
      // knob that sets the key it is closest to.
      if (best.empty()) {
        std::string key = ClosestOption(name);
        for (const KnobDef& k : knobs)
          if (!key.empty() && key == k.key) best = k.name;
      }
      return Status::InvalidArgument("unknown knob '" + name + "'" +
                                     (best.empty() ? "" : " (did you mean '" + best + "'?)") +
                                     "; knobs: " + names);
    }
    if (std::find(out.begin(), out.end(), it->name) == out.end()) out.push_back(it->name);
  }
  if (out.empty()) return Status::InvalidArgument("--knobs names no knob; knobs: " + names);
  return out;
}

Status CheckPackSpace(size_t images, int max_side, double free_bytes, const std::string& dir) {
  double most = static_cast<double>(images) * max_side * max_side * 3;
  if (most <= free_bytes / 2) return Status::Ok();
  return Status::IoError(
      fmt::format("a raw pack of {} images may need {:.1f} GiB and {} has {:.1f} GiB free: "
                  "pack by hand elsewhere (fullburn pack) and set data.path",
                  images, most / (1 << 30), dir, free_bytes / (1 << 30)));
}

std::vector<Candidate> KnobCandidates(const std::string& knob, const TuneContext& ctx,
                                      std::string* skip) {
  skip->clear();
  int cores = std::max(1, ctx.cores);
  auto n = [](int v) { return std::to_string(std::max(1, v)); };
  const TrainSettings& s = ctx.settings;
  std::vector<Candidate> out;
  if (knob == "batch") {
    out = BatchCandidates(ctx, skip);
  } else if (knob == "loader_threads") {
    out = Values("data.threads", {"0", n(cores / 2), n(cores - 1), n(cores)},
                 Text(s.data.threads));
  } else if (knob == "prefetch") {
    out = Values("data.prefetch", {"0", "2", "8"}, Text(s.data.prefetch));
  } else if (knob == "threads") {
    // Trials run one process, for which 0 (auto) is every core: one trial of it, not two.
    out = Values("train.threads", {n(cores / 2), n(cores - 1), n(cores)},
                 s.train.threads == 0 ? n(cores) : Text(s.train.threads));
  } else if (knob == "precision") {
    std::vector<std::string> v =
        ctx.cuda ? std::vector<std::string>{"bf16", "fp16"} : std::vector<std::string>{"bf16"};
    out = Values("train.precision", v, s.train.precision);
  } else if (knob == "channels_last") {
    if (s.model.name.rfind("resnet", 0) != 0)
      *skip = "only ResNets have a channels-last option";
    else
      out = Values("model.channels_last", {Text(!s.model.channels_last)},
                   Text(s.model.channels_last));
  } else if (knob == "pack") {
    out = PackCandidates(ctx, skip);
  } else if (knob == "cache") {
    const std::string& source = s.data.source;
    int64_t mb = static_cast<int64_t>(std::min(8192.0, ctx.host_memory_bytes / 4 / kMiB));
    if (!ctx.input_bound && !ctx.knobs_chosen)
      *skip = "the input pipeline is not the bottleneck";
    else if (source != "images")
      *skip = "data.source = " + source + " has nothing to decode and cache";
    else if (ctx.data_is_pack)
      *skip = "the data is a pack, which the page cache already holds";
    else if (mb < 64 || s.data.cache_mb >= mb)
      *skip = "no room for a larger cache";
    else
      out = Values("data.cache_mb", {std::to_string(mb)}, Text(s.data.cache_mb));
  } else if (knob == "cudnn_benchmark") {
    if (!ctx.cuda)
      *skip = "CPU trials: no cuDNN";
    else
      out = Values("train.cudnn_benchmark", {"true"}, Text(s.train.cudnn_benchmark));
  } else if (knob == "cuda_graphs") {
    if (!ctx.cuda)
      *skip = "CPU trials: no CUDA graphs";
    else
      out = Values("train.cuda_graphs", {"true"}, Text(s.train.cuda_graphs));
  } else {
    *skip = "unknown knob";
  }
  if (out.empty() && skip->empty()) *skip = "already at every value tried";
  return out;
}

bool InputBound(const std::vector<Finding>& findings) {
  for (const Finding& f : findings)
    if (f.cause != CauseId::kHealthy && f.cause != CauseId::kJobFailed)
      return CauseOf(f.cause).input_bound;
  return false;
}

std::vector<std::string> OnlySelected(std::vector<std::string> order,
                                      const std::vector<std::string>& selected) {
  if (selected.empty()) return order;
  std::vector<std::string> out;
  for (const std::string& k : order)
    if (std::find(selected.begin(), selected.end(), k) != selected.end()) out.push_back(k);
  return out;
}

std::vector<std::string> KnobOrder(const std::vector<Finding>& findings,
                                   const std::vector<std::string>& selected) {
  if (InputBound(findings)) {
    // The input causes' own knobs first, in the catalog's order, then the rest.
    std::vector<std::string> order;
    for (const Cause& c : Causes())
      if (c.input_bound && *c.tune_knob) order.push_back(c.tune_knob);
    for (const char* k : {"batch", "threads", "precision", "channels_last", "cudnn_benchmark",
                          "cuda_graphs"})
      order.push_back(k);
    return OnlySelected(order, selected);
  }
  return OnlySelected({"batch", "precision", "channels_last", "cudnn_benchmark", "cuda_graphs",
                       "threads", "loader_threads", "prefetch", "pack", "cache"},
                      selected);
}

std::pair<int64_t, int64_t> KeepEffectiveBatch(int64_t searched, int64_t effective) {
  if (effective <= 0 || searched <= 0) return {std::max<int64_t>(1, searched), 1};
  for (int64_t m = std::min(searched, effective); m > 1; --m)
    if (effective % m == 0) return {m, effective / m};
  return {1, effective};
}

}  // namespace fullburn
