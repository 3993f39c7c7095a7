// The report as text for a terminal and as JSON; both read the same structs.
#include <fmt/format.h>

#include "fullburn/analyze.h"
#include "fullburn/percent.h"

namespace fullburn {
namespace {

// Traces time every op to the microsecond: one decimal.
std::string Pct(double part, double whole) { return PercentOf(part, whole, 1); }
std::string Ms(double us) { return fmt::format("{:.1f} ms", us / 1e3); }

// A kernel's name without its template and function arguments, as HTA's
// shorten_name does: "vectorized_elementwise_kernel" for the whole signature.
std::string ShortName(const std::string& name) {
  std::string out;
  int angle = 0, paren = 0;
  for (char c : name) {
    if (c == '<') {
      ++angle;
    } else if (c == '>' && angle > 0) {
      --angle;
    } else if (c == '(') {
      ++paren;
    } else if (c == ')' && paren > 0) {
      --paren;
    } else if (angle == 0 && paren == 0) {
      out.push_back(c);
    }
  }
  size_t space = out.find_last_of(' ');
  if (space != std::string::npos && space + 1 < out.size()) out = out.substr(space + 1);
  if (out.empty()) out = name.substr(0, 60);
  return out;
}

std::string Causes(const HostCauses& c, double whole) {
  std::string out = fmt::format(
      "data loader {} · sync {} · blocking copy {} · optimizer {} · between steps {} · other {}",
      Pct(c.data_loader_us, whole), Pct(c.sync_us, whole), Pct(c.blocking_copy_us, whole),
      Pct(c.optimizer_us, whole), Pct(c.between_steps_us, whole), Pct(c.other_us, whole));
  if (c.collective_us > 0) out += " · Gloo collectives " + Pct(c.collective_us, whole);
  if (c.queued_us > 0) out += " · next op already queued " + Pct(c.queued_us, whole);
  return out;
}

void RenderGpu(const RankReport& r, std::string* out) {
  const TemporalBreakdown& t = r.temporal;
  *out +=
      fmt::format("  temporal (HTA) over the kernel span {}: idle {}, compute {}, non-compute {}\n",
                  Ms(t.span_us), Pct(t.idle_us, t.span_us), Pct(t.compute_us, t.span_us),
                  Pct(t.non_compute_us, t.span_us));
  *out += "  GPU idle while the host was in: " + Causes(r.idle_causes, t.span_us) + "\n";
  *out += "  idle per stream (HTA: host wait / kernel wait < 30 us / other):\n";
  for (const StreamIdle& s : r.streams) {
    *out += fmt::format("    device {} stream {}: {} ops; host wait {}, kernel wait {}, other {}\n",
                        s.device, s.stream, s.ops, Ms(s.host_wait_us), Ms(s.kernel_wait_us),
                        Ms(s.other_us));
    if (s.host_wait_us > 0)
      *out += "      host wait in: " + Causes(s.host_causes, s.host_wait_us) + "\n";
  }
  *out += "  kernels:";
  for (const ClassTime& c : r.classes)
    *out += fmt::format(" {} {} ({} ops, {} merged);", KernelClassName(c.cls),
                        Pct(c.merged_us, t.span_us), c.count, Ms(c.merged_us));
  *out += "\n";
  *out += fmt::format("    {:>8} {:>10} {:>9} {:>9}  {}\n", "count", "total ms", "mean us",
                      "max us", "kernel");
  for (const KernelStat& k : r.top_kernels)
    *out += fmt::format("    {:>8} {:>10.1f} {:>9.1f} {:>9.0f}  {}\n", k.count, k.total_us / 1e3,
                        k.mean_us, k.max_us, ShortName(k.name));
  if (!r.gemm_math_us.empty()) {
    double kernels = 0;
    for (const ClassTime& c : r.classes) kernels += c.total_us;
    *out += "  matmuls and convolutions by math (kernel names):";
    for (const auto& [math, us] : r.gemm_math_us)
      *out += fmt::format(" {} {} ({} of kernel time);", KernelMathName(math), Ms(us), Pct(us, kernels));
    *out += "\n";
  }
  const LaunchStats& l = r.launches;
  if (l.launches > 0)
    *out += fmt::format(
        "  launches: {}; CPU launch median {:.0f} us (mean {:.1f}), GPU median {:.0f} us, "
        "launch delay median {:.0f} us (p95 {:.0f}); {} of ops shorter than their launch\n",
        l.launches, l.cpu_median_us, l.cpu_mean_us, l.gpu_median_us, l.delay_median_us,
        l.delay_p95_us, Pct(l.shorter_than_launch, 1));
  for (const CopyStats& c : r.copies)
    *out += fmt::format(
        "  copies {}: {} x, {:.1f} MB in {} at {:.1f} GB/s; {} from pageable memory, {} "
        "synchronous\n",
        c.direction, c.count, c.bytes / 1e6, Ms(c.us), c.GBps(), c.pageable, c.synchronous);
  if (r.comm.kernels > 0)
    *out += fmt::format("  communication: {} kernels, {} merged, {} overlapped by computation\n",
                        r.comm.kernels, Ms(r.comm.comm_us), Pct(r.comm.overlap_us, r.comm.comm_us));
}

void RenderHost(const RankReport& r, std::string* out) {
  const HostSummary& h = r.host;
  *out += fmt::format("  host: {} steps, {} analysed; data loader {}, optimizer {}, syncs {}\n",
                      r.steps.size(), Ms(h.window_us), Pct(h.data_loader_us, h.window_us),
                      Pct(h.optimizer_us, h.window_us), Pct(h.sync_us, h.window_us));
  if (!h.data_loader_name.empty())
    *out += fmt::format("    data loader: {} x {}\n", h.data_loader_spans, h.data_loader_name);
  for (const auto& [label, n] : h.syncs) *out += fmt::format("    sync: {} x{}\n", label, n);
  for (const auto& [site, n] : h.sync_sites) *out += fmt::format("    called at {} x{}\n", site, n);
}

void RenderRank(const RankReport& r, bool with_findings, std::string* out) {
  *out += fmt::format("rank {}{}  {}{}\n", r.rank,
                      r.world_size > 1 ? fmt::format(" of {}", r.world_size) : "", r.path,
                      r.device_name.empty() ? "" : "  (" + r.device_name + ")");
  *out +=
      fmt::format("  window: {}; {} events, {} GPU ops analysed\n", r.window, r.events, r.gpu_ops);
  if (r.gpu_ops > 0) RenderGpu(r, out);
  RenderHost(r, out);
  for (const std::string& n : r.notes) *out += "  note: " + n + "\n";
  if (with_findings) *out += RenderFindings(r.findings, 10);
}

nlohmann::json CausesJson(const HostCauses& c) {
  return {{"queued_us", c.queued_us},       {"data_loader_us", c.data_loader_us},
          {"sync_us", c.sync_us},           {"blocking_copy_us", c.blocking_copy_us},
          {"optimizer_us", c.optimizer_us}, {"between_steps_us", c.between_steps_us},
          {"other_us", c.other_us},         {"collective_us", c.collective_us}};
}

nlohmann::json RankJson(const RankReport& r) {
  nlohmann::json j;
  j["path"] = r.path;
  j["rank"] = r.rank;
  j["world_size"] = r.world_size;
  j["rank_from_trace"] = r.rank_from_trace;
  j["device_name"] = r.device_name;
  j["events"] = r.events;
  j["has_gpu"] = r.has_gpu;
  j["window"] = r.window;
  j["gpu_ops"] = r.gpu_ops;
  j["steps"] = nlohmann::json::array();
  for (const StepSpan& s : r.steps)
    j["steps"].push_back({{"number", s.number}, {"start_us", s.start_us}, {"dur_us", s.dur_us}});
  const TemporalBreakdown& t = r.temporal;
  j["temporal"] = {{"span_us", t.span_us},
                   {"idle_us", t.idle_us},
                   {"compute_us", t.compute_us},
                   {"non_compute_us", t.non_compute_us}};
  j["idle_causes"] = CausesJson(r.idle_causes);
  j["streams"] = nlohmann::json::array();
  for (const StreamIdle& s : r.streams)
    j["streams"].push_back({{"device", s.device},
                            {"stream", s.stream},
                            {"ops", s.ops},
                            {"host_wait_us", s.host_wait_us},
                            {"kernel_wait_us", s.kernel_wait_us},
                            {"other_us", s.other_us},
                            {"host_wait_causes", CausesJson(s.host_causes)}});
  j["classes"] = nlohmann::json::array();
  for (const ClassTime& c : r.classes)
    j["classes"].push_back({{"class", KernelClassName(c.cls)},
                            {"count", c.count},
                            {"total_us", c.total_us},
                            {"merged_us", c.merged_us}});
  j["top_kernels"] = nlohmann::json::array();
  for (const KernelStat& k : r.top_kernels)
    j["top_kernels"].push_back({{"name", k.name},
                                {"class", KernelClassName(k.cls)},
                                {"count", k.count},
                                {"total_us", k.total_us},
                                {"mean_us", k.mean_us},
                                {"min_us", k.min_us},
                                {"max_us", k.max_us}});
  j["gemm_math_us"] = nlohmann::json::object();
  for (const auto& [math, us] : r.gemm_math_us) j["gemm_math_us"][KernelMathKey(math)] = us;
  const LaunchStats& l = r.launches;
  j["launches"] = {{"launches", l.launches},
                   {"cpu_median_us", l.cpu_median_us},
                   {"cpu_mean_us", l.cpu_mean_us},
                   {"gpu_median_us", l.gpu_median_us},
                   {"delay_median_us", l.delay_median_us},
                   {"delay_p95_us", l.delay_p95_us},
                   {"shorter_than_launch", l.shorter_than_launch},
                   {"cpu_over_50us", l.cpu_over_50us},
                   {"delay_over_100us", l.delay_over_100us}};
  j["copies"] = nlohmann::json::array();
  for (const CopyStats& c : r.copies)
    j["copies"].push_back({{"direction", c.direction},
                           {"count", c.count},
                           {"bytes", c.bytes},
                           {"us", c.us},
                           {"GBps", c.GBps()},
                           {"pageable", c.pageable},
                           {"pageable_bytes", c.pageable_bytes},
                           {"synchronous", c.synchronous}});
  j["communication"] = {
      {"kernels", r.comm.kernels}, {"comm_us", r.comm.comm_us}, {"overlap_us", r.comm.overlap_us}};
  const HostSummary& h = r.host;
  j["host"] = {{"window_us", h.window_us},
               {"data_loader_us", h.data_loader_us},
               {"optimizer_us", h.optimizer_us},
               {"sync_us", h.sync_us},
               {"data_loader_spans", h.data_loader_spans},
               {"data_loader_name", h.data_loader_name},
               {"syncs", h.syncs},
               {"sync_sites", h.sync_sites}};
  j["findings"] = FindingsJson(r.findings);
  j["notes"] = r.notes;
  return j;
}

}  // namespace

std::string RenderTraceReport(const TraceReport& rep) {
  std::string out;
  for (const RankReport& r : rep.ranks) {
    RenderRank(r, rep.mixed_runs, &out);
    out += "\n";
  }
  if (rep.cross.compared) {
    out += fmt::format(
        "ranks: rank {} spends the least time in communication ({}, {}); the others "
        "wait for it:",
        rep.cross.straggler, rep.cross.basis, Ms(rep.cross.straggler_comm_us));
    for (const auto& [rank, us] : rep.cross.waited_us)
      out += fmt::format(" rank {} {}", rank, Ms(us));
    out += "\n";
  }
  for (const std::string& n : rep.notes) out += "note: " + n + "\n";
  if (!rep.findings.empty()) out += RenderFindings(rep.findings, 10);
  return out;
}

nlohmann::json TraceReportJson(const TraceReport& rep) {
  nlohmann::json j;
  j["ranks"] = nlohmann::json::array();
  for (const RankReport& r : rep.ranks) j["ranks"].push_back(RankJson(r));
  nlohmann::json waited = nlohmann::json::object();
  for (const auto& [rank, us] : rep.cross.waited_us) waited[std::to_string(rank)] = us;
  j["cross_rank"] = {{"compared", rep.cross.compared},
                     {"straggler", rep.cross.straggler},
                     {"basis", rep.cross.basis},
                     {"straggler_comm_us", rep.cross.straggler_comm_us},
                     {"waited_us", waited},
                     {"note", rep.cross.note}};
  j["mixed_runs"] = rep.mixed_runs;
  j["findings"] = FindingsJson(rep.findings);
  j["notes"] = rep.notes;
  j["errors"] = rep.errors;
  return j;
}

}  // namespace fullburn
