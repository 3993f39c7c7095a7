// profile.steps: torch's profiler over optimizer steps A to B, one Chrome
// trace per rank beside the run store, the same files `fullburn run
// --profile` writes for a Python job (docs/analyze.md, "From a run").
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "fullburn/atomic_file.h"
#include "fullburn/step_range.h"
#include "trainer_impl.h"

namespace fullburn {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

Status Trainer::SetupProfile() {
  std::string spec = set_.profile.steps;
  if (spec.empty()) return Status::Ok();
  auto steps = ParseStepRange(spec, 1);  // optimizer steps count from 1
  if (!steps.ok())
    return Status::InvalidArgument("profile.steps = " + steps.status().message() +
                                   " (the optimizer steps to trace, e.g. profile.steps=20-25)");
  std::tie(profile_first_, profile_last_) = *steps;
  return Status::Ok();
}

void Trainer::ProfileBeforeStep() {
  if (profile_first_ == 0 || profiling_ || step_ + 1 != profile_first_) return;
  impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (model_.ctx().device.is_cuda()) activities.insert(impl::ActivityType::CUDA);
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    profiling_ = true;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "fullburn: profile.steps: the profiler did not start (%s); training on\n",
                 what.substr(0, what.find('\n')).c_str());
    profile_first_ = 0;
  }
}

std::unique_ptr<at::RecordFunction> Trainer::ProfileScope(const std::string& name) const {
  if (!profiling_) return nullptr;
  auto scope = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (scope->isActive()) scope->before(name);
  return scope;
}

std::unique_ptr<at::RecordFunction> Trainer::ProfileStepScope() const {
  // torch.profiler's own step marker, which the analysis cuts steps by.
  return ProfileScope("ProfilerStep#" + std::to_string(step_ + 1));
}

namespace {

// KinetoEvent's times were microseconds (1.13) and are nanoseconds in newer
// libtorch: whichever this one has.
template <typename E>
auto StartUs(const E& e, int) -> decltype(e.startUs(), uint64_t()) {
  return e.startUs();
}
template <typename E>
uint64_t StartUs(const E& e, long) {
  return e.startNs() / 1000;
}
template <typename E>
auto DurationUs(const E& e, int) -> decltype(e.durationUs(), uint64_t()) {
  return e.durationUs();
}
template <typename E>
uint64_t DurationUs(const E& e, long) {
  return e.durationNs() / 1000;
}

// A libtorch built without Kineto (Debian's) collects the host's ops but
// cannot write them: the same Chrome trace the legacy profiler's
// export_chrome_trace writes, one complete event per op.
Status WriteHostTrace(const prof::ProfilerResult& result, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  const int pid = ::getpid();
  for (const prof::KinetoEvent& e : result.events()) {
    if (e.deviceType() != c10::DeviceType::CPU) continue;
    events.push_back({{"ph", "X"},
                      {"cat", "cpu_op"},
                      {"name", e.name()},
                      {"pid", pid},
                      {"tid", e.startThreadId()},
                      {"ts", StartUs(e, 0)},
                      {"dur", DurationUs(e, 0)},
                      {"args", nlohmann::json::object()}});
  }
  nlohmann::json doc{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return WriteFileAtomically(path, doc.dump());
}

}  // namespace

void Trainer::ProfileAfterStep(bool loop_ended) {
  if (!profiling_ || (!loop_ended && step_ < profile_last_)) return;
  profiling_ = false;
  int64_t last = std::min(step_, profile_last_);
  std::unique_ptr<prof::ProfilerResult> result;
  {
    // A sliver of a step after the last one asked: the analysis, as HTA
    // does, leaves a trace's last step out, so every step asked stays whole.
    at::RecordFunction sliver(at::RecordScope::USER_SCOPE);
    if (sliver.isActive()) sliver.before("ProfilerStep#" + std::to_string(last + 1));
  }
  try {
    result = prof::disableProfiler();
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "fullburn: profile.steps: the profiler did not stop cleanly (%s)\n",
                 what.substr(0, what.find('\n')).c_str());
    return;
  }
  std::string store_path = opt_.store_path.empty() ? RunStore::DefaultPath() : opt_.store_path;
  std::string dir = StoreLayout(store_path).Traces(run_.id);
  std::string path = fmt::format("{}/rank{}.pt.trace.json", dir, rank_.rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  Status written = Status::Ok();
  try {
    result->save(path);  // Kineto's own trace, GPU kernels and all
  } catch (const std::exception&) {
    written = WriteHostTrace(*result, path);
  }
  if (!written.ok() || !std::filesystem::exists(path)) {
    std::fprintf(stderr, "fullburn: profile.steps: %s\n",
                 written.ok() ? ("no trace was written to " + path).c_str()
                              : written.message().c_str());
    return;
  }
  nlohmann::json data{{"path", std::filesystem::absolute(path).string()},
                      {"first_step", profile_first_},
                      {"last_step", last},
                      {"rank", rank_.rank}};
  RecordEvent({Env::Default()->UnixSeconds() - run_.start_time, "profile", data.dump()});
  if (rank_.rank == 0 && !opt_.quiet)
    std::fprintf(stderr, "fullburn: profiler trace of steps %lld-%lld: %s\n",
                 static_cast<long long>(profile_first_), static_cast<long long>(last),
                 path.c_str());
}

}  // namespace fullburn
