// Status and Result: how fullburn reports expected failures.
//
// Contract: functions that can fail for reasons outside the program's control
// (a missing file, a corrupt store, an NVML call that returns an error) return
// a Status or a Result<T> instead of throwing. The message is one line meant for
// the user: it names the problem and, where there is one, the fix. Broken
// invariants (programming errors) use FB_CHECK, which prints file:line and
// aborts. Values are cheap to copy and safe to use from any thread.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace fullburn {

class Status {
 public:
  enum class Code {
    kOk, kNotFound, kInvalidArgument, kCorruption, kIoError, kUnavailable,
    kResourceExhausted, kAborted, kInternal
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status IoError(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  // Out of memory (device, or the CPU budget standing in for it).
  static Status ResourceExhausted(std::string msg) {
    return Status(Code::kResourceExhausted, std::move(msg));
  }
  // A job that cannot go on (training diverged).
  static Status Aborted(std::string msg) { return Status(Code::kAborted, std::move(msg)); }
  // An unexpected failure inside a library (libtorch), reported, not crashed on.
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {
    if (status_.ok()) status_ = Status::InvalidArgument("Result built from an ok Status");
  }
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

// The first line of a message (an exception's what(), which libtorch follows
// with a stack trace): what a one-line error may quote of it.
inline std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr) {
  std::fprintf(stderr, "fullburn: internal error at %s:%d: check failed: %s\n", file, line, expr);
  std::abort();
}

// The exit code of every fullburn program for bad input it refuses before
// any work (a flag, a config key, a file it cannot use): one value, so a
// script can tell it from a job's own failure.
constexpr int kExitUsage = 2;

}  // namespace fullburn

#define FB_CHECK(cond) \
  ((cond) ? (void)0 : ::fullburn::CheckFailed(__FILE__, __LINE__, #cond))
