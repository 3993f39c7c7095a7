// The host of the precompiled <torch/torch.h> (cmake/TorchPch.cmake): the
// PCH is what this target builds; this file only gives it a source.
