// Crop: the pipeline's augment stage, from decoded pixels to a sample in its
// slot: torchvision's crop geometry, the fused bilinear resize (and flip),
// and the normalization to float.
//
// Contract
// - Plain functions of their arguments: the crop boxes depend only on the
//   image size, the parameters and the draws of `uniform` (the loader seeds
//   it from (seed, epoch, sample), never from a thread). The caller owns
//   every buffer; ResizeInto and NormalizeInto write exactly the output
//   they are given and keep nothing.
// - Threads: no shared state; any number of threads may call them at once
//   (on different outputs).
// - Errors: none; they cannot fail (the resize clamps its source taps to the
//   image). The caller passes outputs of the stated size.
#pragma once

#include <cstdint>
#include <functional>

#include "fullburn/codec.h"

namespace fullburn {

// ---- Crop geometry (torchvision's definitions) -----------------------------

struct CropParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};
// torchvision.transforms.RandomResizedCrop.get_params with `uniform` standing
// in for torch.rand: up to 10 tries of (area, log-ratio, top, left) draws, then
// the whole image clamped to the ratio range, centered. Integer box.
BoxF RandomResizedCropBox(int width, int height, const CropParams& p,
                          const std::function<double()>& uniform);
// Resize(shorter side = resize) then CenterCrop(crop), as one box in source pixels.
BoxF ResizeCenterCropBox(int width, int height, int resize, int crop);

// ---- Resize --------------------------------------------------------------------

enum class Layout { kNHWC, kNCHW };
// Bilinear resize (pixel centers, align_corners=False) of the source box of a
// decoded region into an out_w x out_h image at `dst`, optionally mirrored.
// Each output pixel is written exactly once.
void ResizeInto(const ImageView& src, const BoxF& box, int out_w, int out_h, bool flip,
                Layout layout, uint8_t* dst);
inline void ResizeInto(const DecodedRegion& src, const BoxF& box, int out_w, int out_h, bool flip,
                       Layout layout, uint8_t* dst) {
  ResizeInto(ImageView::Of(src), box, out_w, out_h, flip, layout, dst);
}

// ---- Normalization -------------------------------------------------------------

// Float images normalized by the loader's workers, in place of uint8 pixels:
// (pixel / 255 - mean) / std per RGB channel, torchvision's ToTensor +
// Normalize. The defaults are ImageNet's, as torchvision's examples use.
struct Normalization {
  bool enabled = false;
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};
// `pixels` RGB values of one image (in `layout`) as floats, (v / 255 - mean) / std
// per channel, into `dst` in the same layout.
void NormalizeInto(const uint8_t* src, int pixels, Layout layout, const Normalization& n, float* dst);

}  // namespace fullburn
