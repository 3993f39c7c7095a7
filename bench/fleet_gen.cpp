// A week of a GPU fleet as `fullburn serve` would have exported it, for
// bench/fleet_query: OpenMetrics text for `promtool tsdb create-blocks-from
// openmetrics`, and (--truth) the GPU-hours of any window recomputed from the
// same samples by brute force, sample by sample.
//
// The fleet: NODES nodes of 8 GPUs scraped every 15 s; JOBS jobs, each on
// one node, up to three after one another per node with free gaps between;
// by kind: held and idle (20%), starved under fullburn run (30%, diagnosed
// input_workers), small batch under fullburn run (10%), busy Slurm jobs
// (30%), busy under fullburn run (10%, healthy). Every fifth node of 25
// throttles half its samples; node 7 misses 3 hours of scrapes, node 42 a
// day. Everything is a function of (node, gpu, sample): no state, no RNG.
//
// usage: fleet_gen --start UNIX [--nodes 125] [--jobs 300] [--days 7] > week.om
//        fleet_gen --start UNIX ... --truth FROM TO      (JSON totals of (FROM, TO])
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr int kGpus = 8;
constexpr int kInterval = 15;

uint64_t Hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^
               (c + 0x165667B19E3779F9ull) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}
double Unit(uint64_t h) { return (h >> 11) * (1.0 / 9007199254740992.0); }

struct Fleet {
  int nodes = 125, jobs = 300, days = 7;
  long long start = 0;  // Unix seconds of sample 0
  long long Samples() const { return static_cast<long long>(days) * 86400 / kInterval; }
};

enum Kind { kIdle, kStarved, kSmall, kBusySlurm, kBusyRun };

Kind KindOf(int job) {
  switch (job % 10) {
    case 0: case 1: return kIdle;
    case 2: case 3: case 4: return kStarved;
    case 5: return kSmall;
    case 9: return kBusyRun;
    default: return kBusySlurm;
  }
}
bool IsRun(Kind k) { return k == kStarved || k == kSmall || k == kBusyRun; }
const char* CauseOf(Kind k) {
  return k == kStarved ? "input_workers" : k == kSmall ? "small_batch" : "healthy";
}

// Job slot s (0..2) of node n covers samples [begin, end): a third of the
// week less a free gap of 1-9 hours before and after.
struct Slot {
  int job = -1;
  long long begin = 0, end = 0;
  int gpus = 0;
};
Slot SlotOf(const Fleet& f, int node, int s) {
  Slot slot;
  int job = node + s * f.nodes;
  if (job >= f.jobs) return slot;
  long long third = f.Samples() / 3;
  long long hour = 3600 / kInterval;
  slot.job = job;
  slot.begin = s * third + (1 + Hash(job, 1, 0) % 9) * hour;
  slot.end = (s + 1) * third - (1 + Hash(job, 2, 0) % 9) * hour;
  static const int kSizes[] = {8, 4, 2, 8, 1};
  slot.gpus = kSizes[Hash(job, 3, 0) % 5];
  return slot;
}

// The job holding GPU g of node n at sample k, or -1.
int HolderAt(const Fleet& f, int n, int g, long long k, Slot* out) {
  for (int s = 0; s < 3; ++s) {
    Slot slot = SlotOf(f, n, s);
    if (slot.job >= 0 && k >= slot.begin && k < slot.end && g < slot.gpus) {
      *out = slot;
      return slot.job;
    }
  }
  return -1;
}

bool Scraped(const Fleet& f, int n, long long k) {
  long long hour = 3600 / kInterval;
  if (n == 7 && k >= 50 * hour && k < 53 * hour) return false;
  if (n == 42 && k >= 100 * hour && k < 124 * hour) return false;
  return k < f.Samples();
}

struct Reading {
  bool held;
  int util;
  bool throttled;
};
Reading Read(int n, int g, long long k, int job) {
  Reading r{job >= 0, 0, false};
  double u = Unit(Hash(n * kGpus + g, k, 7));
  if (job >= 0) {
    switch (KindOf(job)) {
      case kIdle: r.util = u < 0.02 ? 1 + static_cast<int>(u * 100) : 0; break;  // a stray kernel
      case kStarved: r.util = 20 + static_cast<int>(u * 20); break;
      case kSmall: r.util = 35 + static_cast<int>(u * 10); break;
      default: r.util = 88 + static_cast<int>(u * 12); break;
    }
  }
  double t = Unit(Hash(n, k, 11));
  r.throttled = n % 25 == 3 ? t < 0.5 : t < 0.01;
  return r;
}

std::string GpuLabels(int n, int g, int job) {
  char buf[256];
  int len = std::snprintf(buf, sizeof buf,
                          "Hostname=\"n%03d\",gpu=\"%d\",UUID=\"GPU-%03d-%d\",job=\"fullburn\","
                          "instance=\"n%03d:9400\"",
                          n, g, n, g, n);
  std::string out(buf, len);
  if (job >= 0) {
    len = std::snprintf(buf, sizeof buf, ",hpc_job=\"%d\",user=\"u%02d\",partition=\"gpu\"",
                        10000 + job, job % 37);
    out.append(buf, len);
    if (IsRun(KindOf(job))) out += ",run=\"" + std::to_string(job + 1) + "\"";
  }
  return out;
}

// One family: every series of every GPU, its samples contiguous and in order.
void WriteFamily(const Fleet& f, const char* name, int field, FILE* out) {
  std::fprintf(out, "# TYPE %s gauge\n", name);
  std::vector<char> line(512);
  for (int n = 0; n < f.nodes; ++n)
    for (int g = 0; g < kGpus; ++g)
      for (int series = -1; series < 3; ++series) {  // free time, then each slot's job
        std::string labels;
        Slot slot;
        if (series >= 0) {
          slot = SlotOf(f, n, series);
          if (slot.job < 0 || g >= slot.gpus) continue;
          labels = GpuLabels(n, g, slot.job);
        } else {
          labels = GpuLabels(n, g, -1);
        }
        long long from = series >= 0 ? slot.begin : 0, to = series >= 0 ? slot.end : f.Samples();
        for (long long k = from; k < to; ++k) {
          if (!Scraped(f, n, k)) continue;
          Slot holder;
          int job = HolderAt(f, n, g, k, &holder);
          if ((series < 0) != (job < 0)) continue;  // the free series skips held time
          Reading r = Read(n, g, k, job);
          int v = field == 0   ? r.util
                  : field == 1 ? r.held
                  : field == 2 ? (r.held && r.util < 5)
                               : r.throttled;
          std::fprintf(out, "%s{%s} %d %lld\n", name, labels.c_str(), v, f.start + k * kInterval);
        }
      }
}

void WriteCauses(const Fleet& f, FILE* out) {
  std::fprintf(out, "# TYPE fullburn_job_time_lost_ratio gauge\n");
  for (int n = 0; n < f.nodes; ++n)
    for (int s = 0; s < 3; ++s) {
      Slot slot = SlotOf(f, n, s);
      if (slot.job < 0 || !IsRun(KindOf(slot.job))) continue;
      Kind kind = KindOf(slot.job);
      double share = kind == kStarved ? 0.6 : kind == kSmall ? 0.45 : 0;
      for (long long k = slot.begin; k < slot.end; ++k)
        if (Scraped(f, n, k))
          std::fprintf(out,
                       "fullburn_job_time_lost_ratio{Hostname=\"n%03d\",run=\"%d\",name=\"train\","
                       "cause=\"%s\",job=\"fullburn\",instance=\"n%03d:9400\"} %g %lld\n",
                       n, slot.job + 1, CauseOf(kind), n, share, f.start + k * kInterval);
    }
}

// The brute force: every sample of (from, to], as fullburn fleet defines
// the hours (docs/fleet.md), with idle_held the lost part of held-idle samples.
void Truth(const Fleet& f, double from, double to) {
  double available = 0, used = 0, lost = 0, held = 0, throttled = 0, samples = 0;
  std::map<std::string, double> causes;
  std::map<int, double> job_lost;
  for (int n = 0; n < f.nodes; ++n)
    for (int g = 0; g < kGpus; ++g)
      for (long long k = 0; k < f.Samples(); ++k) {
        double t = static_cast<double>(f.start + k * kInterval);
        if (t <= from || t > to || !Scraped(f, n, k)) continue;
        Slot slot;
        int job = HolderAt(f, n, g, k, &slot);
        Reading r = Read(n, g, k, job);
        double s = kInterval / 3600.0, u = r.util / 100.0, l = (1 - u) * s;
        ++samples;
        available += s;
        used += u * s;
        lost += l;
        if (r.throttled) throttled += s;
        if (job < 0) {
          causes["not_held"] += l;
          continue;
        }
        held += s;
        job_lost[job] += l;
        if (r.util < 5) causes["idle_held"] += l;
        else if (IsRun(KindOf(job))) causes[CauseOf(KindOf(job))] += l;
        else causes["undiagnosed"] += l;
      }
  std::printf("{\"samples\": %.0f, \"available\": %.9f, \"used\": %.9f, \"lost\": %.9f, "
              "\"held\": %.9f, \"throttled\": %.9f, \"unknown\": %.9f, \"lost_by_cause\": {",
              samples, available, used, lost, held, throttled,
              f.nodes * kGpus * (to - from) / 3600 - available);
  const char* sep = "";
  for (const auto& [cause, hours] : causes) {
    std::printf("%s\"%s\": %.9f", sep, cause.c_str(), hours);
    sep = ", ";
  }
  std::printf("}, \"job_lost\": {");
  sep = "";
  for (const auto& [job, hours] : job_lost) {
    std::printf("%s\"slurm job %d\": %.9f", sep, 10000 + job, hours);
    sep = ", ";
  }
  std::printf("}}\n");
}

}  // namespace

int main(int argc, char** argv) {
  Fleet f;
  double from = NAN, to = NAN;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fleet_gen: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--start") f.start = std::atoll(next().c_str());
    else if (a == "--nodes") f.nodes = std::atoi(next().c_str());
    else if (a == "--jobs") f.jobs = std::atoi(next().c_str());
    else if (a == "--days") f.days = std::atoi(next().c_str());
    else if (a == "--truth") {
      from = std::atof(next().c_str());
      to = std::atof(next().c_str());
    } else {
      std::fprintf(stderr, "fleet_gen: unknown argument %s (see the comment at the top)\n", a.c_str());
      return 2;
    }
  }
  if (f.start <= 0) {
    std::fprintf(stderr, "fleet_gen: --start UNIX is required\n");
    return 2;
  }
  if (!std::isnan(from)) {
    Truth(f, from, to);
    return 0;
  }
  static char buf[1 << 22];
  std::setvbuf(stdout, buf, _IOFBF, sizeof buf);
  const char* families[] = {"DCGM_FI_DEV_GPU_UTIL", "fullburn_gpu_held", "fullburn_gpu_held_idle",
                            "fullburn_gpu_throttled"};
  for (int field = 0; field < 4; ++field) WriteFamily(f, families[field], field, stdout);
  WriteCauses(f, stdout);
  std::printf("# EOF\n");
  return 0;
}
