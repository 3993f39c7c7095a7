// Terminal renderings: the end-of-run summary, the live status line of
// `fullburn run`, and the frames of `fullburn watch`.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <ctime>

#include "fullburn/percent.h"
#include "fullburn/report.h"

namespace fullburn {

std::string FormatBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string FormatLocalTime(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string JoinedCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

std::string FormatDuration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  long t = std::lround(s);
  if (t < 3600) return fmt::format("{}m {:02}s", t / 60, t % 60);
  return fmt::format("{}h {:02}m {:02}s", t / 3600, (t % 3600) / 60, t % 60);
}

std::string DescribeExitCode(int code) {
  std::string out = fmt::format("exit code {}", code);
  switch (code - 128) {
    case SIGHUP:
      return out + " (SIGHUP: the terminal or session went away)";
    case SIGINT:
      return out + " (SIGINT: interrupted, Ctrl-C)";
    case SIGABRT:
      return out + " (SIGABRT: aborted, e.g. a failed assertion or an uncaught C++ exception)";
    case SIGKILL:
      return out + " (SIGKILL: killed, often by the kernel's OOM killer: see dmesg)";
    case SIGSEGV:
      return out + " (SIGSEGV: crashed on a bad memory access)";
    case SIGTERM:
      return out + " (SIGTERM: asked to stop, e.g. by a scheduler's time limit)";
    default:
      return out;
  }
}

namespace {

std::string FormatValue(double v, const std::string& unit) {
  if (unit == "bytes") return FormatBytes(v);
  if (unit == "bytes/s") return FormatBytes(v) + "/s";
  if (unit == "%") return fmt::format("{:.0f} %", v);
  if (unit.empty()) return v == std::floor(v) ? fmt::format("{:.0f}", v) : fmt::format("{:.2f}", v);
  if (unit == "cpus") return fmt::format("{:g} cpus", v);  // a quota of 0.5 or 2.5 CPUs
  return fmt::format("{:.0f} {}", v, unit);
}

std::string Opt(const Value& v, const std::string& unit) { return v ? FormatValue(*v, unit) : "-"; }

bool InSummary(const std::string& name) {
  static const char* skip[] = {"throttle_reasons", "max_sm_clock_mhz", "mem_total_bytes",
                               "host.cpu_user", "host.cpu_system", "host.cpu_steal",
                               "host.mem_available_bytes", "host.load5", "host.load15"};
  if (name.rfind("host.cpu", 0) == 0 && name.size() > 8 && std::isdigit(name[8])) return false;
  for (const char* s : skip)
    if (name.find(s) != std::string::npos) return false;
  return true;
}

// A bar of `width` cells filled to `pct` percent.
std::string Bar(const Value& pct, int width) {
  if (!pct) return "[" + std::string(width, '?') + "]";
  int fill = static_cast<int>(std::lround(std::clamp(*pct, 0.0, 100.0) / 100.0 * width));
  return "[" + std::string(fill, '|') + std::string(width - fill, ' ') + "]";
}

std::string ShareText(const std::optional<double>& share) {
  return share ? Percent(*share) : "-";
}

}  // namespace

std::string RenderSummary(const RunInfo& run, const RunSummary& sum, const std::string& gpu_note) {
  std::string out = fmt::format("\nfullburn: run {} \"{}\" {} after {}", run.id, run.name, run.status,
                                FormatDuration(sum.wall_s));
  if (run.exit_code) out += ", " + DescribeExitCode(*run.exit_code);
  out += "\n";
  out += fmt::format("  {:<30} {:>12} {:>12} {:>12}\n", "metric", "median", "p95", "max");
  for (const auto& [name, s] : sum.stats) {
    if (!InSummary(name)) continue;
    out += fmt::format("  {:<30} {:>12} {:>12} {:>12}\n", name, FormatValue(s.median, s.unit),
                       FormatValue(s.p95, s.unit), FormatValue(s.max, s.unit));
  }
  for (const GpuRunSummary& g : sum.gpus) {
    if (g.used_by_job == false) {
      out += fmt::format("  GPU {}: not used by this job (none of its processes ran there)\n",
                         g.index);
      continue;
    }
    out += fmt::format("  GPU {}: utilization under 50% for {} of the time", g.index,
                       ShareText(g.low_util_share));
    if (g.peak_mem_bytes) {
      out += "; peak memory " + FormatBytes(*g.peak_mem_bytes);
      if (g.mem_total_bytes) out += " of " + FormatBytes(*g.mem_total_bytes);
    }
    if (g.peak_proc_mem_bytes) out += " (this job: " + FormatBytes(*g.peak_proc_mem_bytes) + ")";
    if (g.throttled_share) {
      out += fmt::format("; throttled {} of the time ({})", ShareText(g.throttled_share),
                         FormatDuration(*g.throttled_share * sum.wall_s));
      if (!g.throttle_reasons_seen.empty())
        out += ": " + fmt::format("{}", fmt::join(g.throttle_reasons_seen, ", "));
    }
    out += "\n";
  }
  if (sum.gpus.empty()) out += "  GPU: no readings" + (gpu_note.empty() ? "" : " (" + gpu_note + ")") + "\n";
  return out;
}

std::string RenderLiveLine(const Snapshot& s, double elapsed, const std::string& steps) {
  std::string line = fmt::format("fullburn {:>7}", FormatDuration(elapsed)) + steps;
  // Once the job holds memory on a GPU, the line shows only the GPUs it holds
  // (as the diagnosis counts them): a one-GPU job on an eight-GPU node fits.
  bool job_seen = false;
  for (const GpuSample& g : s.gpus) job_seen = job_seen || g.proc_mem_used_bytes.value_or(0) > 0;
  int others = 0;
  for (const GpuSample& g : s.gpus) {
    if (job_seen && g.proc_mem_used_bytes && *g.proc_mem_used_bytes <= 0) {
      ++others;
      continue;
    }
    line += fmt::format(" | gpu{} {}", g.index, Opt(g.util, "%"));
    if (g.tensor_active) line += fmt::format(" tensor {:.0f}%", *g.tensor_active);
    if (g.mem_used_bytes) line += " " + FormatBytes(*g.mem_used_bytes);
    if (g.power_w) line += fmt::format(" {:.0f}W", *g.power_w);
  }
  if (others) line += fmt::format(" (+{} not the job's)", others);
  if (s.gpus.empty()) line += " | gpu n/a";
  line += " | cpu " + Opt(s.host.cpu.util, "%");
  if (s.proc)
    line += fmt::format(" | job {} {} {}p/{}t", Opt(s.proc->cpu_util, "%"),
                        Opt(s.proc->rss_bytes, "bytes"), s.proc->processes.value_or(0),
                        s.proc->threads.value_or(0));
  return line;
}

std::string RenderWatchFrame(const Snapshot& s, const std::vector<GpuInfo>& gpus,
                             const std::string& gpu_note, int width) {
  int bar = std::max(10, std::min(40, width - 70));
  std::string out;
  for (const GpuSample& g : s.gpus) {
    std::string name;
    for (const GpuInfo& i : gpus)
      if (i.index == g.index) name = i.name;
    out += fmt::format("GPU {} {}  {}  {}  {} / {} W  clock {} / {}\n", g.index, name,
                       Opt(g.temp_c, "C"), g.throttle_reasons && IsThrottled(static_cast<uint64_t>(*g.throttle_reasons))
                           ? "THROTTLED: " + fmt::format("{}", fmt::join(DecodeThrottleReasons(static_cast<uint64_t>(*g.throttle_reasons)), ","))
                           : std::string("not throttled"),
                       Opt(g.power_w, ""), Opt(g.power_limit_w, ""), Opt(g.sm_clock_mhz, "MHz"),
                       Opt(g.max_sm_clock_mhz, "MHz"));
    out += fmt::format("  util {} {:>5}", Bar(g.util, bar), Opt(g.util, "%"));
    if (g.sm_active) out += fmt::format("  SM active {}", Opt(g.sm_active, "%"));
    if (g.sm_occupancy) out += fmt::format("  occupancy {}", Opt(g.sm_occupancy, "%"));
    out += "\n";
    if (g.tensor_active)
      out += fmt::format("  tensor {} (hmma {} imma {} dfma {})  fp16 {} fp32 {} fp64 {}  dram {}\n",
                         Opt(g.tensor_active, "%"), Opt(g.tensor_hmma_active, "%"),
                         Opt(g.tensor_imma_active, "%"), Opt(g.tensor_dfma_active, "%"),
                         Opt(g.fp16_active, "%"), Opt(g.fp32_active, "%"),
                         Opt(g.fp64_active, "%"), Opt(g.dram_active, "%"));
    Value mem_pct;
    if (g.mem_used_bytes && g.mem_total_bytes && *g.mem_total_bytes > 0)
      mem_pct = 100.0 * *g.mem_used_bytes / *g.mem_total_bytes;
    out += fmt::format("  mem  {} {} / {}\n", Bar(mem_pct, bar), Opt(g.mem_used_bytes, "bytes"),
                       Opt(g.mem_total_bytes, "bytes"));
    out += fmt::format("  PCIe tx {}  rx {}  mem-ctrl {}\n", Opt(g.pcie_tx_bytes_per_s, "bytes/s"),
                       Opt(g.pcie_rx_bytes_per_s, "bytes/s"), Opt(g.mem_util, "%"));
    for (const GpuProcess& p : g.processes)
      out += fmt::format("    pid {:>7}  {:<20} {}\n", p.pid, p.name, Opt(p.used_memory_bytes, "bytes"));
  }
  if (s.gpus.empty()) out += "GPU: unavailable" + (gpu_note.empty() ? "" : " (" + gpu_note + ")") + "\n";
  const HostSample& h = s.host;
  out += fmt::format("CPU  {} {:>5}  user {} sys {} iowait {} steal {}  load {}\n", Bar(h.cpu.util, bar),
                     Opt(h.cpu.util, "%"), Opt(h.cpu.user, "%"), Opt(h.cpu.system, "%"),
                     Opt(h.cpu.iowait, "%"), Opt(h.cpu.steal, "%"), Opt(h.load1, ""));
  for (size_t i = 0; i < h.cores.size(); ++i)
    out += fmt::format("  cpu{:<3} {} {:>5}\n", i, Bar(h.cores[i].util, bar / 2),
                       Opt(h.cores[i].util, "%"));
  Value mem_pct;
  if (h.mem_used_bytes && h.mem_total_bytes && *h.mem_total_bytes > 0)
    mem_pct = 100.0 * *h.mem_used_bytes / *h.mem_total_bytes;
  out += fmt::format("MEM  {} {} / {}  swap in {} out {}\n", Bar(mem_pct, bar),
                     Opt(h.mem_used_bytes, "bytes"), Opt(h.mem_total_bytes, "bytes"),
                     Opt(h.swap_in_per_s, "pages/s"), Opt(h.swap_out_per_s, "pages/s"));
  out += fmt::format("DISK read {}  write {}   NET rx {}  tx {}\n", Opt(h.disk_read_bytes_per_s, "bytes/s"),
                     Opt(h.disk_write_bytes_per_s, "bytes/s"), Opt(h.net_rx_bytes_per_s, "bytes/s"),
                     Opt(h.net_tx_bytes_per_s, "bytes/s"));
  return out;
}

std::string RenderJobLines(const std::vector<JobNow>& jobs) {
  if (jobs.empty()) return "";
  std::string out = "JOBS recorded here (fullburn run, train, attach)\n";
  for (const JobNow& j : jobs) {
    out += fmt::format("  run {:<5} {:<24.24}", j.run.id, j.run.name);
    if (j.step) out += fmt::format("  step {}", *j.step);
    if (j.loss) out += fmt::format("  loss {:.4f}", *j.loss);
    if (j.samples_per_s) out += fmt::format("  {:.0f} samples/s", *j.samples_per_s);
    if (j.data_wait_share) out += fmt::format("  data-wait {:.0f}%", *j.data_wait_share * 100);
    if (j.mfu) out += fmt::format("  MFU {}", Percent(*j.mfu));
    if (!j.step) out += "  no steps recorded";
    out += RenderLiveFinding(j.now) + "\n";
  }
  return out;
}

}  // namespace fullburn
