// Who holds a GPU: the processes in NVML's list, tied to a run recorded on
// this host and to the scheduler's job (Slurm, Kubernetes) from what /proc
// says about them. Everything is read through the Env, so tests replay
// recorded /proc files; a file that cannot be read leaves its labels out.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "fullburn/telemetry.h"
#include "parse.h"

namespace fullburn {
namespace {

constexpr int kMaxAncestors = 64;  // a deeper chain is a loop in a recording

std::string ProcPath(int pid, const char* file) {
  return "/proc/" + std::to_string(pid) + "/" + file;
}

// "KEY=VALUE\0KEY=VALUE\0...": the few keys asked for.
std::map<std::string, std::string> EnvironValues(const std::string& environ,
                                                 const std::vector<const char*>& keys) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < environ.size()) {
    size_t end = environ.find('\0', pos);
    if (end == std::string::npos) end = environ.size();
    size_t eq = environ.find('=', pos);
    if (eq != std::string::npos && eq < end) {
      std::string key = environ.substr(pos, eq - pos);
      for (const char* k : keys)
        if (key == k) out[key] = environ.substr(eq + 1, end - eq - 1);
    }
    pos = end + 1;
  }
  return out;
}

// ppid and start time (fields 4 and 22 of proc(5)), counted from the last ')'
// since the command name may hold spaces and parentheses.
bool ParseStatFields(const std::string& text, int* ppid, uint64_t* start) {
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  const char* p = text.data() + close + 1;
  const char* end = text.data() + text.size();
  const char* word;
  size_t len;
  if (!parse::Word(&p, end, &word, &len)) return false;  // field 3, the state
  for (int field = 4; field <= 22; ++field) {
    uint64_t v = 0;
    if (!parse::U64(&p, end, &v)) {
      if (!parse::Word(&p, end, &word, &len)) return false;  // a signed field
      continue;
    }
    if (field == 4) *ppid = static_cast<int>(v);
    if (field == 22) {
      *start = v;
      return true;
    }
  }
  return false;
}

// The first word after "Key:" at the start of a line of /proc/PID/status.
std::string StatusField(const std::string& status, const std::string& key) {
  std::string needle = key + ":";
  size_t pos = status.compare(0, needle.size(), needle) == 0 ? 0 : status.find("\n" + needle);
  if (pos == std::string::npos) return "";
  if (pos > 0 || status[0] == '\n') ++pos;
  const char* p = status.data() + pos + needle.size();
  const char* word;
  size_t len;
  if (!parse::Word(&p, status.data() + status.size(), &word, &len)) return "";
  return std::string(word, len);
}

// The name of `uid` in /etc/passwd ("name:x:uid:gid:..."), "" if not there.
std::string UserName(const Env& env, int uid) {
  Result<std::string> passwd = env.ReadFile("/etc/passwd");
  if (!passwd.ok()) return "";
  const std::string wanted = std::to_string(uid);
  size_t pos = 0;
  while (pos < passwd->size()) {
    size_t end = passwd->find('\n', pos);
    if (end == std::string::npos) end = passwd->size();
    std::string line = passwd->substr(pos, end - pos);
    size_t name_end = line.find(':');
    size_t uid_at = name_end == std::string::npos ? name_end : line.find(':', name_end + 1);
    if (uid_at != std::string::npos) {
      size_t uid_end = line.find(':', uid_at + 1);
      if (line.substr(uid_at + 1, uid_end - uid_at - 1) == wanted) return line.substr(0, name_end);
    }
    pos = end + 1;
  }
  return "";
}

double BootTime(const Env& env) {
  Result<std::string> stat = env.ReadFile("/proc/stat");
  uint64_t btime = 0;
  return stat.ok() && parse::KeyValue(*stat, "btime", &btime) ? static_cast<double>(btime) : NAN;
}

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

std::vector<int> ParseNsPids(const std::string& status) {
  std::vector<int> pids;
  size_t pos = status.find("NSpid:");
  if (pos == std::string::npos || (pos > 0 && status[pos - 1] != '\n')) return pids;
  const char* p = status.data() + pos + 6;
  const char* end = parse::NextLine(p, status.data() + status.size());
  uint64_t v = 0;
  while (parse::U64(&p, end, &v)) pids.push_back(static_cast<int>(v));
  return pids;
}

// cgroup v1: ".../slurm/uid_1000/job_4242/step_0/task_0"; v2:
// "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0".
std::string SlurmJobFromCgroup(const std::string& cgroup) {
  size_t pos = 0;
  while ((pos = cgroup.find("/job_", pos)) != std::string::npos) {
    size_t line = cgroup.rfind('\n', pos);
    line = line == std::string::npos ? 0 : line + 1;
    size_t digits = pos + 5, end = digits;
    while (end < cgroup.size() && cgroup[end] >= '0' && cgroup[end] <= '9') ++end;
    bool whole = end > digits && (end == cgroup.size() || cgroup[end] == '/' || cgroup[end] == '\n');
    if (whole && cgroup.substr(line, pos - line).find("slurm") != std::string::npos)
      return cgroup.substr(digits, end - digits);
    pos = end;
  }
  return "";
}

// cgroupfs: "/kubepods/burstable/pod0f3c...-.../<container>"; systemd:
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c..._....slice/...".
std::string PodUidFromCgroup(const std::string& cgroup) {
  size_t pos = cgroup.find("kubepods");
  while (pos != std::string::npos && (pos = cgroup.find("pod", pos + 3)) != std::string::npos) {
    std::string uid = cgroup.substr(pos + 3, 36);
    bool ok = uid.size() == 36;
    for (size_t i = 0; ok && i < uid.size(); ++i) {
      bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      ok = dash ? (uid[i] == '-' || uid[i] == '_') : IsHex(uid[i]);
      if (dash) uid[i] = '-';
    }
    if (ok) return uid;
  }
  return "";
}

std::optional<double> ProcessStartTime(const Env& env, int pid) {
  Result<ProcessIdentity> id = ReadProcessIdentity(env, pid);
  double boot = BootTime(env);
  if (!id.ok() || std::isnan(boot)) return std::nullopt;
  return boot + static_cast<double>(id->start_ticks) / env.ClockTicksPerSecond();
}

Result<ProcessOwner> ReadProcessOwner(const Env& env, int pid) {
  ProcessOwner o;
  o.pid = pid;
  Result<std::string> stat = env.ReadFile(ProcPath(pid, "stat"));
  if (!stat.ok() || !ParseStatFields(*stat, &o.ppid, &o.start_ticks))
    return Status::NotFound("no process " + std::to_string(pid));
  o.start_unix = BootTime(env) + static_cast<double>(o.start_ticks) / env.ClockTicksPerSecond();
  Result<std::string> status = env.ReadFile(ProcPath(pid, "status"));
  std::string uid;
  if (status.ok()) {
    o.ns_pids = ParseNsPids(*status);
    uid = StatusField(*status, "Uid");
  }
  std::map<std::string, std::string> vars;
  if (Result<std::string> environ = env.ReadFile(ProcPath(pid, "environ")); environ.ok())
    vars = EnvironValues(*environ, {"SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_PARTITION",
                                    "POD_NAME", "POD_NAMESPACE", "HOSTNAME"});
  std::string cgroup;
  if (Result<std::string> text = env.ReadFile(ProcPath(pid, "cgroup")); text.ok()) cgroup = *text;
  o.hpc_job = vars.count("SLURM_JOB_ID") ? vars["SLURM_JOB_ID"] : SlurmJobFromCgroup(cgroup);
  o.partition = vars["SLURM_JOB_PARTITION"];
  o.user = vars["SLURM_JOB_USER"];
  if (o.user.empty() && !uid.empty()) {
    o.user = UserName(env, std::atoi(uid.c_str()));
    if (o.user.empty()) o.user = "uid " + uid;
  }
  o.pod_uid = PodUidFromCgroup(cgroup);
  if (!o.pod_uid.empty()) {
    // The runtime sets HOSTNAME to the pod's name; the downward API's
    // POD_NAME and POD_NAMESPACE, where a pod has them, say it outright.
    o.pod = vars.count("POD_NAME") ? vars["POD_NAME"] : vars["HOSTNAME"];
    o.kube_namespace = vars["POD_NAMESPACE"];
    if (o.kube_namespace.empty()) {
      Result<std::string> ns = env.ReadFile(
          ProcPath(pid, "root/var/run/secrets/kubernetes.io/serviceaccount/namespace"));
      if (ns.ok()) {
        o.kube_namespace = *ns;
        while (!o.kube_namespace.empty() && std::isspace(o.kube_namespace.back()))
          o.kube_namespace.pop_back();
      }
    }
  }
  return o;
}

const std::vector<LabelDef>& GpuHolderLabels() {
  static const std::vector<LabelDef> labels = {
      {"run", "the run recorded on this host (fullburn run, train, attach) that holds it: its id "
              "in the store, as in fullburn_job_*'s `run`"},
      {"hpc_job", "the Slurm job id (SLURM_JOB_ID, or job_ID in its cgroup path): "
                  "dcgm-exporter's HPC job label"},
      {"user", "SLURM_JOB_USER, else the name of the process's uid"},
      {"partition", "the Slurm partition (SLURM_JOB_PARTITION)"},
      {"namespace", "the Kubernetes namespace (POD_NAMESPACE, else the pod's service account)"},
      {"pod", "the Kubernetes pod (POD_NAME, else HOSTNAME, in a pod's cgroup)"},
  };
  return labels;
}

const ProcessOwner* GpuHolders::Owner(int pid) {
  auto it = owners_.find(pid);
  if (it != owners_.end()) return &it->second;
  Result<ProcessOwner> owner = ReadProcessOwner(*env_, pid);
  if (!owner.ok()) return nullptr;
  return &owners_.emplace(pid, std::move(*owner)).first->second;
}

// Walks up from the holding process: its recorder is itself (fullburn
// train), an ancestor (fullburn run), or the process attached to.
std::string GpuHolders::MatchRun(int pid, const std::vector<RecordedJob>& runs) {
  constexpr double kClockSlackS = 2;  // start ticks are rounded; clocks read apart
  for (int hops = 0; pid > 0 && hops < kMaxAncestors; ++hops) {
    const ProcessOwner* p = Owner(pid);
    if (!p) return "";
    int inner = p->ns_pids.size() > 1 ? p->ns_pids.back() : -1;
    for (const RecordedJob& r : runs) {
      if (r.pid != p->pid && r.pid != inner) continue;
      // The recorder's own start names it: a process given its pid later,
      // or another namespace's pid 1 (the host's init), started otherwise.
      if (r.recorder_start) {
        if (std::fabs(*r.recorder_start - p->start_unix) <= kClockSlackS) return std::to_string(r.run);
        continue;
      }
      double before_run = r.start_time - p->start_unix;
      bool started_in_time = before_run >= -kClockSlackS &&
                             (r.attached || before_run <= kRecorderStartSlackS);
      if (started_in_time) return std::to_string(r.run);
    }
    if (p->ppid == pid) return "";
    pid = p->ppid;
  }
  return "";
}

std::vector<std::vector<PromLabel>> GpuHolders::Labels(const std::vector<GpuSample>& gpus,
                                                       const std::vector<RecordedJob>& runs) {
  owners_.clear();  // processes come and go: read afresh each time
  std::vector<std::vector<PromLabel>> out(gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    const GpuProcess* holder = nullptr;
    for (const GpuProcess& p : gpus[i].processes)
      if (!holder || p.used_memory_bytes.value_or(0) > holder->used_memory_bytes.value_or(0))
        holder = &p;
    if (!holder) continue;
    const ProcessOwner* owner = Owner(holder->pid);
    if (!owner) continue;  // gone, or not visible from here
    std::vector<PromLabel>& labels = out[i];
    auto add = [&labels](const char* name, const std::string& value) {
      if (!value.empty()) labels.emplace_back(name, value);
    };
    // Owners live in an unordered_map: the walk up adds some, `owner` stays valid.
    add("run", MatchRun(holder->pid, runs));
    add("hpc_job", owner->hpc_job);
    add("user", owner->user);
    add("partition", owner->partition);
    add("namespace", owner->kube_namespace);
    add("pod", owner->pod);
  }
  return out;
}

}  // namespace fullburn
