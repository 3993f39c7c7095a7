// Train: the training runtime behind `fullburn train` (training half, links
// libtorch; the monitoring half never includes this header).
//
// Contract
// - The thread that calls RunTraining owns the model, optimizer and data
//   source. The only other threads are the loader's workers, the telemetry
//   sampler (and NVML's PCIe reader), the record and checkpoint writers, the
//   rendezvous watchdog and, with dist.offload, the optimizer's update, each
//   behind its own header's contract.
// - Expected failures (bad config, data that does not fit the model, a model
//   that does not fit in memory at batch 1, divergence, a corrupt checkpoint)
//   come back as RunTraining's exit code with a one-line message naming the
//   problem and the fix (trainer.h); each piece's own errors as its header
//   says. Checkpoints already written are never touched by a failure.
// - Pieces usable from any libtorch loop: AutocastGuard, LossScaler (amp.h),
//   Optimizer, LrSchedule, DeviceStep (optim.h), the checkpoint reader and
//   writer (checkpoint.h); each header holds its own contract.
// - The whole runtime for a program's own network and data: RunTraining
//   with TrainerOptions::model and train_data or dataset (trainer.h,
//   examples/cpp_api). An installed fullburn exports it as the CMake target
//   fullburn::train.
// - This header only gathers the component's headers, for users.
#pragma once

#include "fullburn/amp.h"
#include "fullburn/checkpoint.h"
#include "fullburn/optim.h"
#include "fullburn/trainer.h"
