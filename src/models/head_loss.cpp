// The output layer and the cross-entropy in one autograd function, over
// chunks of rows, so that no [rows, vocabulary] tensor outlives its chunk.
//
// The plain path keeps the fp32 log-softmax of every position for backward
// and then allocates its gradient, as large again: at GPT-2's vocabulary and
// 16 x 1024 tokens, 3.3 GB each. Here forward keeps only its inputs; backward
// recomputes each chunk's logits and back-propagates through them, as
// activation checkpointing does for a block.
#include <torch/torch.h>

#include <algorithm>

#include "fullburn/autocast_state.h"
#include "fullburn/models.h"
#include "models_internal.h"

namespace fullburn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autocast is off inside (autocast_state::ScopedEnabled) for the function's
// own casts, whatever the caller had on: they cast exactly as autocast would
// (the product's inputs to its dtype, the logits to fp32), on the forward's
// and the backward's threads alike.

// Sum over the chunk's rows of logsumexp(logits) - logits[target], in fp32;
// `w`: the vocabulary's rows, already in the product's dtype.
torch::Tensor ChunkLossSum(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                           c10::ScalarType dtype) {
  torch::Tensor logits = Linear(x.to(dtype), w, {}).to(torch::kFloat);
  torch::Tensor picked = logits.gather(1, targets.unsqueeze(1)).squeeze(1);
  return (torch::logsumexp(logits, 1) - picked).sum();
}

class HeadLossFunction : public torch::autograd::Function<HeadLossFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w,
                               torch::Tensor targets, int64_t vocab, int64_t rows) {
    const c10::DeviceType type = x.device().type();
    c10::ScalarType dtype =
        autocast_state::Enabled(type) ? autocast_state::Dtype(type) : x.scalar_type();
    autocast_state::ScopedEnabled off(type, false);
    torch::Tensor wc = w.narrow(0, 0, vocab).to(dtype);  // cast once, not per chunk
    torch::Tensor sum = torch::zeros({}, x.options().dtype(torch::kFloat));
    const int64_t n = x.size(0);
    for (int64_t first = 0; first < n; first += rows) {
      int64_t len = std::min(rows, n - first);
      sum += ChunkLossSum(x.narrow(0, first, len), wc, targets.narrow(0, first, len), dtype);
    }
    ctx->save_for_backward({x, w, targets});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return sum / static_cast<double>(n);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor x = saved[0], w = saved[1], targets = saved[2];
    const int64_t vocab = ctx->saved_data["vocab"].toInt(), rows = ctx->saved_data["rows"].toInt();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    autocast_state::ScopedEnabled off(x.device().type(), false);
    const int64_t n = x.size(0);
    // d(mean)/d(row's term) = grad / n, the same for every chunk.
    torch::Tensor scale = grad_out[0].to(torch::kFloat) / static_cast<double>(n);
    // The cast weight is a leaf of each chunk's graph: its gradient is summed
    // here in fp32, and the padded rows' stays zero.
    torch::Tensor wc = w.narrow(0, 0, vocab).to(dtype).detach().requires_grad_(true);
    torch::Tensor dx = torch::empty_like(x), dw = torch::zeros_like(w, w.options().dtype(torch::kFloat));
    torch::Tensor dw_vocab = dw.narrow(0, 0, vocab);
    for (int64_t first = 0; first < n; first += rows) {
      int64_t len = std::min(rows, n - first);
      torch::Tensor xr = x.narrow(0, first, len).detach().requires_grad_(true);
      torch::AutoGradMode grad(true);
      torch::Tensor loss = ChunkLossSum(xr, wc, targets.narrow(0, first, len), dtype) * scale;
      variable_list g = torch::autograd::grad({loss}, {xr, wc});
      torch::NoGradGuard no_grad;
      dx.narrow(0, first, len).copy_(g[0]);
      dw_vocab += g[1];
    }
    return {dx, dw.to(w.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor HeadCrossEntropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                               int64_t vocab, int64_t rows) {
  return HeadLossFunction::apply(x, w, targets, vocab, std::max<int64_t>(1, rows));
}

int64_t HeadLossRows(int64_t vocab, const torch::Device& device) {
  // fp32 logits per chunk: 256 MiB keeps a GPU's products large; a CPU's are
  // efficient far smaller, and its memory is the scarcer.
  int64_t bytes = device.is_cuda() ? int64_t{256} << 20 : int64_t{32} << 20;
  return std::max<int64_t>(1, bytes / (4 * vocab));
}

}  // namespace fullburn
