// Checkpoints as safetensors files, written atomically, checksummed, and
// optionally on a background thread.
#include <ATen/Parallel.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "fullburn/tensorfile.h"
#include "fullburn/checkpoint.h"
#include "fullburn/cpu_memory_budget.h"

namespace fullburn {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
      return "F32";
    case torch::kDouble:
      return "F64";
    case torch::kHalf:
      return "F16";
    case torch::kBFloat16:
      return "BF16";
    case torch::kLong:
      return "I64";
    case torch::kInt:
      return "I32";
    case torch::kByte:
      return "U8";
    case torch::kBool:
      return "BOOL";
    default:
      return nullptr;
  }
}

std::optional<torch::ScalarType> DtypeOf(const std::string& name) {
  static const std::pair<const char*, torch::ScalarType> kTypes[] = {
      {"F32", torch::kFloat},     {"F64", torch::kDouble}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},   {"I32", torch::kInt},
      {"U8", torch::kByte},       {"BOOL", torch::kBool}};
  for (const auto& [n, t] : kTypes)
    if (name == n) return t;
  return std::nullopt;
}

// "step-00001234.safetensors" -> 1234; -1 for other names.
int64_t StepOfName(const std::string& name) {
  const std::string prefix = "step-", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

}  // namespace

Status WriteCheckpointFile(const std::string& path, const CheckpointState& state, int64_t* bytes) {
  std::vector<torch::Tensor> data;  // holds the host copies the records point into
  std::vector<TensorRecord> records;
  for (const auto& [name, tensor] : state.tensors) {
    torch::Tensor t = tensor.to(torch::kCPU).contiguous();
    const char* dtype = DtypeName(t.scalar_type());
    if (!dtype)
      return Status::InvalidArgument("checkpoint: tensor " + name + " has an unsupported dtype");
    records.push_back({name, dtype, t.sizes().vec(), t.data_ptr(),
                       static_cast<uint64_t>(t.numel() * t.element_size())});
    data.push_back(t);
  }
  Status s = WriteTensorFile(
      path, records, {{"format", "fullburn-checkpoint-1"}, {"fullburn", state.state_json}}, bytes);
  if (!s.ok()) return Status::IoError("checkpoint: " + s.message() + "; check checkpoint.dir");
  return s;
}

Result<CheckpointState> ReadCheckpointFile(const std::string& path) {
  Result<TensorFile> file = ReadTensorFile(path);
  if (!file.ok()) {
    if (file.status().code() != Status::Code::kCorruption)
      return Status(file.status().code() == Status::Code::kNotFound
                        ? Status::NotFound("cannot open checkpoint " + path +
                                           "; give an existing checkpoint file or a run id")
                        : file.status());
    return Status::Corruption("checkpoint " + file.status().message() +
                              "; resume from an earlier checkpoint");
  }
  auto bad = [&](const std::string& why) {
    return Status::Corruption("checkpoint " + path + " is unusable (" + why +
                              "): it was not written completely or was damaged; resume from an "
                              "earlier checkpoint");
  };
  if (file->metadata["format"] != "fullburn-checkpoint-1") return bad("not a fullburn checkpoint");
  if (!file->metadata.count("crc32")) return bad("no checksum");
  CheckpointState out;
  out.state_json = file->metadata.count("fullburn") ? file->metadata["fullburn"] : "{}";
  for (const TensorFileEntry& e : file->tensors) {
    auto dtype = DtypeOf(e.dtype);
    if (!dtype) return bad("tensor " + e.name + " has dtype " + e.dtype);
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(*dtype));
    if (static_cast<uint64_t>(t.numel() * t.element_size()) != e.size)
      return bad("tensor " + e.name + " has the wrong size");
    std::memcpy(t.data_ptr(), file->Data(e), e.size);
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

std::string OptimizerShardPath(const std::string& checkpoint_path, int rank, int world) {
  // "step-00000040.safetensors" -> "step-00000040.optim-1-of-3.safetensors":
  // not a step's name to ListCheckpoints.
  std::string base = checkpoint_path;
  const std::string suffix = ".safetensors";
  if (base.size() > suffix.size() &&
      base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0)
    base.resize(base.size() - suffix.size());
  return base + ".optim-" + std::to_string(rank) + "-of-" + std::to_string(world) + suffix;
}

namespace {

int64_t JsonInt(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>()
                                                                        : -1;
}

// Whether a part's (or a failure marker's) identity is rank `rank`'s part
// of the checkpoint `id` names.
bool SameCheckpoint(const nlohmann::json& m, const ShardIdentity& id, int64_t rank) {
  return JsonInt(m, "step") == id.step && JsonInt(m, "world") == id.world &&
         JsonInt(m, "rank") == rank && JsonInt(m, "run_id") == id.run_id;
}

// A part's identity from its file's header alone (the resume verifies the
// data); null when it is not (yet) a readable part.
nlohmann::json PartIdentityOf(const std::string& path) {
  auto meta = ReadTensorFileMetadata(path);
  if (!meta.ok() || !meta->count("fullburn")) return nullptr;
  return nlohmann::json::parse(meta->at("fullburn"), nullptr, false);
}

}  // namespace

std::string ShardIdentityJson(const ShardIdentity& id) {
  return nlohmann::json{
      {"step", id.step}, {"rank", id.rank}, {"world", id.world}, {"run_id", id.run_id}}.dump();
}

Result<CheckpointState> ReadCheckpointWithShards(const std::string& path) {
  Result<CheckpointState> main = ReadCheckpointFile(path);
  if (!main.ok()) return main;
  nlohmann::json meta = nlohmann::json::parse(main->state_json, nullptr, false);
  ShardIdentity id;
  id.world = static_cast<int>(JsonInt(meta, "optim_shards"));
  id.step = JsonInt(meta, "step");
  id.run_id = JsonInt(meta, "run_id");
  const int64_t world = id.world;
  for (int64_t r = 0; r < world; ++r) {
    std::string part = OptimizerShardPath(path, static_cast<int>(r), static_cast<int>(world));
    auto unusable = [&](const std::string& why) {
      return Status::Corruption("checkpoint " + path + " was saved by " + std::to_string(world) +
                                " ranks, and rank " + std::to_string(r) +
                                "'s optimizer state is unusable (" + why +
                                "): keep every *.optim-*-of-" + std::to_string(world) +
                                ".safetensors file beside it, or resume from an earlier one");
    };
    Result<CheckpointState> shard = ReadCheckpointFile(part);
    if (!shard.ok()) return unusable(shard.status().message());
    // A part left by another run or attempt under the same name is not this one's.
    if (!SameCheckpoint(nlohmann::json::parse(shard->state_json, nullptr, false), id, r))
      return unusable(part +
                      " belongs to another checkpoint (step, world size, rank or run differ)");
    for (auto& t : shard->tensors) main->tensors.push_back(std::move(t));
  }
  return main;
}

// The optimizer-state files beside a step's checkpoint (any world size), and
// their temporary files and failure markers.
static void RemoveOptimizerShards(const std::string& checkpoint_path) {
  size_t slash = checkpoint_path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : checkpoint_path.substr(0, slash);
  std::string name = checkpoint_path.substr(slash == std::string::npos ? 0 : slash + 1);
  std::string prefix = name.substr(0, name.size() - std::string(".safetensors").size()) + ".optim-";
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> doomed;
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) doomed.push_back(dir + "/" + e->d_name);
    ::closedir(d);
    for (const std::string& p : doomed) ::unlink(p.c_str());
  }
}

void MarkOptimizerShardFailed(const std::string& part_path, const ShardIdentity& id,
                              const std::string& why) {
  nlohmann::json j = nlohmann::json::parse(ShardIdentityJson(id));
  j["why"] = why;
  std::ofstream(part_path + ".failed") << j.dump() << "\n";
}

Status WaitForOptimizerShards(const std::string& checkpoint_path, const ShardIdentity& id,
                              const std::atomic<bool>& cancel, double timeout_s) {
  const double start = Now();
  std::vector<bool> landed(static_cast<size_t>(id.world), false);
  auto fail = [&](const std::string& why) {
    for (int r = 0; r < id.world; ++r) {  // this world's parts only: a name other runs do not share
      std::string part = OptimizerShardPath(checkpoint_path, r, id.world);
      ::unlink(part.c_str());
      ::unlink((part + ".failed").c_str());
    }
    return Status::IoError("checkpoint at step " + std::to_string(id.step) + " not written: " + why);
  };
  for (;;) {
    int missing = -1;
    for (int r = 0; r < id.world; ++r) {
      if (landed[static_cast<size_t>(r)]) continue;
      std::string part = OptimizerShardPath(checkpoint_path, r, id.world);
      std::ifstream marker(part + ".failed");
      if (marker) {
        std::string text((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
        nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
        if (SameCheckpoint(m, id, r))
          return fail("rank " + std::to_string(r) + " could not write its part (" +
                      m.value("why", std::string("no reason given")) + ")");
      }
      if (SameCheckpoint(PartIdentityOf(part), id, r)) {
        landed[static_cast<size_t>(r)] = true;
      } else if (missing < 0) {
        missing = r;
      }
    }
    if (missing < 0) return Status::Ok();
    if (cancel.load()) return fail("the run stopped before every rank's part was written");
    if (Now() - start > timeout_s)
      return fail("rank " + std::to_string(missing) + "'s part " +
                  OptimizerShardPath(checkpoint_path, missing, id.world) + " did not appear within " +
                  std::to_string(static_cast<int>(timeout_s)) +
                  " s: with dist.shard every rank must write into one checkpoint.dir they share");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Parts (and their markers and temporary files) of steps before `newest`
// that have no step file: left by a checkpoint that failed while a rank was
// still writing its part. Checkpoints are written one at a time, so such a
// step will never get its file.
static void RemoveOrphanShards(const std::string& dir, int64_t newest) {
  std::vector<std::string> doomed;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      size_t mark = name.find(".optim-");
      int64_t step = mark == std::string::npos ? -1 : StepOfName(name.substr(0, mark) + ".safetensors");
      if (step >= 0 && step < newest && ::access(CheckpointPath(dir, step).c_str(), F_OK) != 0)
        doomed.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  for (const std::string& p : doomed) ::unlink(p.c_str());
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      int64_t step = StepOfName(e->d_name);
      if (step >= 0) found.emplace_back(step, dir + "/" + e->d_name);
    }
    ::closedir(d);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

struct CheckpointWriter::Rep {
  std::string dir;
  int keep;
  bool async;
  std::function<void(const Written&)> done;
  std::function<std::string(int64_t)> path;
  std::function<Status(int64_t)> before_write;
  std::map<std::string, torch::Tensor> staging;  // host copies, reused
  std::thread thread;
  mutable std::mutex mu;
  std::condition_variable staged_cv;
  bool staged = true;       // under mu: the until_update tensors are copied
  double fence_wait_s = 0;  // under mu: BeforeUpdate's wait for the checkpoint in flight
  Status error;             // under mu: the first failed write
  Status last;              // under mu: the latest outcome
  int64_t protected_step = -1;  // under mu
};

CheckpointWriter::CheckpointWriter(std::string dir, int keep, bool async,
                                   std::function<void(const Written&)> done)
    : rep_(std::make_unique<Rep>()) {
  rep_->dir = std::move(dir);
  rep_->keep = keep;
  rep_->async = async;
  rep_->done = std::move(done);
}

CheckpointWriter::~CheckpointWriter() { Wait(); }

void CheckpointWriter::Wait() {
  if (rep_->thread.joinable()) rep_->thread.join();
}

Status CheckpointWriter::status() const {
  std::lock_guard<std::mutex> lock(rep_->mu);
  return rep_->error;
}

void CheckpointWriter::RecordLocked(const Status& s) {
  rep_->last = s;
  if (!s.ok() && rep_->error.ok()) rep_->error = s;
}

Status CheckpointWriter::last_status() const {
  std::lock_guard<std::mutex> lock(rep_->mu);
  return rep_->last;
}

torch::Tensor& CheckpointWriter::Staging(const std::string& name, const torch::Tensor& like) {
  torch::Tensor& host = rep_->staging[name];
  if (!host.defined() || host.sizes() != like.sizes() || host.scalar_type() != like.scalar_type()) {
    NotCountedInBudget host_memory;  // a GPU run stages in host memory, outside the device's
    host = torch::empty(like.sizes(), like.options().device(torch::kCPU));
  }
  return host;
}

void CheckpointWriter::Stage(std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                             bool parallel) {
  for (auto& [name, t] : *tensors) {
    torch::Tensor& host = rep_->staging.at(name);  // made by Save on the caller's thread
    torch::Tensor src = t.detach();
    if (src.is_cpu() && src.is_contiguous()) {
      const char* from = static_cast<const char*>(src.data_ptr());
      char* to = static_cast<char*>(host.data_ptr());
      int64_t n = src.numel() * src.element_size();
      if (parallel)  // the loop is stopped anyway: copy with every intra-op thread
        at::parallel_for(0, n, int64_t{1} << 20, [&](int64_t begin, int64_t end) {
          std::memcpy(to + begin, from + begin, static_cast<size_t>(end - begin));
        });
      else  // on the writer thread: leave the intra-op pool to the training step
        std::memcpy(to, from, static_cast<size_t>(n));
    } else {
      host.copy_(src);
    }
    t = host;
  }
}

double CheckpointWriter::Save(int64_t step, CheckpointState state) {
  double start = Now();
  Wait();  // one write in flight at most: memory stays bounded, staging reusable
  // Every staging buffer is made here, on the caller's thread, so the writer
  // thread only fills existing ones (no map changes from two threads).
  for (const auto* list : {&state.tensors, &state.until_update})
    for (const auto& [name, t] : *list) Staging(name, t);
  Stage(&state.tensors, true);
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    rep_->staged = false;
    rep_->fence_wait_s = 0;
  }
  double stall = Now() - start;
  auto job = [this, step, stall](CheckpointState s) {
    NotCountedInBudget host_memory;
    try {
      Stage(&s.until_update, false);
    } catch (const std::exception& e) {  // never leave the loop waiting in BeforeUpdate
      {
        std::lock_guard<std::mutex> lock(rep_->mu);
        rep_->staged = true;
      }
      rep_->staged_cv.notify_all();
      Failed(step, stall, Status::IoError(std::string("checkpoint staging failed: ") + e.what()));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(rep_->mu);
      rep_->staged = true;
    }
    rep_->staged_cv.notify_all();
    for (auto& t : s.until_update) s.tensors.push_back(std::move(t));
    s.until_update.clear();
    try {
      Write(step, std::move(s), stall);
    } catch (const std::exception& e) {
      Failed(step, stall, Status::IoError(std::string("checkpoint write failed: ") + e.what()));
    }
  };
  if (rep_->async) {
    rep_->thread = std::thread(job, std::move(state));
  } else {
    job(std::move(state));
    stall = Now() - start;
  }
  return stall;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08lld.safetensors", static_cast<long long>(step));
  return dir + name;
}

void CheckpointWriter::Protect(int64_t step) {
  std::lock_guard<std::mutex> lock(rep_->mu);
  rep_->protected_step = step;
}

double CheckpointWriter::BeforeUpdate() {
  std::unique_lock<std::mutex> lock(rep_->mu);
  if (rep_->staged) return 0;
  double start = Now();
  rep_->staged_cv.wait(lock, [this] { return rep_->staged; });
  rep_->fence_wait_s = Now() - start;
  return rep_->fence_wait_s;
}

void CheckpointWriter::SetPath(std::function<std::string(int64_t)> path) {
  rep_->path = std::move(path);
}

std::string CheckpointWriter::PathOf(int64_t step) const {
  return rep_->path ? rep_->path(step) : CheckpointPath(rep_->dir, step);
}

// A write that threw: recorded, and told to `done` like any other outcome
// (a sharded rank's callback leaves the marker rank 0 waits for).
void CheckpointWriter::Failed(int64_t step, double stall_s, const Status& s) {
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    RecordLocked(s);
  }
  if (rep_->done) rep_->done(Written{step, PathOf(step), 0, stall_s, 0, s});
}

void CheckpointWriter::SetBeforeWrite(std::function<Status(int64_t)> hook) {
  rep_->before_write = std::move(hook);
}

void CheckpointWriter::Write(int64_t step, CheckpointState state, double stall_s) {
  double start = Now();
  Written w{step, PathOf(step), 0, stall_s, 0, Status::Ok()};
  if (rep_->before_write) w.status = rep_->before_write(step);
  if (w.status.ok()) {
    w.status = WriteCheckpointFile(w.path, state, &w.bytes);
    // The parts the hook waited for: no step file will name them.
    if (!w.status.ok() && rep_->before_write) RemoveOptimizerShards(w.path);
  }
  w.write_s = Now() - start;
  {
    std::lock_guard<std::mutex> lock(rep_->mu);
    w.stall_s += rep_->fence_wait_s;  // the loop's wait in BeforeUpdate, if any came yet
    RecordLocked(w.status);
  }
  if (w.status.ok() && rep_->keep >= 0) {
    int64_t kept_step;
    {
      std::lock_guard<std::mutex> lock(rep_->mu);
      kept_step = rep_->protected_step;
    }
    int kept = 0;
    for (const std::string& path : ListCheckpoints(rep_->dir))
      if (StepOfName(path.substr(path.rfind('/') + 1)) != kept_step && kept++ >= rep_->keep) {
        ::unlink(path.c_str());
        RemoveOptimizerShards(path);  // a sharded run's state beside it
      }
    RemoveOrphanShards(rep_->dir, step);
  }
  if (rep_->done) rep_->done(w);
}

}  // namespace fullburn
