// Pipeline: the input pipeline's libtorch-free core, from image files (or a
// pack, or token files) to batches in host memory. This header is an
// umbrella: it includes every header of the pipeline, one per concept, each
// with its own contract (ownership, threads, errors):
//
//   codec.h         JPEG (header, whole and region decode, encode) and PNG
//   crop.h          torchvision's crop geometry, the fused resize and flip,
//                   Normalization and NormalizeInto
//   image_folder.h  image folders, whole-file reads, synthetic image folders
//   pack.h          packed datasets: WritePack, PackReader
//   tokens.h        token shards for language models, synthetic token files
//   rng.h           SplitMix and EpochPermutation: the (seed, epoch) order
//   sample_ring.h   SampleRing: every loader's worker threads, epoch order,
//                   shards and batch slots; Batch, LoaderStats, LoaderPosition
//   image_loader.h  ImageLoader and LoaderOptions: images into the ring's slots
//
// Contract
// - No libtorch: batches are uint8 images (NHWC or NCHW) plus int32 labels
//   in pre-allocated slots. With LoaderOptions::normalize enabled the
//   loader's workers write float32 images, (v / 255 - mean) / std, instead;
//   otherwise normalization and the cast to float happen later, on the device
//   (torch_loader.h, in the training half).
// - Stages are plain functions (decode, crop geometry, resize, normalize), so
//   each is tested alone; ImageLoader runs them on the ring's worker threads.
// - The batch sequence is a function of (seed, epoch) only: the same whatever
//   the thread count.
// - Expected failures come back as Status/Result; no exception leaves a
//   worker thread.
#pragma once

#include "fullburn/codec.h"
#include "fullburn/crop.h"
#include "fullburn/image_folder.h"
#include "fullburn/image_loader.h"
#include "fullburn/pack.h"
#include "fullburn/rng.h"
#include "fullburn/sample_ring.h"
#include "fullburn/tokens.h"
