// SGD, AdamW and LARS over named parameter tensors, and the LR schedule.
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "fullburn/optim.h"

// Where this libtorch has torch's fused optimizer kernels (optim.fused).
#define FULLBURN_FUSED_ADAMW \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define FULLBURN_FUSED_SGD \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))

namespace fullburn {

struct Optimizer::AsyncUpdate {
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> updated;  // under mu: params_ whose update is in them
  std::exception_ptr error;   // under mu: the first failed update's
};

namespace {

// SGD's and LARS's direction before momentum: the gradient plus weight decay,
// for LARS scaled by the layer's trust ratio (You et al. 2017:
// trust * |w| / |g + wd w|, skipped for 1-D parameters), computed on the
// device: no host sync per layer.
torch::Tensor SgdDirection(const torch::Tensor& p, const torch::Tensor& g,
                           const OptimizerOptions& o) {
  torch::Tensor d = o.weight_decay != 0 ? g.add(p, o.weight_decay) : g;
  if (o.name != "lars" || p.dim() <= 1) return d;
  torch::Tensor w_norm = p.norm(), d_norm = d.norm();
  torch::Tensor ratio = torch::where(w_norm.gt(0).logical_and(d_norm.gt(0)),
                                     w_norm.div(d_norm).mul_(o.trust), torch::ones_like(w_norm));
  return d * ratio;
}

// [begin, end) index ranges over `bytes`, each group closed once it holds
// `cap` bytes or more (OptimizerOptions::foreach_group_bytes).
std::vector<std::pair<size_t, size_t>> ByteGroups(const std::vector<int64_t>& bytes, int64_t cap) {
  std::vector<std::pair<size_t, size_t>> groups;
  size_t begin = 0;
  int64_t held = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    held += bytes[i];
    if (held >= cap || i + 1 == bytes.size()) {
      groups.emplace_back(begin, i + 1);
      begin = i + 1;
      held = 0;
    }
  }
  return groups;
}

std::vector<torch::Tensor> Slice(const std::vector<torch::Tensor>& list,
                                 std::pair<size_t, size_t> range) {
  return {list.begin() + range.first, list.begin() + range.second};
}

}  // namespace

Optimizer::Optimizer(std::vector<std::pair<std::string, torch::Tensor>> params,
                     const OptimizerOptions& o)
    : o_(o), async_(std::make_unique<AsyncUpdate>()) {
  for (auto& [name, p] : params)
    if (p.requires_grad()) {
      index_[p.unsafeGetTensorImpl()] = params_.size();
      update_order_.push_back(params_.size());
      params_.push_back({name, p, {}, {}});
    }
}

std::vector<torch::Tensor> Optimizer::params() const {
  std::vector<torch::Tensor> out;
  for (const Param& p : params_) out.push_back(p.p);
  return out;
}

std::vector<std::string> Optimizer::names() const {
  std::vector<std::string> out;
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

void Optimizer::SetOwned(const std::vector<bool>& owned) {
  for (size_t i = 0; i < params_.size() && i < owned.size(); ++i) {
    params_[i].owned = owned[i];
    if (!owned[i]) params_[i].buf1 = params_[i].buf2 = torch::Tensor();
  }
}

void Optimizer::MoveStateToParameters() {
  for (Param& s : params_)
    for (torch::Tensor* b : {&s.buf1, &s.buf2})
      if (b->defined() && b->device() != s.p.device()) *b = b->to(s.p.device());
}

std::vector<std::string> Optimizer::StateSlots() const {
  if (o_.name == "adamw") return {".exp_avg", ".exp_avg_sq"};
  if (o_.momentum != 0) return {".momentum"};
  return {};
}

int64_t Optimizer::StateBytes() const {
  int64_t bytes = 0;
  for (const Param& p : params_)
    for (const torch::Tensor* b : {&p.buf1, &p.buf2})
      if (b->defined()) bytes += b->numel() * b->element_size();
  return bytes;
}

void Optimizer::ZeroGrad() {
  for (Param& p : params_)
    if (p.p.grad().defined()) p.p.mutable_grad() = torch::Tensor();  // set_to_none, as torch 2.x
}

// Optimizer::Step over lists: the same formulas, each operation one
// multi-tensor kernel. Needs every taken parameter's state to exist (the
// first step of SGD's momentum creates it from the direction: the loop does).
bool Optimizer::StepForeach(double lr) {
  if (o_.name == "lars") return false;
  std::vector<torch::Tensor> p, g, m, v;
  std::vector<int64_t> bytes;
  for (Param& s : params_) {
    if (!s.p.grad().defined() || !s.owned) continue;
    if (o_.name == "adamw" && !s.buf1.defined()) {
      s.buf1 = torch::zeros_like(s.p);
      s.buf2 = torch::zeros_like(s.p);
    }
    if (o_.name != "adamw" && o_.momentum != 0 && !s.buf1.defined()) return false;
    p.push_back(s.p);
    bytes.push_back(s.p.numel() * static_cast<int64_t>(s.p.element_size()));
    g.push_back(s.p.grad());
    if (s.buf1.defined()) m.push_back(s.buf1);
    if (s.buf2.defined()) v.push_back(s.buf2);
  }
  for (std::pair<size_t, size_t> group : ByteGroups(bytes, o_.foreach_group_bytes))
    StepForeachGroup(lr, Slice(p, group), Slice(g, group), m.empty() ? m : Slice(m, group),
                     v.empty() ? v : Slice(v, group));
  return true;
}

void Optimizer::StepForeachGroup(double lr, const std::vector<torch::Tensor>& p,
                                 const std::vector<torch::Tensor>& g,
                                 const std::vector<torch::Tensor>& m,
                                 const std::vector<torch::Tensor>& v) {
  const double wd = o_.weight_decay;
#if FULLBURN_FUSED_ADAMW
  if (o_.fused && o_.name == "adamw") {
    // The kernel reads the step count from a device tensor per parameter
    // (read only: torch's own AdamW increments its counters before the call).
    torch::Tensor step =
        torch::full({}, static_cast<double>(steps_), p.front().options().dtype(torch::kFloat));
    std::vector<torch::Tensor> steps(p.size(), step);
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, o_.beta1, o_.beta2, wd, o_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
#endif
#if FULLBURN_FUSED_SGD
  if (o_.fused && o_.name == "sgd") {  // momentum buffers exist: not the first step
    at::_fused_sgd_(p, g, m, wd, o_.momentum, lr, /*dampening=*/0, o_.nesterov,
                    /*maximize=*/false, /*is_first_step=*/false);
    return;
  }
#endif
  if (o_.name == "adamw") {
    if (wd != 0) at::_foreach_mul_(p, 1 - lr * wd);
    at::_foreach_mul_(m, o_.beta1);
    at::_foreach_add_(m, g, 1 - o_.beta1);
    at::_foreach_mul_(v, o_.beta2);
    at::_foreach_addcmul_(v, g, g, 1 - o_.beta2);
    double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(steps_));
    double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(steps_));
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, std::sqrt(bc2));
    at::_foreach_add_(denom, o_.eps);
    at::_foreach_addcdiv_(p, m, denom, -lr / bc1);
    return;
  }
  std::vector<torch::Tensor> d = wd != 0 ? at::_foreach_add(g, p, wd) : g;
  if (o_.momentum != 0) {
    at::_foreach_mul_(m, o_.momentum);
    at::_foreach_add_(m, d);
    d = o_.nesterov ? at::_foreach_add(d, m, o_.momentum) : m;
  }
  at::_foreach_add_(p, d, -lr);
}

int64_t Optimizer::UpdateTemporaryBytes(const OptimizerOptions& o,
                                        const std::vector<int64_t>& param_bytes, bool gated) {
  if (param_bytes.empty()) return 0;
  const bool adamw = o.name == "adamw", wd = o.weight_decay != 0, lars = o.name == "lars";
  const bool nesterov = !adamw && o.momentum != 0 && o.nesterov;
  // Tensors the size of one parameter alive at once, counted from the
  // formulas below (an upper bound where they differ by parameter).
  int k;
  if (gated)  // StepGated: lerp's g * g or the direction, then buf1 / denom * step_size
    k = adamw ? 3 : (wd || lars ? 1 : 0) + 1 + (nesterov ? 1 : 0);
  else if (o.fused && !lars)  // one kernel, in place
    k = 0;
  else if (adamw)  // the denominator
    k = 1;
  else
    k = (wd ? 1 : 0) + (lars ? 1 : 0) + (nesterov ? 1 : 0);
  // The multi-tensor path holds them for a whole group (the first SGD
  // step with momentum loops, but no later one does).
  if (!gated && o.foreach && !lars) {
    int64_t largest_group = 0;
    for (std::pair<size_t, size_t> group : ByteGroups(param_bytes, o.foreach_group_bytes)) {
      int64_t bytes = 0;
      for (size_t i = group.first; i < group.second; ++i) bytes += param_bytes[i];
      largest_group = std::max(largest_group, bytes);
    }
    return k * largest_group;
  }
  return k * *std::max_element(param_bytes.begin(), param_bytes.end());
}

const char* FusedUpdateUnused(const OptimizerOptions& o, const torch::Device& device) {
  if (o.name == "lars") return "LARS has no fused update (AdamW and SGD have)";
  if (o.name == "adamw" && !FULLBURN_FUSED_ADAMW)
    return "this libtorch (" TORCH_VERSION ") has no _fused_adamw_ (2.1 or later has)";
  if (o.name == "sgd" && !FULLBURN_FUSED_SGD)
    return "this libtorch (" TORCH_VERSION ") has no _fused_sgd_ (2.3 or later has)";
  if (!device.is_cuda()) return "it runs on CUDA devices only";
  return nullptr;
}

bool ForeachFor(const std::string& setting, bool cuda) {
  return setting == "true" || (setting == "auto" && cuda);
}

void Optimizer::Step(double lr) {
  StepAsync(lr);
  WaitForUpdate();
}

void Optimizer::StepAsync(double lr) {
  WaitForUpdate();
  torch::NoGradGuard no_grad;
  ++steps_;
  if (!offload_) {
    Update(lr);
    return;
  }
  // The gradients go to the host now: the caller zeroes them next.
  std::vector<size_t> pending;
  for (size_t i : update_order_) {
    Param& s = params_[i];
    if (!s.owned || !s.host.defined() || !s.p.grad().defined()) continue;
    s.host_grad.copy_(s.p.grad());
    pending.push_back(i);
  }
  {
    std::lock_guard<std::mutex> lock(async_->mu);
    async_->updated.assign(params_.size(), true);
    for (size_t i : pending) async_->updated[i] = false;
    async_->error = nullptr;
  }
  async_->worker = std::thread([this, pending, lr] {
    torch::NoGradGuard no_grad_here;  // grad mode is per thread
    for (size_t i : pending) {
      Param& s = params_[i];
      try {
        UpdateOne(s, s.host, s.host_grad, lr);
        s.p.copy_(s.host);
      } catch (...) {
        std::lock_guard<std::mutex> lock(async_->mu);
        if (!async_->error) async_->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(async_->mu);
        async_->updated[i] = true;
      }
      async_->cv.notify_all();
    }
  });
}

void Optimizer::WaitFor(const std::vector<torch::Tensor>& params) {
  if (!async_->worker.joinable()) return;
  std::unique_lock<std::mutex> lock(async_->mu);
  for (const torch::Tensor& p : params) {
    auto it = index_.find(p.unsafeGetTensorImpl());
    if (it == index_.end()) continue;
    async_->cv.wait(lock, [&] { return async_->updated[it->second]; });
  }
  if (async_->error) std::rethrow_exception(async_->error);
}

void Optimizer::WaitForUpdate() {
  if (async_->worker.joinable()) async_->worker.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(async_->mu);
    std::swap(error, async_->error);
  }
  if (error) std::rethrow_exception(error);
}

Optimizer::~Optimizer() {
  if (async_->worker.joinable()) async_->worker.join();
}

void Optimizer::SetUpdateOrder(const std::vector<torch::Tensor>& first) {
  WaitForUpdate();
  std::vector<bool> taken(params_.size(), false);
  update_order_.clear();
  for (const torch::Tensor& p : first) {
    auto it = index_.find(p.unsafeGetTensorImpl());
    if (it == index_.end() || taken[it->second]) continue;
    taken[it->second] = true;
    update_order_.push_back(it->second);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!taken[i]) update_order_.push_back(i);
}

void Optimizer::SetOffload() {
  torch::NoGradGuard no_grad;
  offload_ = true;
  for (Param& s : params_) {
    if (!s.owned) continue;
    auto host_options = s.p.options().device(torch::kCPU).dtype(torch::kFloat);
    if (s.p.is_cuda()) host_options = host_options.pinned_memory(true);
    s.host = torch::empty(s.p.sizes(), host_options);
    s.host.copy_(s.p);
    s.host.requires_grad_(true);
    s.host_grad = torch::empty(s.p.sizes(), host_options);
    if (s.buf1.defined()) s.buf1 = s.buf1.to(host_options.pinned_memory(false));
    if (s.buf2.defined()) s.buf2 = s.buf2.to(host_options.pinned_memory(false));
  }
}

int64_t Optimizer::OffloadBytes() const {
  const int64_t per_element = 4 * (2 + static_cast<int64_t>(StateSlots().size()));
  int64_t bytes = 0;
  for (const Param& s : params_)
    if (s.owned) bytes += s.p.numel() * per_element;
  return bytes;
}

void Optimizer::Update(double lr) {
  if ((o_.foreach || o_.fused) && StepForeach(lr)) return;
  for (Param& s : params_)
    if (s.p.grad().defined() && s.owned) UpdateOne(s, s.p, s.p.grad(), lr);
}

// One parameter's update: `p` is the parameter, or its host copy
// (dist.offload), and `g` its gradient there; the state lives beside `p`.
void Optimizer::UpdateOne(Param& s, torch::Tensor p, const torch::Tensor& g, double lr) {
  const double wd = o_.weight_decay;
  if (o_.name == "adamw") {
    if (!s.buf1.defined()) {
      s.buf1 = torch::zeros_like(p);
      s.buf2 = torch::zeros_like(p);
    }
    if (wd != 0) p.mul_(1 - lr * wd);
    s.buf1.lerp_(g, 1 - o_.beta1);
    s.buf2.mul_(o_.beta2).addcmul_(g, g, 1 - o_.beta2);
    double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(steps_));
    double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(steps_));
    torch::Tensor denom = s.buf2.sqrt().div_(std::sqrt(bc2)).add_(o_.eps);  // one temporary
    p.addcdiv_(s.buf1, denom, -lr / bc1);
    return;
  }
  torch::Tensor d = SgdDirection(p, g, o_);
  if (o_.momentum != 0) {
    if (!s.buf1.defined())
      s.buf1 = d.clone().detach();
    else
      s.buf1.mul_(o_.momentum).add_(d);
    d = o_.nesterov ? d.add(s.buf1, o_.momentum) : s.buf1;
  }
  p.add_(d, -lr);
}

void Optimizer::InitState() {
  torch::NoGradGuard no_grad;
  bool adamw = o_.name == "adamw";
  for (Param& s : params_) {
    if (!s.owned) continue;
    if ((adamw || o_.momentum != 0) && !s.buf1.defined()) s.buf1 = torch::zeros_like(s.p);
    if (adamw && !s.buf2.defined()) s.buf2 = torch::zeros_like(s.p);
  }
}

void Optimizer::StepGated(const torch::Tensor& lr, const torch::Tensor& keep,
                          const torch::Tensor& steps) {
  torch::NoGradGuard no_grad;
  const double wd = o_.weight_decay;
  torch::Tensor step_lr = lr * keep;  // 0 for a skipped step: nothing moves
  if (o_.name == "adamw") {
    // Bias corrections from the device's count; a count of 0 (every step so
    // far skipped) only happens with keep = 0, where max(.,1) avoids 0/0.
    torch::Tensor n = steps.clamp_min(1);
    torch::Tensor bc1 = 1 - torch::pow(o_.beta1, n),
                  bc2_sqrt = (1 - torch::pow(o_.beta2, n)).sqrt();
    torch::Tensor w1 = (1 - o_.beta1) * keep, w2 = (1 - o_.beta2) * keep;
    torch::Tensor step_size = step_lr / bc1, decay = 1 - step_lr * wd;
    for (Param& s : params_) {
      torch::Tensor g = s.p.grad();
      if (!g.defined() || !s.owned) continue;
      if (wd != 0) s.p.mul_(decay);
      s.buf1.lerp_(g, w1);  // beta1 * m + (1 - beta1) * g, or m when kept back
      s.buf2.lerp_(g * g, w2);
      torch::Tensor denom = s.buf2.sqrt().div_(bc2_sqrt).add_(o_.eps);
      s.p.sub_(s.buf1 / denom * step_size);
    }
    return;
  }
  // Momentum: m * buf + d on a taken step, buf unchanged on a skipped one.
  torch::Tensor momentum = 1 - keep * (1 - o_.momentum);
  for (Param& s : params_) {
    torch::Tensor g = s.p.grad();
    if (!g.defined() || !s.owned) continue;
    torch::Tensor d = SgdDirection(s.p, g, o_);
    if (o_.momentum != 0) {
      s.buf1.mul_(momentum).add_(d * keep);
      d = o_.nesterov ? d.add(s.buf1, o_.momentum) : s.buf1;
    }
    s.p.sub_(d * step_lr);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::State() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const Param& s : params_) {
    if (s.buf1.defined())
      out.emplace_back(s.name + (o_.name == "adamw" ? ".exp_avg" : ".momentum"), s.buf1);
    if (s.buf2.defined()) out.emplace_back(s.name + ".exp_avg_sq", s.buf2);
  }
  return out;
}

Status Optimizer::LoadState(const std::map<std::string, torch::Tensor>& state, int64_t steps) {
  torch::NoGradGuard no_grad;
  steps_ = steps;
  for (Param& s : params_) {
    auto load = [&](const std::string& key, torch::Tensor* buf) -> Status {
      auto it = state.find(s.name + key);
      if (it == state.end()) {
        *buf = torch::Tensor();
        return Status::Ok();
      }
      if (it->second.sizes() != s.p.sizes())
        return Status::InvalidArgument("optimizer state " + s.name + key +
                                       " does not match the model's parameter shape");
      *buf = it->second.to(s.p.device(), s.p.scalar_type()).clone();
      return Status::Ok();
    };
    if (Status st = load(o_.name == "adamw" ? ".exp_avg" : ".momentum", &s.buf1); !st.ok())
      return st;
    if (Status st = load(".exp_avg_sq", &s.buf2); !st.ok()) return st;
  }
  return Status::Ok();
}

double LrSchedule::At(int64_t step) const {
  if (warmup > 0 && step <= warmup) return peak * static_cast<double>(step) / warmup;
  if (!cosine || total <= warmup) return peak;
  double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
  return min_lr + (peak - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

}  // namespace fullburn
