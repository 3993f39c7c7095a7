// The autocast state of one device type, read and set through libtorch
// 1.13's and 2.x's APIs alike (the trainer's AutocastGuard and activation
// checkpointing's recompute, which must cast as the forward did).
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace fullburn::autocast_state {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
// libtorch >= 2.4: one API keyed by device type.
inline bool Enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void SetEnabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
inline c10::ScalarType Dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
inline void SetDtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
// libtorch 1.13 .. 2.3: separate CPU and GPU calls.
inline bool Enabled(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void SetEnabled(c10::DeviceType d, bool on) {
  if (d == c10::kCPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
}
inline c10::ScalarType Dtype(c10::DeviceType d) {
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                        : at::autocast::get_autocast_gpu_dtype();
}
inline void SetDtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::kCPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
}
#endif

// Autocast on or off for one device type while in scope, then as it was.
class ScopedEnabled {
 public:
  ScopedEnabled(c10::DeviceType d, bool on) : type_(d), was_(Enabled(d)) { SetEnabled(d, on); }
  ~ScopedEnabled() { SetEnabled(type_, was_); }
  ScopedEnabled(const ScopedEnabled&) = delete;
  ScopedEnabled& operator=(const ScopedEnabled&) = delete;

 private:
  c10::DeviceType type_;
  bool was_;
};

}  // namespace fullburn::autocast_state
