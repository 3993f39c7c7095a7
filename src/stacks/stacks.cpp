// Reading py-spy's samples: phases, roles and places (stacks.h).
#include "fullburn/stacks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "fullburn/percent.h"

namespace fullburn {

namespace {

struct PhaseDef {
  StackPhase phase;
  const char* name;
  const char* label;
};
constexpr PhaseDef kPhases[kStackPhaseCount] = {
    {StackPhase::kDataWait, "data_wait", "the data wait"},
    {StackPhase::kForward, "forward", "the forward"},
    {StackPhase::kBackward, "backward", "the backward"},
    {StackPhase::kOptimizer, "optimizer", "the optimizer step"},
    {StackPhase::kEvaluation, "evaluation", "the evaluation"},
    {StackPhase::kCheckpoint, "checkpoint", "the checkpoints"},
    {StackPhase::kOther, "other", "the loop's own work"},
    {StackPhase::kStartup, "startup", "the start-up, imports and exit"},
    {StackPhase::kThreads, "threads", "the training processes' other threads"},
    {StackPhase::kWorkers, "workers", "the DataLoader workers' work"},
    {StackPhase::kProcesses, "processes", "the other processes"},
};

bool EndsWith(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}
bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// "_next_hook.<locals>.__next__" -> "__next__": Python 3.11's qualified
// names and older plain ones alike.
std::string ShortName(const std::string& function) {
  size_t dot = function.rfind('.');
  return dot == std::string::npos ? function : function.substr(dot + 1);
}

std::string Basename(const std::string& file) {
  size_t slash = file.rfind('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

// A file of fullburn's automatic step hooks: python/fullburn_autosteps/'s
// modules, or the single fullburn_autosteps.py they were before (an older
// install's stacks).
bool IsAutostepsFile(const std::string& file) {
  return Has(file, "/fullburn_autosteps/") || file.compare(0, 19, "fullburn_autosteps/") == 0 ||
         EndsWith(file, "fullburn_autosteps.py");
}

bool IsHook(const StackFrame& f, std::initializer_list<const char*> names) {
  if (!IsAutostepsFile(f.file)) return false;
  std::string name = ShortName(f.function);
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

// The site folder's package ("PIL", "torch"), or "" when `file` is not in one.
std::string SitePackage(const std::string& file) {
  for (const char* site : {"/site-packages/", "/dist-packages/"}) {
    size_t at = file.rfind(site);
    if (at == std::string::npos) continue;
    std::string rest = file.substr(at + std::strlen(site));
    size_t slash = rest.find('/');
    std::string top = slash == std::string::npos ? rest : rest.substr(0, slash);
    if (EndsWith(top, ".py")) top.resize(top.size() - 3);
    return top;
  }
  return "";
}

// /usr/lib/python3.11/..., ~/.pyenv/versions/3.11.7/lib/python3.11/...
bool IsStdlib(const std::string& file) {
  size_t at = file.find("/lib/python");
  while (at != std::string::npos) {
    size_t i = at + std::strlen("/lib/python");
    while (i < file.size() && (std::isdigit(static_cast<unsigned char>(file[i])) || file[i] == '.')) ++i;
    if (i > at + std::strlen("/lib/python") && i < file.size() && file[i] == '/') return true;
    at = file.find("/lib/python", at + 1);
  }
  return false;
}

bool InTorch(const StackFrame& f, const char* part) {
  return SitePackage(f.file) == "torch" && Has(f.file, part);
}

bool IsBackward(const StackFrame& f) {
  if (IsHook(f, {"backward"})) return true;
  std::string name = ShortName(f.function);
  if (InTorch(f, "torch/autograd/__init__.py") &&
      (name == "backward" || name == "grad" || name == "_engine_run_backward"))
    return true;
  if (InTorch(f, "torch/autograd/graph.py") && name == "_engine_run_backward") return true;
  return InTorch(f, "torch/_tensor.py") && name == "backward";
}

bool IsOptimizer(const StackFrame& f) {
  return InTorch(f, "torch/optim/") || InTorch(f, "torch/nn/utils/clip_grad.py") ||
         InTorch(f, "torch/amp/grad_scaler.py") || InTorch(f, "torch/cuda/amp/grad_scaler.py");
}

bool IsForward(const StackFrame& f) { return InTorch(f, "torch/nn/modules/") || InTorch(f, "torch/nn/functional.py"); }

bool IsDataWait(const StackFrame& f) {
  if (IsHook(f, {"__next__", "__iter__"})) return true;
  std::string name = ShortName(f.function);
  return InTorch(f, "torch/utils/data/dataloader.py") && (name == "__next__" || name == "__iter__");
}

bool IsCheckpoint(const StackFrame& f) {
  if (IsHook(f, {"save", "timed"})) return true;
  return InTorch(f, "torch/serialization.py") && ShortName(f.function) == "save";
}

bool IsNoGradDecorator(const StackFrame& f) {
  return ShortName(f.function) == "decorate_context" &&
         (InTorch(f, "torch/utils/_contextlib.py") || InTorch(f, "torch/autograd/grad_mode.py"));
}

// A framework's own evaluation: Lightning's evaluation and prediction loops,
// the HF Trainer's evaluate and predict.
bool IsFrameworkEvaluation(const StackFrame& f) {
  std::string package = SitePackage(f.file);
  if (package == "lightning" || package == "pytorch_lightning")
    return Has(f.file, "/loops/") && (Has(f.file, "evaluation") || Has(f.file, "prediction"));
  if (package == "transformers" && EndsWith(f.file, "/trainer.py")) {
    std::string name = ShortName(f.function);
    return name == "evaluate" || name == "evaluation_loop" || name == "prediction_loop" ||
           name == "predict" || name == "prediction_step";
  }
  return false;
}

// The loop a DataLoader worker runs (not the module's import, which every
// process that imports torch.utils.data samples once).
bool IsWorkerLoop(const StackFrame& f) {
  return InTorch(f, "torch/utils/data/_utils/worker.py") && ShortName(f.function) == "_worker_loop";
}

bool IsMainThread(const StackSample& s) { return s.tid == 0 || s.tid == s.pid; }

bool Any(const StackSample& s, bool (*test)(const StackFrame&)) {
  return std::any_of(s.frames.begin(), s.frames.end(), test);
}

bool IsImport(const StackFrame& f) {
  return f.file.rfind("<frozen importlib._bootstrap", 0) == 0 && ShortName(f.function) == "_find_and_load";
}

// The phase of a training thread's sample (stacks.h's order).
StackPhase StepPhase(const StackSample& s) {
  // No Python frame on the main thread: the interpreter starting or ending.
  if (s.frames.empty() || Any(s, IsImport)) return StackPhase::kStartup;
  if (Any(s, IsCheckpoint)) return StackPhase::kCheckpoint;
  for (size_t i = 0; i + 1 < s.frames.size(); ++i)
    if (IsNoGradDecorator(s.frames[i]) && IsOwnFrame(s.frames[i + 1])) return StackPhase::kEvaluation;
  if (Any(s, IsFrameworkEvaluation)) return StackPhase::kEvaluation;
  if (Any(s, IsDataWait)) return StackPhase::kDataWait;
  for (auto f = s.frames.rbegin(); f != s.frames.rend(); ++f) {
    if (IsBackward(*f)) return StackPhase::kBackward;
    if (IsOptimizer(*f)) return StackPhase::kOptimizer;
    if (IsForward(*f)) return StackPhase::kForward;
  }
  return StackPhase::kOther;
}

// "PIL Image.resize", "queue Queue.get", "train.py:42 main".
std::string FrameLabel(const StackFrame& f, bool with_line) {
  std::string package = SitePackage(f.file);
  if (!package.empty()) return package + " " + f.function;
  if (IsStdlib(f.file)) {
    std::string module = Basename(f.file);
    if (EndsWith(module, ".py")) module.resize(module.size() - 3);
    return module + " " + f.function;
  }
  std::string at = Basename(f.file);
  if (with_line && f.line > 0) at += ":" + std::to_string(f.line);
  return at + " " + f.function;
}

// The outermost module being imported below `from` ("torch", "PIL.Image"),
// "" when no import is under way there. The outermost: `import torch`
// importing torch._dynamo is the job's import of torch.
std::string ImportedModule(const StackSample& s, const StackFrame* from) {
  bool below = false, importing = false;
  for (const StackFrame& f : s.frames) {
    if (&f == from) {
      below = true;
      continue;
    }
    if (!below) continue;
    if (IsImport(f)) importing = true;
    if (!importing || f.function != "<module>" || f.file.empty() || f.file[0] == '<') continue;
    std::string path = f.file;
    for (const char* site : {"/site-packages/", "/dist-packages/"})
      if (size_t at = path.rfind(site); at != std::string::npos) path = path.substr(at + std::strlen(site));
    if (SitePackage(f.file).empty() && IsStdlib(f.file))
      path = f.file.substr(f.file.find('/', f.file.find("/lib/python") + 11) + 1);
    if (EndsWith(path, "/__init__.py")) path.resize(path.size() - 12);
    else if (EndsWith(path, ".py")) path.resize(path.size() - 3);
    if (path.find('/') == 0) path = Basename(path);
    std::replace(path.begin(), path.end(), '/', '.');
    return path;
  }
  return "";
}

}  // namespace

const char* StackPhaseName(StackPhase p) { return kPhases[static_cast<int>(p)].name; }
const char* StackPhaseLabel(StackPhase p) { return kPhases[static_cast<int>(p)].label; }

bool ParseStackPhase(const std::string& name, StackPhase* out) {
  for (const PhaseDef& d : kPhases)
    if (name == d.name) {
      *out = d.phase;
      return true;
    }
  return false;
}

bool IsStepPhase(StackPhase p) {
  return p == StackPhase::kDataWait || p == StackPhase::kForward || p == StackPhase::kBackward ||
         p == StackPhase::kOptimizer || p == StackPhase::kOther;
}

std::string ValidUtf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;  // no overlong forms
    if (ok && len == 3) {
      unsigned cp = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
      ok = cp >= 0x800 && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok && len == 4) {
      unsigned cp = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

namespace {

// A frame's text as fullburn shows it: valid UTF-8, and no control byte.
// py-spy reads a function's name from the live process, and one read while
// the interpreter builds it can be torn ("~\0"): kept, a NUL or a newline
// would cut the folded export's line and a terminal's.
std::string FrameText(const std::string& text) {
  std::string out = ValidUtf8(text);
  std::string clean;
  clean.reserve(out.size());
  for (char c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F)
      clean += "\xEF\xBF\xBD";
    else
      clean += c;
  }
  return clean;
}

// A stack ends in " COUNT" after its process's closing quote: a command line
// may span lines (python -c with a script of several), which py-spy writes
// as they are.
bool CompleteStack(const std::string& record) {
  size_t space = record.rfind(' ');
  if (space == std::string::npos || space + 1 == record.size()) return false;
  for (size_t i = space + 1; i < record.size(); ++i)
    if (record[i] < '0' || record[i] > '9') return false;
  return record.compare(0, 8, "process ") != 0 || record.find("\";") != std::string::npos;
}

}  // namespace

std::vector<StackSample> ParseFoldedStacks(const std::string& text, int64_t* bad) {
  std::vector<StackSample> out;
  int64_t bad_lines = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    // Lines of one multi-line command line, joined back.
    while (line.compare(0, 8, "process ") == 0 && !CompleteStack(line) && pos < text.size()) {
      size_t next = text.find('\n', pos);
      if (next == std::string::npos) next = text.size();
      std::string more = text.substr(pos, next - pos);
      // A line that starts a stack of its own: the one before was cut.
      if (more.compare(0, 8, "process ") == 0) break;
      line += "\n" + more;
      pos = next + 1;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    StackSample s;
    size_t space = line.rfind(' ');
    char* rest = nullptr;
    if (space == std::string::npos ||
        (s.count = std::strtoll(line.c_str() + space + 1, &rest, 10), *rest != '\0') || s.count <= 0 ||
        line.compare(0, 8, "process ") != 0) {
      ++bad_lines;
      continue;
    }
    line.resize(space);
    // "process PID:\"CMD\";" once per process from the one py-spy was given
    // down to the sample's own. A command line may hold anything (a spawned
    // worker's has ';'): it ends at the quote before the next process or
    // thread, else at the first quote and ';'.
    size_t frames_at = 0;
    bool ok = true;
    while (ok && line.compare(frames_at, 8, "process ") == 0) {
      s.pid = std::atoi(line.c_str() + frames_at + 8);
      size_t quote = line.find(":\"", frames_at + 8);
      size_t close = std::string::npos, first_close = std::string::npos;
      for (size_t c = quote == std::string::npos ? quote : line.find("\";", quote + 2); c != std::string::npos;
           c = line.find("\";", c + 1)) {
        if (line.compare(c + 2, 8, "process ") == 0 || line.compare(c + 2, 8, "thread (") == 0) {
          close = c;
          break;
        }
        if (first_close == std::string::npos) first_close = c;
      }
      if (close == std::string::npos) close = first_close;
      if (close != std::string::npos) {
        frames_at = close + 2;
      } else if (quote != std::string::npos && EndsWith(line, "\"")) {
        frames_at = line.size();  // a process with no Python frame
      } else {
        ok = false;
      }
    }
    if (!ok || s.pid <= 0) {
      ++bad_lines;
      continue;
    }
    size_t at = frames_at;
    bool first = true;
    while (at < line.size()) {
      size_t semi = line.find(';', at);
      std::string frame = line.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
      at = semi == std::string::npos ? line.size() : semi + 1;
      if (first && frame.compare(0, 8, "thread (") == 0) {
        s.tid = std::atoi(frame.c_str() + 8);
        size_t colon = frame.find("): ");
        if (colon != std::string::npos) s.thread = FrameText(frame.substr(colon + 3));
        first = false;
        continue;
      }
      first = false;
      StackFrame f;
      size_t open = frame.rfind(" (");
      if (open != std::string::npos && EndsWith(frame, ")")) {
        f.function = FrameText(frame.substr(0, open));
        std::string where = frame.substr(open + 2, frame.size() - open - 3);
        size_t colon = where.rfind(':');
        if (colon != std::string::npos && colon + 1 < where.size() &&
            std::all_of(where.begin() + colon + 1, where.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
          f.line = std::atoi(where.c_str() + colon + 1);
          where.resize(colon);
        }
        f.file = FrameText(where);
      } else {
        f.function = FrameText(frame);
      }
      s.frames.push_back(std::move(f));
    }
    out.push_back(std::move(s));
  }
  if (bad) *bad = bad_lines;
  return out;
}

bool IsOwnFrame(const StackFrame& f, const std::vector<std::string>& tool_dirs) {
  if (f.file.empty() || f.file[0] == '<') return false;  // <frozen ...>, <string>
  if (!SitePackage(f.file).empty() || IsStdlib(f.file)) return false;
  if (IsAutostepsFile(f.file) || EndsWith(f.file, "fullburn_flops.py") ||
      EndsWith(f.file, "fullburn_markers.py"))
    return false;
  for (const std::string& dir : tool_dirs)
    if (!dir.empty() && f.file.compare(0, dir.size(), dir) == 0) return false;
  return true;
}

bool IsWaiting(const StackSample& s) {
  if (s.frames.empty()) return true;  // a thread with no Python frame to show
  const StackFrame& leaf = s.frames.back();
  if (!IsStdlib(leaf.file)) return false;
  static const char* const kBlocking[] = {"threading.py", "selectors.py", "connection.py", "queues.py",
                                          "queue.py", "synchronize.py", "popen_fork.py",
                                          "resource_tracker.py", "socket.py", "subprocess.py",
                                          "forkserver.py", "popen_spawn_posix.py"};
  std::string base = Basename(leaf.file);
  return std::any_of(std::begin(kBlocking), std::end(kBlocking), [&](const char* b) { return base == b; });
}

std::string SamplePlace::Render(int at_line) const {
  if (file.empty()) return key;
  std::string out = file + (at_line > 0 ? ":" + std::to_string(at_line) : "") + " " + function;
  return callee.empty() ? out : out + " -> " + callee;
}

SamplePlace PlaceOf(const StackSample& s, const std::vector<std::string>& tool_dirs) {
  SamplePlace p;
  if (s.frames.empty()) {
    p.key = "(no Python frame)";
    return p;
  }
  const StackFrame& leaf = s.frames.back();
  for (auto f = s.frames.rbegin(); f != s.frames.rend(); ++f) {
    // A forked worker's stack starts with its parent's frames: above its
    // worker loop none is the worker's own code.
    if (IsWorkerLoop(*f)) break;
    if (!IsOwnFrame(*f, tool_dirs)) continue;
    p.file = Basename(f->file);
    p.line = f->line;
    p.function = f->function;
    // Under an import, what is imported says more than the import machinery.
    std::string module = ImportedModule(s, &*f);
    if (!module.empty()) p.callee = "import " + module;
    else if (&*f != &leaf) p.callee = FrameLabel(leaf, false);
    p.key = p.Render(0);
    return p;
  }
  p.key = leaf.function + " (" + leaf.file + (leaf.line > 0 ? ":" + std::to_string(leaf.line) : "") + ")";
  return p;
}

StackRoles FindStackRoles(const std::vector<StackSample>& samples, int root) {
  StackRoles roles;
  roles.root = root;
  for (const StackSample& s : samples)
    if (Any(s, IsWorkerLoop)) roles.workers.insert(s.pid);
  for (const StackSample& s : samples) {
    if (roles.workers.count(s.pid) || !IsMainThread(s)) continue;
    StackPhase p = StepPhase(s);
    if (p != StackPhase::kOther) roles.training.insert(s.pid);
  }
  if (roles.training.empty() && root > 0 && !roles.workers.count(root)) roles.training.insert(root);
  return roles;
}

StackPhase PhaseOf(const StackSample& s, const StackRoles& roles) {
  // A spawned worker imports torch again: start-up, not the workers' work.
  if (Any(s, IsImport)) return StackPhase::kStartup;
  if (roles.workers.count(s.pid)) return StackPhase::kWorkers;
  if (!roles.training.count(s.pid)) return StackPhase::kProcesses;
  if (!IsMainThread(s)) return StackPhase::kThreads;
  return StepPhase(s);
}

int64_t StackSummary::StepSamples() const {
  int64_t n = 0;
  for (const PhaseDef& d : kPhases)
    if (IsStepPhase(d.phase)) n += of(d.phase).samples;
  return n;
}

StackSummary SummarizeStacks(const std::vector<StackSample>& samples, int root, double rate_hz,
                             const std::vector<std::string>& tool_dirs, size_t top) {
  StackSummary out;
  out.rate_hz = rate_hz;
  out.root = root;
  StackRoles roles = FindStackRoles(samples, root);
  out.training.assign(roles.training.begin(), roles.training.end());
  out.workers.assign(roles.workers.begin(), roles.workers.end());
  struct Tally {
    SamplePlace place;
    int64_t samples = 0;
    std::map<int, int64_t> lines;
  };
  std::array<std::unordered_map<std::string, Tally>, kStackPhaseCount> places;
  for (const StackSample& s : samples) {
    int p = static_cast<int>(PhaseOf(s, roles));
    out.samples += s.count;
    out.phases[p].samples += s.count;
    if (IsWaiting(s)) {
      out.phases[p].waiting += s.count;
      continue;
    }
    SamplePlace place = PlaceOf(s, tool_dirs);
    Tally& t = places[p][place.key];
    if (t.samples == 0) t.place = place;
    t.samples += s.count;
    t.lines[place.line] += s.count;
  }
  for (int p = 0; p < kStackPhaseCount; ++p) {
    std::vector<StackPlace>& list = out.phases[p].top;
    for (auto& [key, t] : places[p]) {
      // The function's line with the most samples: where in it the time went.
      auto hottest = std::max_element(t.lines.begin(), t.lines.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
      list.push_back({t.place.Render(hottest->first), t.samples});
    }
    std::sort(list.begin(), list.end(), [](const StackPlace& a, const StackPlace& b) {
      return a.samples != b.samples ? a.samples > b.samples : a.where < b.where;
    });
    if (list.size() > top) list.resize(top);
  }
  return out;
}

nlohmann::json StackSummaryJson(const StackSummary& s) {
  nlohmann::json phases = nlohmann::json::object();
  for (const PhaseDef& d : kPhases) {
    const StackPhaseSummary& p = s.of(d.phase);
    if (p.samples == 0) continue;
    nlohmann::json top = nlohmann::json::array();
    for (const StackPlace& place : p.top) top.push_back({{"where", place.where}, {"samples", place.samples}});
    phases[d.name] = {{"samples", p.samples}, {"waiting", p.waiting}, {"top", top}};
  }
  return {{"rate_hz", s.rate_hz}, {"samples", s.samples}, {"bad_lines", s.bad_lines},
          {"errors", s.errors},   {"root", s.root},       {"training", s.training},
          {"workers", s.workers}, {"sampler_cpu_s", s.sampler_cpu_s},
          {"duration_s", s.duration_s}, {"sampler_paused_s", s.sampler_paused_s}, {"phases", phases}};
}

StackSummary StackSummaryFromJson(const nlohmann::json& j) {
  StackSummary s;
  if (!j.is_object()) return s;
  try {
    s.rate_hz = j.value("rate_hz", 0.0);
    s.samples = j.value("samples", int64_t{0});
    s.bad_lines = j.value("bad_lines", int64_t{0});
    s.errors = j.value("errors", int64_t{0});
    s.root = j.value("root", 0);
    s.sampler_cpu_s = j.value("sampler_cpu_s", 0.0);
    s.duration_s = j.value("duration_s", 0.0);
    s.sampler_paused_s = j.value("sampler_paused_s", 0.0);
    if (j.contains("training")) s.training = j["training"].get<std::vector<int>>();
    if (j.contains("workers")) s.workers = j["workers"].get<std::vector<int>>();
    const nlohmann::json phases = j.value("phases", nlohmann::json::object());
    for (const PhaseDef& d : kPhases) {
      if (!phases.contains(d.name)) continue;
      const nlohmann::json& p = phases[d.name];
      StackPhaseSummary& out = s.phases[static_cast<int>(d.phase)];
      out.samples = p.value("samples", int64_t{0});
      out.waiting = p.value("waiting", int64_t{0});
      for (const nlohmann::json& place : p.value("top", nlohmann::json::array()))
        out.top.push_back({place.value("where", std::string()), place.value("samples", int64_t{0})});
    }
  } catch (const nlohmann::json::exception&) {
    return StackSummary{};
  }
  return s;
}

std::string RenderStackPlaces(const StackSummary& s, StackPhase phase, size_t n, int64_t base,
                              const std::string& of) {
  const StackPhaseSummary& p = s.of(phase);
  if (base <= 0) base = p.samples - p.waiting;
  if (p.top.empty() || base <= 0) return "";
  std::string out;
  for (size_t i = 0; i < p.top.size() && i < n; ++i) {
    out += fmt::format("{}{} {}", i ? ", " : "", p.top[i].where,
                       Percent(static_cast<double>(p.top[i].samples) / base));
    if (i == 0) out += " of " + (of.empty() ? std::string(StackPhaseLabel(phase)) : of);
  }
  return out;
}

std::string RenderStackPhases(const StackSummary& s, size_t n) {
  if (s.empty() && s.errors == 0) return "";
  std::string out;
  int64_t step = s.StepSamples();
  if (s.duration_s > 0 && s.sampler_cpu_s > 0)
    out += fmt::format("    sampler: py-spy at {:.0f}/s, {:.1f} s of CPU over {:.0f} s ({} of a core), "
                       "{} worker process{}\n",
                       s.rate_hz, s.sampler_cpu_s, s.duration_s, Percent(s.sampler_cpu_s / s.duration_s),
                       s.workers.size(), s.workers.size() == 1 ? "" : "es");
  if (s.sampler_paused_s > 0.5)
    out += fmt::format("    sampler held to its CPU budget: paused {:.1f} s of {:.0f} s (fewer samples, "
                       "the same phases)\n", s.sampler_paused_s, s.duration_s);
  // py-spy drops a sample it cannot read whole rather than keep a part.
  if (s.errors > 0)
    out += fmt::format("    {} samples py-spy could not read (a stack that changed while read "
                       "without stopping the job, a process gone mid-read, or a stack deeper than "
                       "the 4,096 frames it reads), against {} read\n",
                       s.errors, s.samples);
  for (const PhaseDef& d : kPhases) {
    const StackPhaseSummary& p = s.of(d.phase);
    if (p.samples == 0) continue;
    std::string share =
        IsStepPhase(d.phase) && step > 0 ? fmt::format(" {} of step time", Percent(static_cast<double>(p.samples) / step)) : "";
    std::string waiting = p.waiting > 0 ? fmt::format(", {} waiting", Percent(static_cast<double>(p.waiting) / p.samples)) : "";
    out += fmt::format("    {} ({} samples{}{}):", d.name, p.samples, share, waiting);
    std::string places = RenderStackPlaces(s, d.phase, n, 0, "its busy samples");
    out += places.empty() ? " waiting only\n" : " " + places + "\n";
  }
  return out;
}

std::string FoldedStacks(const std::vector<StackSample>& samples, int root, const std::string& phase) {
  StackRoles roles = FindStackRoles(samples, root);
  std::string out;
  for (const StackSample& s : samples) {
    const char* name = StackPhaseName(PhaseOf(s, roles));
    if (!phase.empty() && phase != name) continue;
    out += name;
    out += ";process " + std::to_string(s.pid);
    if (s.tid) out += ";thread " + std::to_string(s.tid) + (s.thread.empty() ? "" : " " + s.thread);
    for (const StackFrame& f : s.frames) {
      out += ';';
      out += f.function;
      if (!f.file.empty()) out += fmt::format(" ({}{})", f.file, f.line > 0 ? ":" + std::to_string(f.line) : "");
    }
    out += " " + std::to_string(s.count) + "\n";
  }
  return out;
}

nlohmann::json SpeedscopeJson(const std::vector<StackSample>& samples, int root, double rate_hz,
                              const std::string& name) {
  StackRoles roles = FindStackRoles(samples, root);
  nlohmann::json frames = nlohmann::json::array();
  std::map<std::tuple<std::string, std::string, int>, int> index;
  auto frame_index = [&](const StackFrame& f) {
    auto key = std::make_tuple(f.function, f.file, f.line);
    auto it = index.find(key);
    if (it != index.end()) return it->second;
    int i = static_cast<int>(frames.size());
    nlohmann::json fr = {{"name", f.function}};
    if (!f.file.empty()) fr["file"] = f.file;
    if (f.line > 0) fr["line"] = f.line;
    frames.push_back(fr);
    index.emplace(key, i);
    return i;
  };
  const double unit = rate_hz > 0 ? 1.0 / rate_hz : 0.01;
  nlohmann::json profiles = nlohmann::json::array();
  for (const PhaseDef& d : kPhases) {
    nlohmann::json stacks = nlohmann::json::array(), weights = nlohmann::json::array();
    double total = 0;
    for (const StackSample& s : samples) {
      if (PhaseOf(s, roles) != d.phase) continue;
      nlohmann::json stack = nlohmann::json::array();
      for (const StackFrame& f : s.frames) stack.push_back(frame_index(f));
      stacks.push_back(stack);
      weights.push_back(s.count * unit);
      total += s.count * unit;
    }
    if (stacks.empty()) continue;
    profiles.push_back({{"type", "sampled"}, {"name", d.name}, {"unit", "seconds"}, {"startValue", 0},
                        {"endValue", total}, {"samples", stacks}, {"weights", weights}});
  }
  return {{"$schema", "https://www.speedscope.app/file-format-schema.json"},
          {"shared", {{"frames", frames}}},
          {"profiles", profiles},
          {"name", name},
          {"exporter", "fullburn"}};
}

}  // namespace fullburn
