// Reads a trace without holding its text: a small scanner walks the top
// level and cuts `traceEvents` into batches of whole events (about 1 MB of
// text each), which simdjson's On-Demand API then reads event by event,
// keeping only the fields the analyses use. Other top-level values
// (distributedInfo, deviceProperties, ...) are small and parsed on their own.
#include <simdjson.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "source.h"
#include "trace.h"

namespace fullburn::analyze {

uint32_t StringTable::Intern(std::string_view s) {
  auto it = index_.find(s);
  if (it != index_.end()) return it->second;
  strings_.emplace_back(s);
  uint32_t id = static_cast<uint32_t>(strings_.size() - 1);
  index_.emplace(std::string_view(strings_.back()), id);
  return id;
}

namespace {

namespace od = simdjson::ondemand;

constexpr size_t kBlockBytes = 1 << 18;
constexpr size_t kBatchBytes = 1 << 18;

// The fields of one event that matter; reused from event to event.
struct Fields {
  std::string_view ph, cat, name, stack;
  std::string pid, tid;
  bool has_ts = false, has_dur = false;
  double ts = 0, dur = 0;
  bool has_corr = false, has_stream = false, has_bytes = false, has_device = false, has_id = false;
  int64_t corr = 0, stream = 0, bytes = 0, device = 0, id = 0;
  void Clear() { *this = Fields(); }
};

bool ReadDouble(od::value v, double* out) {
  od::json_type t;
  if (v.type().get(t)) return false;
  if (t == od::json_type::number) return !v.get_double().get(*out);
  if (t != od::json_type::string) return false;
  std::string_view s;
  if (v.get_string().get(s)) return false;
  std::string copy(s);
  char* end = nullptr;
  *out = std::strtod(copy.c_str(), &end);
  return end != copy.c_str();
}

bool ReadInt(od::value v, int64_t* out) {
  od::json_type t;
  if (v.type().get(t)) return false;
  if (t == od::json_type::number) {
    if (!v.get_int64().get(*out)) return true;
    double d;
    if (v.get_double().get(d)) return false;
    // Past int64's range the cast is undefined: such a value is no id,
    // stream or byte count, and is read as absent.
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  if (t != od::json_type::string) return false;
  std::string_view s;
  if (v.get_string().get(s)) return false;
  std::string copy(s);
  char* end = nullptr;
  *out = std::strtoll(copy.c_str(), &end, 10);
  return end != copy.c_str();
}

// A string value, or "" when it is something else.
void ReadString(od::value v, std::string_view* out) {
  if (v.get_string().get(*out)) *out = std::string_view();
}

// pid and tid are numbers in some traces and strings in others ("25738",
// "stream 7"): kept as text, so 25738 and "25738" are the same thread.
void ReadId(od::value v, std::string* out) {
  od::json_type t;
  if (v.type().get(t)) return;
  if (t == od::json_type::string) {
    std::string_view s;
    if (!v.get_string().get(s)) out->assign(s);
  } else if (t == od::json_type::number) {
    int64_t i;
    if (!v.get_int64().get(i)) {
      *out = std::to_string(i);
    } else {
      double d;
      if (!v.get_double().get(d)) *out = std::to_string(d);
    }
  }
}

simdjson::error_code ReadArgs(od::object args, Fields* f) {
  for (auto field_result : args) {
    od::field field;
    if (auto err = std::move(field_result).get(field)) return err;
    std::string_view key;
    if (auto err = field.unescaped_key().get(key)) return err;
    od::value v = field.value();
    if (key == "correlation") {
      f->has_corr = ReadInt(v, &f->corr);
    } else if (key == "stream") {
      f->has_stream = ReadInt(v, &f->stream);
    } else if (key == "bytes") {
      f->has_bytes = ReadInt(v, &f->bytes);
    } else if (key == "device") {
      f->has_device = ReadInt(v, &f->device);
    } else if (key == "Call stack") {
      ReadString(v, &f->stack);
    }
  }
  return simdjson::SUCCESS;
}

simdjson::error_code ReadFields(od::object obj, Fields* f) {
  for (auto field_result : obj) {
    od::field field;
    if (auto err = std::move(field_result).get(field)) return err;
    std::string_view key;
    if (auto err = field.unescaped_key().get(key)) return err;
    od::value v = field.value();
    if (key == "ph") {
      ReadString(v, &f->ph);
    } else if (key == "cat") {
      ReadString(v, &f->cat);
    } else if (key == "name") {
      ReadString(v, &f->name);
    } else if (key == "ts") {
      f->has_ts = ReadDouble(v, &f->ts);
    } else if (key == "dur") {
      f->has_dur = ReadDouble(v, &f->dur);
    } else if (key == "pid") {
      ReadId(v, &f->pid);
    } else if (key == "tid") {
      ReadId(v, &f->tid);
    } else if (key == "id") {
      f->has_id = ReadInt(v, &f->id);
    } else if (key == "args") {
      od::object args;
      if (!v.get_object().get(args)) {
        if (auto err = ReadArgs(args, f)) return err;
      }
    }
  }
  return simdjson::SUCCESS;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}
bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

bool IsDataLoader(std::string_view name) {
  // fullburn.next_batch: fullburn train's wait for its loader (profile.steps).
  return StartsWith(name, "enumerate(DataLoader)") || name == "fullburn.next_batch" ||
         (Contains(name, "DataLoader") && Contains(name, "__next__"));
}
bool IsOptimizerStep(std::string_view name) {
  return name == "Optimizer.step" || StartsWith(name, "Optimizer.step#");
}
bool IsSyncCall(std::string_view name) {
  return name == "cudaStreamSynchronize" || name == "cudaDeviceSynchronize" ||
         name == "cudaEventSynchronize" || name == "cuStreamSynchronize" ||
         name == "cuCtxSynchronize" || name == "cuEventSynchronize";
}
// ProcessGroupGloo records each collective as "gloo:<op>"; Gloo runs them on
// the host, so a Gloo job's trace has no communication kernels to compare.
bool IsHostCollective(std::string_view name) { return StartsWith(name, "gloo:"); }
// Ops that read a CUDA tensor's value on the host, or copy it there.
bool IsSyncOp(std::string_view name) {
  static const char* const kOps[] = {"aten::item",     "aten::_local_scalar_dense",
                                     "aten::nonzero",  "aten::is_nonzero",
                                     "aten::copy_",    "aten::to",
                                     "aten::_to_copy", "aten::masked_select",
                                     "aten::unique",   "aten::_unique2",
                                     "aten::equal",    "aten::allclose"};
  for (const char* op : kOps)
    if (name == op) return true;
  return false;
}
bool IsRuntimeCategory(std::string_view cat) {
  return cat == "cuda_runtime" || cat == "cuda_driver" || cat == "Runtime";
}
bool IsFlowCategory(std::string_view cat, std::string_view name) {
  return cat == "ac2g" || cat == "async_cpu_to_gpu" || (cat == "async" && name == "launch");
}
// ProfilerStep#N: N, else -1.
int64_t StepNumber(std::string_view name) {
  if (!StartsWith(name, "ProfilerStep#")) return -1;
  std::string digits(name.substr(13));
  if (digits.empty() || digits[0] < '0' || digits[0] > '9') return -1;
  return std::strtoll(digits.c_str(), nullptr, 10);
}

void AddGpuOp(const Fields& f, RawTrace* t) {
  GpuOp op;
  op.ts = f.ts;
  op.dur = f.dur;
  op.correlation = f.has_corr ? f.corr : kNoCorrelation;
  op.bytes = f.has_bytes ? f.bytes : -1;
  op.stream = static_cast<int32_t>(f.stream);
  op.device =
      static_cast<int32_t>(f.has_device ? f.device : std::strtoll(f.pid.c_str(), nullptr, 10));
  op.name = t->strings.Intern(f.name);
  op.pid = t->strings.Intern(f.pid);
  op.tid = t->strings.Intern(f.tid);
  if (StartsWith(f.name, "Memcpy") || Contains(f.cat, "memcpy") || Contains(f.cat, "Memcpy"))
    op.kind = GpuKind::kMemcpy;
  else if (StartsWith(f.name, "Memset") || Contains(f.cat, "memset") || Contains(f.cat, "Memset"))
    op.kind = GpuKind::kMemset;
  t->gpu.push_back(op);
}

void AddSpan(const Fields& f, SpanKind kind, int64_t step, RawTrace* t) {
  Span s;
  s.ts = f.ts;
  s.dur = f.dur;
  s.name = t->strings.Intern(f.name);
  s.tid = t->strings.Intern(f.tid);
  s.kind = kind;
  s.step = step;
  if (kind == SpanKind::kSyncOp && !f.stack.empty()) s.stack = t->strings.Intern(f.stack);
  t->spans.push_back(s);
}

void AddHostEvent(const Fields& f, RawTrace* t) {
  bool gpu_annotation = f.cat == "gpu_user_annotation";
  int64_t step = StepNumber(f.name);
  if (step >= 0)
    AddSpan(f, gpu_annotation ? SpanKind::kGpuStepAnnotation : SpanKind::kStep, step, t);
  // Events on the GPU's timeline without a stream (annotations, sync
  // waits) are not host time.
  if (gpu_annotation || f.cat == "cuda_sync") return;
  t->host_events++;
  t->host_min_ts = std::min(t->host_min_ts, f.ts);
  t->host_max_end = std::max(t->host_max_end, f.ts + f.dur);
  if (IsRuntimeCategory(f.cat) || f.has_corr) {
    HostCall c;
    c.ts = f.ts;
    c.dur = f.dur;
    c.correlation = f.has_corr ? f.corr : kNoCorrelation;
    c.name = t->strings.Intern(f.name);
    c.pid = t->strings.Intern(f.pid);
    c.tid = t->strings.Intern(f.tid);
    t->calls.push_back(c);
  }
  if (step >= 0) return;
  if (f.cat == "python_function") {
    // Built-ins ("<built-in method item ...>") name no place in the user's code.
    if (!StartsWith(f.name, "<")) AddSpan(f, SpanKind::kPythonFrame, -1, t);
    return;
  }
  if (IsDataLoader(f.name)) {
    AddSpan(f, SpanKind::kDataLoader, -1, t);
  } else if (IsOptimizerStep(f.name)) {
    AddSpan(f, SpanKind::kOptimizer, -1, t);
  } else if (IsSyncCall(f.name)) {
    AddSpan(f, SpanKind::kSync, -1, t);
  } else if (IsSyncOp(f.name)) {
    AddSpan(f, SpanKind::kSyncOp, -1, t);
  } else if (IsHostCollective(f.name)) {
    AddSpan(f, SpanKind::kHostCollective, -1, t);
  }
}

// Sorts one event into the kept vectors.
void Classify(const Fields& f, RawTrace* t) {
  t->events++;
  if ((f.has_ts && !(std::fabs(f.ts) < kMaxTraceUs)) ||
      (f.has_dur && !(std::fabs(f.dur) < kMaxTraceUs))) {
    t->absurd_times++;
    return;
  }
  if (f.ph == "s" || f.ph == "f") {
    if (t->keep_flows && f.has_id && f.has_ts && IsFlowCategory(f.cat, f.name)) {
      FlowEnd e;
      e.ts = f.ts;
      e.id = f.id;
      e.pid = t->strings.Intern(f.pid);
      e.tid = t->strings.Intern(f.tid);
      e.start = f.ph == "s";
      t->flows.push_back(e);
    }
    return;
  }
  // Complete events; HTA keeps any event with a duration and a category
  // (the legacy profiler writes none: its events are host ops).
  if (!(f.ph == "X" || f.ph.empty()) || !f.has_ts || !f.has_dur) return;
  if (f.cat == "Trace") return;
  if (f.dur < 0) {
    t->negative_durations++;
    return;
  }
  t->min_ts = std::min(t->min_ts, f.ts);
  t->max_end = std::max(t->max_end, f.ts + f.dur);
  bool gpu_op =
      f.has_stream && f.stream != -1 && f.cat != "gpu_user_annotation" && f.cat != "cuda_sync";
  if (gpu_op) {
    // Kineto writes a correlation on every GPU op or on none: once one has
    // it, flows link nothing the correlations do not, and are let go (they
    // are a third of a trace's events).
    if (f.has_corr && t->keep_flows) {
      t->keep_flows = false;
      t->flows.clear();
      t->flows.shrink_to_fit();
    } else if (!f.has_corr) {
      t->keep_flows = true;
    }
    AddGpuOp(f, t);
  } else {
    AddHostEvent(f, t);
  }
}

// The few top-level values other than traceEvents that are read; the rest
// are skipped unread.
bool IsMetaKey(const std::string& key) {
  return key == "distributedInfo" || key == "deviceProperties" || key == "baseTimeNanoseconds";
}

void ReadMeta(const std::string& key, const std::string& text, RawTrace* t) {
  simdjson::padded_string padded(text);
  od::parser parser;
  od::document doc;
  if (parser.iterate(padded).get(doc)) return;
  if (key == "baseTimeNanoseconds") {
    double v;
    if (!doc.get_double().get(v)) t->base_time_ns = v;
  } else if (key == "distributedInfo") {
    od::object obj;
    if (doc.get_object().get(obj)) return;
    for (auto fr : obj) {
      od::field field;
      std::string_view k;
      if (std::move(fr).get(field) || field.unescaped_key().get(k)) return;
      int64_t i;
      if (k == "rank" && ReadInt(field.value(), &i)) t->rank = static_cast<int>(i);
      if (k == "world_size" && ReadInt(field.value(), &i)) t->world_size = static_cast<int>(i);
      std::string_view s;
      if (k == "backend" && !field.value().get_string().get(s)) t->backend = std::string(s);
    }
  } else {
    od::array arr;
    if (doc.get_array().get(arr)) return;
    for (auto el : arr) {
      od::object obj;
      if (el.get_object().get(obj)) return;
      for (auto fr : obj) {
        od::field field;
        std::string_view k, s;
        if (std::move(fr).get(field) || field.unescaped_key().get(k)) return;
        if (k == "name" && !field.value().get_string().get(s) && t->device_name.empty())
          t->device_name = std::string(s);
      }
    }
  }
}

// Where a JSON value that began before `p` ends, scanning [p, e): the
// state (depth, inside a string, after a backslash) carries from one
// buffer to the next. Returns the byte after the closing bracket, or e.
struct ValueScan {
  int depth = 0;
  bool in_str = false;
  bool esc = false;

  // One byte that matters (a quote or bracket; backslashes are the
  // callers'); true when it closes the value.
  bool Step(char c) {
    if (in_str) {
      if (c == '"') in_str = false;
      return false;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      return --depth == 0;
    }
    return false;
  }

  const char* Scalar(const char* p, const char* e) {
    for (; p < e; ++p) {
      if (esc) {
        esc = false;
      } else if (in_str && *p == '\\') {
        esc = true;
      } else if (Step(*p)) {
        return p + 1;
      }
    }
    return e;
  }

#ifdef __SSE2__
  // 16 bytes at a time (SSE2 is part of x86-64): a mask of the bytes that
  // matter, visited in order; everything else (names, numbers) is skipped.
  const char* Find(const char* p, const char* e) {
    const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\');
    const __m128i open1 = _mm_set1_epi8('{'), open2 = _mm_set1_epi8('[');
    const __m128i close1 = _mm_set1_epi8('}'), close2 = _mm_set1_epi8(']');
    for (; e - p >= 16; p += 16) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      __m128i any = _mm_or_si128(
          _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
          _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, open1), _mm_cmpeq_epi8(v, open2)),
                       _mm_or_si128(_mm_cmpeq_epi8(v, close1), _mm_cmpeq_epi8(v, close2))));
      unsigned bits = static_cast<unsigned>(_mm_movemask_epi8(any));
      if (esc) {
        bits &= ~1u;  // the first byte is escaped
        esc = false;
      }
      while (bits) {
        int i = __builtin_ctz(bits);
        bits &= bits - 1;
        char c = p[i];
        if (in_str && c == '\\') {
          if (i == 15)
            esc = true;
          else
            bits &= ~(1u << (i + 1));
        } else if (Step(c)) {
          return p + i + 1;
        }
      }
    }
    return Scalar(p, e);
  }
#else
  const char* Find(const char* p, const char* e) { return Scalar(p, e); }
#endif
};

class Scanner {
 public:
  Scanner(ByteSource* src, RawTrace* t) : src_(src), t_(t), buf_(kBlockBytes) {}

  Status Run() {
    SkipWs();
    int c = Peek();
    if (!status_.ok()) return status_;
    if (c == '[') return Events();  // the legacy profiler's bare array
    if (c != '{') return NotJson(c);
    Advance();
    for (;;) {
      SkipWs();
      c = Peek();
      if (c == '}') break;
      std::string key;
      Status s = Key(&key);
      if (!s.ok()) return s;
      SkipWs();
      if (Peek() != ':') return Bad("':' after a key");
      Advance();
      SkipWs();
      if (key == "traceEvents" && Peek() == '[') {
        s = Events();
        saw_events_ = true;
      } else if (IsMetaKey(key)) {
        std::string value;
        s = Value(&value);
        if (s.ok()) ReadMeta(key, value, t_);
      } else {
        s = Value(nullptr);  // skipped, whatever its size
      }
      if (!s.ok()) return s;
      SkipWs();
      c = Peek();
      if (c == ',') {
        Advance();
        continue;
      }
      if (c == '}') break;
      return c < 0 ? Truncated() : Bad("',' or '}' between top-level values");
    }
    if (!saw_events_)
      return Status::InvalidArgument(t_->path +
                                     ": no traceEvents: not a PyTorch profiler trace (export one "
                                     "with prof.export_chrome_trace or tensorboard_trace_handler)");
    return Status::Ok();
  }

  // Reads on to the end of the file after the trace's closing brace, so a
  // .json.gz member's trailer (checksum, length) is checked even when the
  // last text came out before it: a cut or damaged file is an error.
  Status Drain() {
    pos_ = end_;
    while (Fill()) pos_ = end_;
    return status_;
  }

 private:
  bool Fill() {
    if (!status_.ok() || eof_) return false;
    // Before the first read there is no buffer's worth behind us (end_ is
    // null: subtracting the buffer's address made "ends at byte -1399...").
    if (end_ != nullptr) offset_ += end_ - buf_.data();
    Result<size_t> n = src_->Read(buf_.data(), buf_.size());
    if (!n.ok()) {
      status_ = n.status();
      return false;
    }
    pos_ = buf_.data();
    end_ = pos_ + *n;
    if (*n == 0) eof_ = true;
    return *n > 0;
  }
  int Peek() {
    if (pos_ == end_ && !Fill()) return -1;
    return static_cast<unsigned char>(*pos_);
  }
  void Advance() { ++pos_; }
  void SkipWs() {
    for (int c = Peek(); c == ' ' || c == '\n' || c == '\r' || c == '\t'; c = Peek()) Advance();
  }
  int64_t Offset() const { return offset_ + (pos_ - buf_.data()); }

  Status NotJson(int c) {
    if (!status_.ok()) return status_;
    if (c < 0) return Status::InvalidArgument(t_->path + ": empty file: not a trace");
    return Status::InvalidArgument(t_->path +
                                   ": not JSON (a trace starts with '{' or '['): not a PyTorch "
                                   "profiler trace");
  }
  Status Truncated() {
    if (!status_.ok()) return status_;
    return Status::Corruption(t_->path + ": truncated: the text ends at byte " +
                              std::to_string(Offset()) + (in_events_ ? " inside traceEvents" : "") +
                              " after " + std::to_string(t_->events + batch_events_) +
                              " events (the profiler was stopped while writing?): export it again");
  }
  Status Bad(const char* expected) {
    if (!status_.ok()) return status_;
    if (Peek() < 0) return Truncated();
    return Status::Corruption(t_->path + ": not valid JSON at byte " + std::to_string(Offset()) +
                              ": expected " + expected);
  }

  // A key's text without its quotes (escapes left as they are: keys that
  // matter have none).
  Status Key(std::string* key) {
    if (Peek() != '"') return Bad("a key");
    Status s = String(key);
    if (s.ok()) *key = key->substr(1, key->size() - 2);
    return s;
  }

  // Appends one JSON string, quotes and escapes as they are (to nothing
  // when out is null).
  Status String(std::string* out) {
    if (out) out->push_back('"');
    Advance();
    bool esc = false;
    for (;;) {
      if (pos_ == end_ && !Fill()) return Truncated();
      char c = *pos_++;
      if (out) out->push_back(c);
      if (esc) {
        esc = false;
      } else if (c == '\\') {
        esc = true;
      } else if (c == '"') {
        return Status::Ok();
      }
    }
  }

  // Appends one JSON value as its text (to nothing when out is null).
  Status Value(std::string* out) {
    int c = Peek();
    if (c == '{' || c == '[') return Compound(out);
    if (c == '"') return String(out);
    size_t n = 0;
    for (c = Peek(); c >= 0 && c != ',' && c != '}' && c != ']' && c != ' ' && c != '\n' &&
                     c != '\r' && c != '\t';
         c = Peek(), ++n) {
      if (out) out->push_back(static_cast<char>(c));
      Advance();
    }
    if (n == 0) return c < 0 ? Truncated() : Bad("a value");
    return Status::Ok();
  }

  // Appends an object or array, nested values and all; the hot loop of the
  // reader (every event passes through it).
  Status Compound(std::string* out) {
    ValueScan scan;
    for (;;) {
      if (pos_ == end_ && !Fill()) return Truncated();
      const char* p = scan.Find(pos_, end_);
      if (out) out->append(pos_, p - pos_);
      bool closed = scan.depth == 0;
      pos_ = p;
      if (closed) return Status::Ok();
    }
  }

  Status Events() {
    in_events_ = true;
    Advance();  // '['
    batch_.assign("[");
    for (;;) {
      SkipWs();
      int c = Peek();
      if (c == ']') {
        Advance();
        break;
      }
      if (c != '{') return c < 0 ? Truncated() : Bad("an event object in traceEvents");
      if (batch_events_ > 0) batch_.push_back(',');
      Status s = Compound(&batch_);
      if (!s.ok()) return s;
      ++batch_events_;
      if (batch_.size() >= kBatchBytes) {
        s = Flush();
        if (!s.ok()) return s;
      }
      SkipWs();
      c = Peek();
      if (c == ',') {
        Advance();
      } else if (c != ']') {
        return c < 0 ? Truncated() : Bad("',' or ']' between events");
      }
    }
    in_events_ = false;
    return Flush();
  }

  // Reads the batch's events with simdjson and keeps what matters.
  Status Flush() {
    if (batch_events_ == 0) return Status::Ok();
    batch_.push_back(']');
    batch_.reserve(batch_.size() + simdjson::SIMDJSON_PADDING);
    od::document doc;
    od::array arr;
    auto err = parser_.iterate(batch_.data(), batch_.size(), batch_.capacity()).get(doc);
    if (!err) err = doc.get_array().get(arr);
    int64_t index = t_->events;
    Fields f;
    if (!err) {
      for (auto el : arr) {
        od::object obj;
        f.Clear();
        if ((err = el.get_object().get(obj))) break;
        if ((err = ReadFields(obj, &f))) break;
        Classify(f, t_);
        ++index;
      }
    }
    if (err)
      return Status::Corruption(t_->path + ": event " + std::to_string(index) +
                                " is not valid JSON (" + simdjson::error_message(err) + ")");
    batch_.assign("[");
    batch_events_ = 0;
    return Status::Ok();
  }

  ByteSource* src_;
  RawTrace* t_;
  std::vector<char> buf_;
  const char* pos_ = nullptr;
  const char* end_ = nullptr;
  int64_t offset_ = 0;
  bool eof_ = false;
  bool in_events_ = false;
  bool saw_events_ = false;
  Status status_;
  std::string batch_;
  int64_t batch_events_ = 0;
  od::parser parser_;
};

}  // namespace

Result<RawTrace> ReadTrace(const std::string& path) {
  Result<std::unique_ptr<ByteSource>> src = OpenSource(path);
  if (!src.ok()) return src.status();
  RawTrace t;
  t.path = path;
  Scanner scanner(src->get(), &t);
  Status s = scanner.Run();
  if (s.ok()) s = scanner.Drain();
  if (!s.ok()) return s;
  return t;
}

}  // namespace fullburn::analyze
