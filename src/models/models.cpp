// MLP, LSTM classifier, GPT decoder and the factory.
#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "fullburn/autocast_state.h"
#include "models_internal.h"

namespace fullburn {
namespace {

namespace nn = torch::nn;

class Mlp : public Model {
 public:
  explicit Mlp(const ModelSpec& s) {
    int64_t in = s.in_features;
    for (int64_t i = 0; i < s.layers; ++i) {
      layers_->push_back(FastLinear(in, s.hidden));
      layers_->push_back(nn::ReLU());
      if (s.dropout > 0) layers_->push_back(nn::Dropout(s.dropout));
      in = s.hidden;
    }
    layers_->push_back(FastLinear(in, s.num_classes));
    register_module("layers", layers_);
  }
  torch::Tensor forward(torch::Tensor x) override {
    if (!gather_) return layers_->forward(x.flatten(1));
    x = x.flatten(1);
    for (auto& m : *layers_) {  // each linear layer gathered on its own
      auto linear = std::dynamic_pointer_cast<FastLinearImpl>(m.ptr());
      if (!linear) {
        x = m.forward(x);
        continue;
      }
      if (gather_->keeps_parameters()) {
        gather_->Gather(linear->parameters());
        x = linear->forward(x);
        continue;
      }
      FastLinear holder(linear);
      x = CheckpointForward(
          [holder](const torch::Tensor& in) mutable { return holder->forward(in); }, x,
          linear->parameters(), {}, gather_);
    }
    return x;
  }
  bool SetParameterGather(std::shared_ptr<ParameterGather> gather,
                          std::vector<std::vector<torch::Tensor>>* blocks) override {
    gather_ = std::move(gather);
    blocks->clear();
    for (auto& m : *layers_)
      if (auto linear = std::dynamic_pointer_cast<FastLinearImpl>(m.ptr()))
        blocks->push_back(linear->parameters());
    return true;
  }

 private:
  nn::Sequential layers_;
  std::shared_ptr<ParameterGather> gather_;
};

// Embedding -> LSTM -> the last step's hidden state -> classes.
class LstmClassifier : public Model {
 public:
  explicit LstmClassifier(const ModelSpec& s)
      : embed_(register_module("embed", nn::Embedding(s.vocab, s.hidden))),
        lstm_(register_module("lstm", nn::LSTM(nn::LSTMOptions(s.hidden, s.hidden)
                                                   .num_layers(s.layers)
                                                   .batch_first(true)
                                                   .dropout(s.layers > 1 ? s.dropout : 0)))),
        head_(register_module("head", FastLinear(s.hidden, s.num_classes))) {}
  torch::Tensor forward(torch::Tensor tokens) override {
    auto out = std::get<0>(lstm_->forward(embed_(tokens)));
    return head_(out.select(1, out.size(1) - 1));
  }

 private:
  nn::Embedding embed_;
  nn::LSTM lstm_;
  FastLinear head_;
};

struct GptBlockImpl : nn::Module {
  GptBlockImpl(int64_t d, int64_t heads, double dropout, bool cuda_norm)
      : heads(heads), dropout(dropout), cuda_norm(cuda_norm) {
    ln_1 = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({d})));
    c_attn = register_module("c_attn", FastLinear(d, 3 * d));
    attn_proj = register_module("attn_proj", FastLinear(d, d));
    ln_2 = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({d})));
    c_fc = register_module("c_fc", FastLinear(d, 4 * d));
    mlp_proj = register_module("mlp_proj", FastLinear(4 * d, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (cuda_norm && x.is_cuda()) return ForwardCudaNorm(x);
    x = x + torch::dropout(attn_proj(Attention(ln_1(x))), dropout, is_training());
    x = x + torch::dropout(mlp_proj(torch::gelu(c_fc(ln_2(x)), "tanh")), dropout, is_training());
    return x;
  }
  // The same block with model.norm_kernel = cuda: ln_2 takes the attention's
  // residual add with it, and both norms write autocast's dtype directly.
  torch::Tensor ForwardCudaNorm(const torch::Tensor& x) {
    const torch::ScalarType out = autocast_state::Enabled(torch::kCUDA)
                                      ? autocast_state::Dtype(torch::kCUDA)
                                      : x.scalar_type();
    torch::Tensor attn =
        torch::dropout(attn_proj(Attention(CudaLayerNorm(x, ln_1, out))), dropout, is_training());
    auto [sum, normed] = CudaAddLayerNorm(x, attn, ln_2, out);
    return sum +
           torch::dropout(mlp_proj(torch::gelu(c_fc(normed), "tanh")), dropout, is_training());
  }
  // Causal self-attention of the normed input, before its output projection.
  torch::Tensor Attention(const torch::Tensor& normed) {
    int64_t b = normed.size(0), t = normed.size(1), d = normed.size(2);
    auto qkv = c_attn(normed).split(d, 2);
    auto heads_of = [&](const torch::Tensor& y) {
      return y.view({b, t, heads, d / heads}).transpose(1, 2);
    };
    torch::Tensor y = CausalAttention(heads_of(qkv[0]), heads_of(qkv[1]), heads_of(qkv[2]),
                                      is_training() ? dropout : 0.0);
    return y.transpose(1, 2).contiguous().view({b, t, d});
  }
  int64_t heads;
  double dropout;
  bool cuda_norm;  // model.norm_kernel = cuda, in a build that has it
  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  FastLinear c_attn{nullptr}, attn_proj{nullptr}, c_fc{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(GptBlock);

// GPT-2's decoder (pre-LayerNorm blocks, GELU, tied input/output embedding,
// GPT-2's init with scaled residual projections).
class Gpt : public Model {
 public:
  explicit Gpt(const ModelSpec& s)
      : dropout_(s.dropout),
        segment_(CheckpointSegment(s.checkpoint)),
        vocab_(s.vocab),
        fused_loss_(s.fused_loss),
        cuda_loss_(s.loss_kernel == "cuda" && CudaKernelsBuilt()),
        loss_rows_(s.loss_rows) {
    const int64_t padded = (s.vocab + s.pad_vocab - 1) / s.pad_vocab * s.pad_vocab;
    // Built at the vocabulary's size, then grown: the padded model draws the
    // same random numbers as the unpadded one, so it starts from its weights.
    // The rows past the vocabulary are never looked up and are cut from the
    // logits: their gradient is zero, so at zero they stay zero (decay too).
    wte_ = register_module("wte", nn::Embedding(s.vocab, s.hidden));
    if (padded > s.vocab) {
      torch::NoGradGuard no_grad;
      wte_->weight.set_data(torch::cat({wte_->weight, torch::zeros({padded - s.vocab, s.hidden})}));
    }
    wpe_ = register_module("wpe", nn::Embedding(s.seq_len, s.hidden));
    for (int64_t i = 0; i < s.layers; ++i) {
      block_list_.push_back(
          GptBlock(s.hidden, s.heads, s.dropout, s.norm_kernel == "cuda" && CudaKernelsBuilt()));
      blocks_->push_back(block_list_.back());
    }
    register_module("h", blocks_);
    ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({s.hidden})));
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (name.find("ln_") != std::string::npos) continue;
      if (name.size() > 4 && name.substr(name.size() - 4) == "bias") {
        p.value().zero_();
      } else {
        bool residual = name.find("_proj.weight") != std::string::npos;
        double std = residual ? 0.02 / std::sqrt(2.0 * s.layers) : 0.02;
        (name == "wte.weight" ? p.value().narrow(0, 0, vocab_) : p.value()).normal_(0, std);
      }
    }
  }
  bool SetCheckpointing(const std::string& mode) override {
    int segment = CheckpointSegment(mode);
    if (segment < 0) return false;
    segment_ = static_cast<size_t>(segment);
    return true;
  }
  bool SetParameterGather(std::shared_ptr<ParameterGather> gather,
                          std::vector<std::vector<torch::Tensor>>* blocks) override {
    gather_ = std::move(gather);
    blocks->clear();
    std::vector<torch::Tensor> inside;
    for (GptBlock& b : block_list_) {
      blocks->push_back(b->parameters());
      inside.insert(inside.end(), blocks->back().begin(), blocks->back().end());
    }
    outside_blocks_ = ParametersOutside(*this, inside);
    return true;
  }
  torch::Tensor forward(torch::Tensor tokens) override {
    torch::Tensor logits = PaddedLogits(tokens);
    return logits.size(-1) == vocab_ ? logits : logits.narrow(-1, 0, vocab_);
  }
  torch::Tensor ForwardLoss(torch::Tensor tokens, const torch::Tensor& targets) override {
    if (cuda_loss_ && !fused_loss_ && tokens.is_cuda()) {
      // The padded logits whole: the kernel reads only the first vocab_ columns.
      torch::Tensor logits = PaddedLogits(tokens);
      return CudaCrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), vocab_);
    }
    if (!fused_loss_ || !torch::GradMode::is_enabled()) return Model::ForwardLoss(tokens, targets);
    torch::Tensor x = Features(tokens);
    return HeadCrossEntropy(x.reshape({-1, x.size(-1)}), wte_->weight, targets.reshape({-1}),
                            vocab_, loss_rows_ > 0 ? loss_rows_ : HeadLossRows(vocab_, x.device()));
  }
  bool SetFusedLoss(bool on) override {
    fused_loss_ = on;
    return true;
  }
  int64_t LossChunkRows() const override {
    if (!fused_loss_) return 0;
    return loss_rows_ > 0 ? loss_rows_ : HeadLossRows(vocab_, wte_->weight.device());
  }

 private:
  // The output layer's product over every row of the (padded) table.
  torch::Tensor PaddedLogits(const torch::Tensor& tokens) {
    return Linear(Features(tokens), wte_->weight, {});
  }
  // Everything but the output layer: ln_f's output, [batch, positions, width].
  torch::Tensor Features(const torch::Tensor& tokens) {
    int64_t t = tokens.size(1);
    if (gather_) gather_->Gather(outside_blocks_);  // held until the step's end (the tied head)
    torch::Tensor pos = torch::arange(t, tokens.options().dtype(torch::kLong));
    torch::Tensor x = torch::dropout(wte_(tokens) + wpe_(pos), dropout_, is_training());
    // Gathered blocks are recomputed in backward: their weights are gone by then.
    const bool frees = gather_ && !gather_->keeps_parameters();
    const size_t segment = frees ? std::max<size_t>(segment_, 1) : segment_;
    if (segment > 0 && (is_training() || frees)) {
      // Segments of `segment` blocks, each keeping only its input.
      for (size_t first = 0; first < block_list_.size(); first += segment) {
        std::vector<GptBlock> seg(
            block_list_.begin() + first,
            block_list_.begin() + std::min(block_list_.size(), first + segment));
        std::vector<torch::Tensor> params;
        for (GptBlock& b : seg)
          for (const torch::Tensor& p : b->parameters()) params.push_back(p);
        x = CheckpointForward(
            [seg](const torch::Tensor& in) mutable {
              torch::Tensor y = in;
              for (GptBlock& b : seg) y = b->forward(y);
              return y;
            },
            x, params, {}, gather_);
      }
    } else if (gather_) {  // each block waited for (dist.offload's update)
      for (GptBlock& b : block_list_) {
        gather_->Gather(b->parameters());
        x = b->forward(x);
      }
    } else {
      x = blocks_->forward(x);
    }
    return ln_f_(x);
  }

  double dropout_;
  size_t segment_;  // blocks per recomputed segment; 0: none
  int64_t vocab_;   // wte_ may hold more rows (ModelSpec::pad_vocab)
  bool fused_loss_;
  bool cuda_loss_;  // model.loss_kernel = cuda, in a build that has it
  int64_t loss_rows_;
  nn::Embedding wte_{nullptr}, wpe_{nullptr};
  nn::Sequential blocks_;
  std::vector<GptBlock> block_list_;  // blocks_'s, for checkpointing them one by one
  nn::LayerNorm ln_f_{nullptr};
  std::shared_ptr<ParameterGather> gather_;  // dist.shard = full
  std::vector<torch::Tensor> outside_blocks_;
};

}  // namespace

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true);
#else
  return std::get<0>(
      at::_scaled_dot_product_attention(q, k, v, {}, dropout, false, /*is_causal=*/true));
#endif
}

std::string AttentionKernel(int64_t heads, int64_t head_dim, int64_t positions,
                            torch::ScalarType dtype, const torch::Device& device, double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  torch::Tensor q = torch::empty({1, heads, positions, head_dim},
                                 torch::TensorOptions().device(device).dtype(dtype))
                        .requires_grad_(true);
  // ATen's sdp::SDPBackend: the first four numbers are the same in every 2.x.
  const int64_t backend = at::_fused_sdp_choice(q, q, q, {}, dropout, /*is_causal=*/true);
  switch (backend) {
    case 0:
      return "math";
    case 1:
      return "flash";
    case 2:
      return "efficient";
    case 3:
      return "cudnn";
    default:
      return "backend " + std::to_string(backend);
  }
#else
  (void)heads, (void)head_dim, (void)positions, (void)dtype, (void)device, (void)dropout;
  return "";
#endif
}

torch::Tensor Model::ForwardLoss(torch::Tensor input, const torch::Tensor& targets) {
  torch::Tensor logits = forward(std::move(input));
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                   targets.reshape({-1}));
}

std::shared_ptr<Model> MakeMlp(const ModelSpec& s) { return std::make_shared<Mlp>(s); }
std::shared_ptr<Model> MakeLstm(const ModelSpec& s) { return std::make_shared<LstmClassifier>(s); }
std::shared_ptr<Model> MakeGpt(const ModelSpec& s) { return std::make_shared<Gpt>(s); }

Result<std::shared_ptr<Model>> MakeModel(const ModelSpec& s) {
  if (s.num_classes < 1) return Status::InvalidArgument("the model needs at least one class");
  if (CheckpointSegment(s.checkpoint) < 0)
    return Status::InvalidArgument("model.checkpoint = '" + s.checkpoint +
                                   "': use none, blocks or every_K (K blocks per recomputed "
                                   "segment, e.g. every_2)");
  if (s.checkpoint != "none" && (s.name == "mlp" || s.name == "lstm"))
    return Status::InvalidArgument("model.checkpoint = " + s.checkpoint +
                                   " recomputes gpt blocks and resnet stages; " + s.name +
                                   " has none: set model.checkpoint = none");
  if (s.loss_kernel != "aten" && s.loss_kernel != "cuda")
    return Status::InvalidArgument("model.loss_kernel = '" + s.loss_kernel + "': use aten or cuda");
  if (s.norm_kernel != "aten" && s.norm_kernel != "cuda")
    return Status::InvalidArgument("model.norm_kernel = '" + s.norm_kernel + "': use aten or cuda");
  if (s.norm_kernel == "cuda" && s.name != "gpt")
    return Status::InvalidArgument("model.norm_kernel = cuda computes gpt's layer norms; " +
                                   s.name + " has none: set model.norm_kernel = aten");
  if (s.loss_kernel == "cuda" && s.name != "gpt")
    return Status::InvalidArgument("model.loss_kernel = cuda computes gpt's loss; " + s.name +
                                   " has none of its own: set model.loss_kernel = aten");
  if (s.fused_loss && s.name != "gpt")
    return Status::InvalidArgument(
        "model.fused_loss = true fuses gpt's output layer with its loss; " + s.name +
        " has none: set model.fused_loss = false");
  if (s.name == "resnet18" || s.name == "resnet50") return MakeResNet(s);
  if (s.name == "mlp") {
    if (s.in_features <= 0)
      return Status::InvalidArgument("mlp needs the input size (in_features)");
    return MakeMlp(s);
  }
  if (s.name == "lstm") return MakeLstm(s);
  if (s.name == "gpt") {
    if (s.hidden % s.heads != 0)
      return Status::InvalidArgument("model.hidden = " + std::to_string(s.hidden) +
                                     " is not divisible by model.heads = " +
                                     std::to_string(s.heads) + ": choose heads that divide it");
    return MakeGpt(s);
  }
  return Status::InvalidArgument("unknown model '" + s.name +
                                 "': use resnet18, resnet50, mlp, lstm or gpt");
}

int64_t ParameterCount(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace fullburn
