// Host metrics from /proc: CPU shares from /proc/stat, memory from
// /proc/meminfo, swap from /proc/vmstat, disks from /proc/diskstats, network
// from /proc/net/dev, load from /proc/loadavg. Rates come from the difference
// of two readings, so the first Collect() has them absent.
#include <algorithm>
#include <cstdio>

#include "fullburn/telemetry.h"
#include "parse.h"

namespace fullburn {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Value of "Key:   123 kB" in /proc/meminfo, in bytes.
std::optional<double> MeminfoBytes(const std::string& text, const char* key) {
  std::string needle = std::string(key) + ":";
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string::npos && pos > 0 && text[pos - 1] != '\n')
    pos += needle.size();
  if (pos == std::string::npos) return std::nullopt;
  const char* p = text.data() + pos + needle.size();
  uint64_t kb = 0;
  if (!parse::U64(&p, text.data() + text.size(), &kb)) return std::nullopt;
  return kb * 1024.0;
}

std::optional<uint64_t> VmstatValue(const std::string& text, const char* key) {
  uint64_t v = 0;
  if (parse::KeyValue(text, key, &v)) return v;
  return std::nullopt;
}

bool IsWholeDiskName(const std::string& name) {
  return !(StartsWith(name, "loop") || StartsWith(name, "ram") || StartsWith(name, "dm-") ||
           StartsWith(name, "md") || StartsWith(name, "zram") || StartsWith(name, "sr"));
}

Value Rate(const std::optional<uint64_t>& now, const std::optional<uint64_t>& before, double dt,
           double scale) {
  if (!now || !before || dt <= 0 || *now < *before) return std::nullopt;
  return static_cast<double>(*now - *before) * scale / dt;
}

CpuShare Share(uint64_t user, uint64_t system,
                      uint64_t iowait, uint64_t steal, uint64_t idle) {
  CpuShare s;
  double total = static_cast<double>(user + system + iowait + steal + idle);
  if (total <= 0) return s;
  s.user = 100.0 * user / total;
  s.system = 100.0 * system / total;
  s.iowait = 100.0 * iowait / total;
  s.steal = 100.0 * steal / total;
  s.util = 100.0 * (user + system + steal) / total;
  return s;
}

}  // namespace

void HostCollector::ReadCpu(Counters* c) {
  Result<std::string> stat = env_->ReadFile("/proc/stat");
  if (!stat.ok()) return;
  const char* p = stat->data();
  const char* end = p + stat->size();
  for (; p < end && std::strncmp(p, "cpu", 3) == 0; p = parse::NextLine(p, end)) {
    const char* q = p;
    const char* word;
    size_t len;
    parse::Word(&q, end, &word, &len);
    uint64_t v[8];
    bool ok = true;
    for (uint64_t& x : v) ok = ok && parse::U64(&q, end, &x);
    if (!ok) continue;
    c->cpus.push_back(CpuTicks{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]});
  }
}

void HostCollector::ReadCounters(Counters* c) {
  if (Result<std::string> vm = env_->ReadFile("/proc/vmstat"); vm.ok()) {
    c->swap_in = VmstatValue(*vm, "pswpin");
    c->swap_out = VmstatValue(*vm, "pswpout");
  }
  if (!disks_listed_) {
    disks_listed_ = true;
    if (auto names = env_->ListDir("/sys/block"); names.ok())
      for (const std::string& n : *names)
        if (IsWholeDiskName(n)) whole_disks_.push_back(n);
  }
  if (Result<std::string> disk = env_->ReadFile("/proc/diskstats"); disk.ok()) {
    uint64_t rd = 0, wr = 0;
    std::vector<std::string> seen;
    const char* end = disk->data() + disk->size();
    for (const char* p = disk->data(); p < end; p = parse::NextLine(p, end)) {
      const char* q = p;
      uint64_t major, minor, v[7];
      const char* word;
      size_t len;
      if (!parse::U64(&q, end, &major) || !parse::U64(&q, end, &minor) ||
          !parse::Word(&q, end, &word, &len))
        continue;
      bool ok = true;
      for (uint64_t& x : v) ok = ok && parse::U64(&q, end, &x);
      if (!ok) continue;
      std::string name(word, len);
      bool whole = false;
      if (!whole_disks_.empty()) {
        for (const std::string& d : whole_disks_) whole |= (d == name);
      } else if (IsWholeDiskName(name)) {
        // No /sys/block: a name that extends an earlier one is its partition.
        whole = true;
        for (const std::string& d : seen) whole &= !StartsWith(name, d.c_str());
        if (whole) seen.push_back(name);
      }
      if (!whole) continue;
      rd += v[2];  // sectors read
      wr += v[6];  // sectors written
    }
    c->disk_read_sectors = rd;
    c->disk_write_sectors = wr;
  }
  if (Result<std::string> net = env_->ReadFile("/proc/net/dev"); net.ok()) {
    uint64_t rx = 0, tx = 0;
    bool any = false;
    const char* end = net->data() + net->size();
    for (const char* p = net->data(); p < end; p = parse::NextLine(p, end)) {
      const char* line_end = parse::NextLine(p, end);
      const char* colon = static_cast<const char*>(std::memchr(p, ':', static_cast<size_t>(line_end - p)));
      if (!colon) continue;  // the two header lines
      const char* name = parse::SkipSpaces(p, colon);
      if (colon - name == 2 && std::strncmp(name, "lo", 2) == 0) continue;
      const char* q = colon + 1;
      uint64_t v[9];
      bool ok = true;
      for (uint64_t& x : v) ok = ok && parse::U64(&q, line_end, &x);
      if (!ok) continue;
      rx += v[0];
      tx += v[8];
      any = true;
    }
    if (any) {
      c->net_rx = rx;
      c->net_tx = tx;
    }
  }
}

void HostCollector::ReadMemory(HostSample* out) {
  Result<std::string> mem = env_->ReadFile("/proc/meminfo");
  if (!mem.ok()) return;
  out->mem_total_bytes = MeminfoBytes(*mem, "MemTotal");
  out->mem_available_bytes = MeminfoBytes(*mem, "MemAvailable");
  if (out->mem_total_bytes && out->mem_available_bytes)
    out->mem_used_bytes = *out->mem_total_bytes - *out->mem_available_bytes;
}

void HostCollector::ReadLoad(HostSample* out) {
  Result<std::string> load = env_->ReadFile("/proc/loadavg");
  if (!load.ok()) return;
  double a = 0, b = 0, c = 0;
  if (std::sscanf(load->c_str(), "%lf %lf %lf", &a, &b, &c) == 3) {
    out->load1 = a;
    out->load5 = b;
    out->load15 = c;
  }
}

void HostCollector::ReadQuota(double now, HostSample* out) {
  if (now - quota_checked_ >= 5) {
    CpuQuota q = FindCpuQuota(*env_);
    if (q.dir != quota_.dir) last_periods_.reset();
    quota_ = q;
    quota_checked_ = now;
  }
  if (quota_.cpus <= 0) return;
  out->cpu_quota = quota_.cpus;
  Result<std::string> stat = env_->ReadFile(quota_.dir + "/cpu.stat");
  uint64_t periods = 0, throttled = 0;
  if (!stat.ok() || !parse::KeyValue(*stat, "nr_periods", &periods) ||
      !parse::KeyValue(*stat, "nr_throttled", &throttled))
    return;
  if (last_periods_ && periods > last_periods_->first && throttled >= last_periods_->second)
    out->cpu_throttled = 100.0 * static_cast<double>(throttled - last_periods_->second) /
                         static_cast<double>(periods - last_periods_->first);
  last_periods_ = std::make_pair(periods, throttled);
}

void HostCollector::Collect(HostSample* out) {
  Counters now;
  now.time = env_->MonotonicSeconds();
  ReadCpu(&now);
  ReadCounters(&now);
  ReadMemory(out);
  ReadLoad(out);
  ReadQuota(now.time, out);
  if (last_) {
    const Counters& was = *last_;
    double dt = now.time - was.time;
    size_t n = std::min(now.cpus.size(), was.cpus.size());
    for (size_t i = 0; i < n; ++i) {
      const CpuTicks& a = now.cpus[i];
      const CpuTicks& b = was.cpus[i];
      auto d = [](uint64_t x, uint64_t y) { return x >= y ? x - y : 0; };
      CpuShare s = Share(d(a.user + a.nice, b.user + b.nice),
                         d(a.system + a.irq + a.softirq, b.system + b.irq + b.softirq),
                         d(a.iowait, b.iowait), d(a.steal, b.steal), d(a.idle, b.idle));
      if (i == 0)
        out->cpu = s;
      else
        out->cores.push_back(s);
    }
    out->swap_in_per_s = Rate(now.swap_in, was.swap_in, dt, 1.0);
    out->swap_out_per_s = Rate(now.swap_out, was.swap_out, dt, 1.0);
    out->disk_read_bytes_per_s = Rate(now.disk_read_sectors, was.disk_read_sectors, dt, 512.0);
    out->disk_write_bytes_per_s = Rate(now.disk_write_sectors, was.disk_write_sectors, dt, 512.0);
    out->net_rx_bytes_per_s = Rate(now.net_rx, was.net_rx, dt, 1.0);
    out->net_tx_bytes_per_s = Rate(now.net_tx, was.net_tx, dt, 1.0);
  }
  last_ = std::move(now);
}

}  // namespace fullburn
