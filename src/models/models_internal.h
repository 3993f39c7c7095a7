// Constructors behind MakeModel, one file per family.
#pragma once

#include "fullburn/models.h"

namespace fullburn {

std::shared_ptr<Model> MakeResNet(const ModelSpec& spec);
std::shared_ptr<Model> MakeMlp(const ModelSpec& spec);
std::shared_ptr<Model> MakeLstm(const ModelSpec& spec);
std::shared_ptr<Model> MakeGpt(const ModelSpec& spec);
// softmax(q k^T / sqrt(d) + causal mask) v, through the fused kernel where
// this libtorch has one.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout);

}  // namespace fullburn
