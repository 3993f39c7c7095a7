// Activation checkpointing: a custom autograd function whose forward keeps
// only its input, and whose backward runs the forward again, with the random
// number generators and autocast as they were, to back-propagate through it.
#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include "fullburn/autocast_state.h"
#include "fullburn/models.h"
#include "models_internal.h"

namespace fullburn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs beside the input: the function, and the state the
// forward ran in.
struct Recompute : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  c10::Device device = c10::kCPU;
  at::Tensor cpu_rng, device_rng;  // device_rng: only for a CUDA input
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::kFloat;
  bool input_requires_grad = false;
  // Running statistics fn updates (BatchNorm's): put back after the
  // recompute, which would otherwise count its batch twice.
  std::vector<torch::Tensor> buffers;
  std::shared_ptr<ParameterGather> gather;  // dist.shard = full
};

at::Tensor RngState(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void SetRngState(at::Generator g, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

// The generators the forward drew from set to its states for the recompute,
// and put back after it, so the training's random stream goes on unchanged.
class ReplayRng {
 public:
  explicit ReplayRng(const Recompute& r) : r_(r) {
    cpu_now_ = RngState(Cpu());
    SetRngState(Cpu(), r.cpu_rng);
    if (r.device_rng.defined()) {
      device_now_ = RngState(Device());
      SetRngState(Device(), r.device_rng);
    }
  }
  ~ReplayRng() {
    SetRngState(Cpu(), cpu_now_);
    if (device_now_.defined()) SetRngState(Device(), device_now_);
  }

 private:
  static at::Generator Cpu() { return at::globalContext().defaultGenerator(c10::kCPU); }
  at::Generator Device() const { return at::globalContext().defaultGenerator(r_.device); }
  const Recompute& r_;
  at::Tensor cpu_now_, device_now_;
};

// Autocast as the forward had it, on the backward's thread.
class ReplayAutocast {
 public:
  explicit ReplayAutocast(const Recompute& r) : type_(r.device.type()) {
    was_ = autocast_state::Enabled(type_);
    was_dtype_ = autocast_state::Dtype(type_);
    autocast_state::SetEnabled(type_, r.autocast);
    autocast_state::SetDtype(type_, r.autocast_dtype);
    if (r.autocast) at::autocast::increment_nesting();
    nested_ = r.autocast;
  }
  ~ReplayAutocast() {
    if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    autocast_state::SetEnabled(type_, was_);
    autocast_state::SetDtype(type_, was_dtype_);
  }

 private:
  c10::DeviceType type_;
  bool was_ = false, nested_ = false;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

// Autocast keeps a low-precision copy of each weight it casts until its
// region ends (the whole forward); a gathered block's weights are let go
// after the block (dist.shard = full), so their copies must not outlive it.
class NoAutocastCacheIf {
 public:
  explicit NoAutocastCacheIf(bool on) : on_(on), was_(at::autocast::is_autocast_cache_enabled()) {
    if (on_) at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCacheIf() {
    if (on_) at::autocast::set_autocast_cache_enabled(was_);
  }

 private:
  bool on_, was_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> r,
                               torch::Tensor x, at::TensorList params) {
    r->device = x.device();
    r->cpu_rng = RngState(at::globalContext().defaultGenerator(c10::kCPU));
    if (x.is_cuda()) r->device_rng = RngState(at::globalContext().defaultGenerator(x.device()));
    r->autocast = autocast_state::Enabled(x.device().type());
    r->autocast_dtype = autocast_state::Dtype(x.device().type());
    r->input_requires_grad = x.requires_grad();
    ctx->save_for_backward({x});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(r);
    // The parameters are inputs so that their gradients flow back through
    // backward(); the recomputed graph reaches them as the same tensors.
    ctx->saved_data["params"] = params.vec();
    // Autograd runs forward() with gradients off: nothing of fn is kept.
    return r->fn(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto r = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    std::vector<torch::Tensor> params = ctx->saved_data["params"].toTensorVector();
    torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(r->input_requires_grad);
    torch::Tensor y;
    std::vector<torch::Tensor> kept;
    if (r->gather) r->gather->Gather(params);
    {
      torch::NoGradGuard no_grad;
      for (const torch::Tensor& b : r->buffers) kept.push_back(b.clone());
    }
    {
      ReplayRng rng(*r);
      ReplayAutocast cast(*r);
      NoAutocastCacheIf no_cache(r->gather && !r->gather->keeps_parameters());
      torch::AutoGradMode grad(true);
      y = r->fn(x);
    }
    // What a gradient is asked of: the input when it needs one, and every
    // parameter that does; kNone for the rest.
    constexpr size_t kNone = static_cast<size_t>(-1);
    variable_list wanted;
    size_t x_at = kNone;
    if (r->input_requires_grad) {
      x_at = wanted.size();
      wanted.push_back(x);
    }
    std::vector<size_t> param_at;
    for (const torch::Tensor& p : params) {
      param_at.push_back(p.requires_grad() ? wanted.size() : kNone);
      if (p.requires_grad()) wanted.push_back(p);
    }
    variable_list grads;
    if (!wanted.empty() && y.requires_grad())
      grads = torch::autograd::grad({y}, wanted, {grad_out[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    // After the gradients: BatchNorm's backward reads the buffers it saved.
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < kept.size(); ++i) r->buffers[i].copy_(kept[i]);
    }
    auto grad_at = [&](size_t i) { return i == kNone || grads.empty() ? torch::Tensor() : grads[i]; };
    variable_list out{torch::Tensor() /* the Recompute holder */, grad_at(x_at)};
    for (size_t i : param_at) out.push_back(grad_at(i));
    return out;
  }
};

}  // namespace

int CheckpointSegment(const std::string& checkpoint) {
  if (checkpoint == "none") return 0;
  if (checkpoint == "blocks") return 1;
  if (checkpoint.rfind("every_", 0) != 0) return -1;
  const std::string k = checkpoint.substr(6);
  if (k.empty() || k.size() > 4 || k.find_first_not_of("0123456789") != std::string::npos) return -1;
  int n = std::stoi(k);
  return n >= 1 ? n : -1;
}

std::vector<torch::Tensor> ParametersOutside(const torch::nn::Module& m,
                                             const std::vector<torch::Tensor>& inside) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : m.parameters()) {
    bool found = false;
    for (const torch::Tensor& q : inside) found = found || p.is_same(q);
    if (!found) out.push_back(p);
  }
  return out;
}

torch::Tensor CheckpointForward(std::function<torch::Tensor(const torch::Tensor&)> fn,
                                const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                                const std::vector<torch::Tensor>& buffers,
                                const std::shared_ptr<ParameterGather>& gather) {
  // Gathered before apply(): autograd records the parameters' shapes there
  // and checks backward's gradients against them.
  if (gather) gather->Gather(params);
  NoAutocastCacheIf no_cache(gather && !gather->keeps_parameters());
  torch::Tensor y;
  if (!torch::GradMode::is_enabled()) {
    y = fn(x);
  } else {
    auto r = c10::make_intrusive<Recompute>();
    r->fn = std::move(fn);
    r->buffers = buffers;
    r->gather = gather;
    y = CheckpointFunction::apply(r, x, at::TensorList(params));
  }
  if (gather) gather->Release(params);
  return y;
}

}  // namespace fullburn
