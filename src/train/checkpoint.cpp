// Checkpoints as safetensors files, written atomically, checksummed, and
// optionally on a background thread.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "fullburn/train.h"

namespace fullburn {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "F32";
    case torch::kDouble: return "F64";
    case torch::kHalf: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kLong: return "I64";
    case torch::kInt: return "I32";
    case torch::kByte: return "U8";
    case torch::kBool: return "BOOL";
    default: return nullptr;
  }
}

std::optional<torch::ScalarType> DtypeOf(const std::string& name) {
  static const std::pair<const char*, torch::ScalarType> kTypes[] = {
      {"F32", torch::kFloat}, {"F64", torch::kDouble}, {"F16", torch::kHalf}, {"BF16", torch::kBFloat16},
      {"I64", torch::kLong},  {"I32", torch::kInt},    {"U8", torch::kByte},  {"BOOL", torch::kBool}};
  for (const auto& [n, t] : kTypes)
    if (name == n) return t;
  return std::nullopt;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
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
  nlohmann::json header = nlohmann::json::object();
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, tensor] : state.tensors) {
    torch::Tensor t = tensor.to(torch::kCPU).contiguous();
    const char* dtype = DtypeName(t.scalar_type());
    if (!dtype) return Status::InvalidArgument("checkpoint: tensor " + name + " has an unsupported dtype");
    uint64_t n = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    crc = crc32_z(crc, static_cast<const Bytef*>(t.data_ptr()), n);
    offset += n;
    data.push_back(t);
  }
  header["__metadata__"] = {{"format", "fullburn-checkpoint-1"},
                            {"fullburn", state.state_json},
                            {"crc32", std::to_string(crc)},
                            {"data_bytes", std::to_string(offset)}};
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // safetensors pads the header to 8 bytes
  uint64_t hlen = h.size();

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(Errno("cannot write checkpoint " + tmp) + "; check checkpoint.dir");
  bool ok = WriteAll(fd, &hlen, 8) && WriteAll(fd, h.data(), h.size());
  for (const torch::Tensor& t : data)
    ok = ok && WriteAll(fd, t.data_ptr(), t.numel() * t.element_size());
  ok = ok && ::fsync(fd) == 0;
  int saved = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = saved;
    return Status::IoError(Errno("cannot write checkpoint " + path) +
                           " (disk full?); earlier checkpoints are untouched");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::IoError(Errno("cannot rename checkpoint into " + path));
  }
  // The rename itself must reach the disk before the file counts as written.
  int dfd = ::open(DirOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (bytes) *bytes = static_cast<int64_t>(8 + hlen + offset);
  return Status::Ok();
}

Result<CheckpointState> ReadCheckpointFile(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("checkpoint " + path + " is unusable (" + why +
                              "): it was not written completely or was damaged; resume from an "
                              "earlier checkpoint");
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::NotFound(Errno("cannot open checkpoint " + path) +
                            "; give an existing checkpoint file or a run id");
  struct stat st;
  ::fstat(fd, &st);
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got != bytes.size()) return bad("short read");
  if (bytes.size() < 8) return bad("shorter than its header");
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > bytes.size() - 8) return bad("header runs past the end");
  auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(hlen), nullptr, false);
  if (!header.is_object() || !header.contains("__metadata__")) return bad("header is not safetensors JSON");
  const auto& meta = header["__metadata__"];
  if (meta.value("format", "") != "fullburn-checkpoint-1") return bad("not a fullburn checkpoint");
  const uint8_t* data = bytes.data() + 8 + hlen;
  uint64_t data_bytes = bytes.size() - 8 - hlen;
  if (std::to_string(data_bytes) != meta.value("data_bytes", ""))
    return bad("size " + std::to_string(data_bytes) + " bytes of data, header says " + meta.value("data_bytes", "?"));
  if (std::to_string(crc32_z(crc32(0L, Z_NULL, 0), data, data_bytes)) != meta.value("crc32", ""))
    return bad("checksum mismatch");
  CheckpointState out;
  out.state_json = meta.value("fullburn", "{}");
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    auto dtype = DtypeOf(info.value("dtype", ""));
    if (!dtype) return bad("tensor " + name + " has dtype " + info.value("dtype", "?"));
    std::vector<int64_t> shape = info["shape"].get<std::vector<int64_t>>();
    uint64_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
    if (begin > end || end > data_bytes) return bad("tensor " + name + " lies outside the file");
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(*dtype));
    if (static_cast<uint64_t>(t.numel() * t.element_size()) != end - begin)
      return bad("tensor " + name + " has the wrong size");
    std::memcpy(t.data_ptr(), data + begin, end - begin);
    out.tensors.emplace_back(name, t);
  }
  return out;
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

CheckpointWriter::CheckpointWriter(std::string dir, int keep, bool async,
                                   std::function<void(const Written&)> done)
    : dir_(std::move(dir)), keep_(keep), async_(async), done_(std::move(done)) {}

CheckpointWriter::~CheckpointWriter() { Wait(); }

void CheckpointWriter::Wait() {
  if (thread_.joinable()) thread_.join();
}

Status CheckpointWriter::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CheckpointWriter::RecordLocked(const Status& s) {
  last_ = s;
  if (!s.ok() && error_.ok()) error_ = s;
}

Status CheckpointWriter::last_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

torch::Tensor& CheckpointWriter::Staging(const std::string& name, const torch::Tensor& like) {
  torch::Tensor& host = staging_[name];
  if (!host.defined() || host.sizes() != like.sizes() || host.scalar_type() != like.scalar_type()) {
    NotCountedInBudget host_memory;  // a GPU run stages in host memory, outside the device's
    host = torch::empty(like.sizes(), like.options().device(torch::kCPU));
  }
  return host;
}

void CheckpointWriter::Stage(std::vector<std::pair<std::string, torch::Tensor>>* tensors, bool parallel) {
  for (auto& [name, t] : *tensors) {
    torch::Tensor& host = staging_.at(name);  // made by Save on the caller's thread
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
    std::lock_guard<std::mutex> lock(mu_);
    staged_ = false;
    fence_wait_s_ = 0;
  }
  double stall = Now() - start;
  auto job = [this, step, stall](CheckpointState s) {
    NotCountedInBudget host_memory;
    try {
      Stage(&s.until_update, false);
    } catch (const std::exception& e) {  // never leave the loop waiting in BeforeUpdate
      {
        std::lock_guard<std::mutex> lock(mu_);
        staged_ = true;
        RecordLocked(Status::IoError(std::string("checkpoint staging failed: ") + e.what()));
      }
      staged_cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      staged_ = true;
    }
    staged_cv_.notify_all();
    for (auto& t : s.until_update) s.tensors.push_back(std::move(t));
    s.until_update.clear();
    try {
      Write(step, std::move(s), stall);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      RecordLocked(Status::IoError(std::string("checkpoint write failed: ") + e.what()));
    }
  };
  if (async_) {
    thread_ = std::thread(job, std::move(state));
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
  std::lock_guard<std::mutex> lock(mu_);
  protected_step_ = step;
}

double CheckpointWriter::BeforeUpdate() {
  std::unique_lock<std::mutex> lock(mu_);
  if (staged_) return 0;
  double start = Now();
  staged_cv_.wait(lock, [this] { return staged_; });
  fence_wait_s_ = Now() - start;
  return fence_wait_s_;
}

void CheckpointWriter::Write(int64_t step, CheckpointState state, double stall_s) {
  double start = Now();
  Written w{step, CheckpointPath(dir_, step), 0, stall_s, 0, Status::Ok()};
  w.status = WriteCheckpointFile(w.path, state, &w.bytes);
  w.write_s = Now() - start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w.stall_s += fence_wait_s_;  // the loop's wait in BeforeUpdate, if any came yet
    RecordLocked(w.status);
  }
  if (w.status.ok()) {
    int64_t kept_step;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept_step = protected_step_;
    }
    int kept = 0;
    for (const std::string& path : ListCheckpoints(dir_))
      if (StepOfName(path.substr(path.rfind('/') + 1)) != kept_step && kept++ >= keep_)
        ::unlink(path.c_str());
  }
  if (done_) done_(w);
}

}  // namespace fullburn
