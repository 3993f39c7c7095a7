// Step events: the line format that `fullburn run`'s children (the Python
// helper in python/fullburn_markers.py, fullburn train) append to the file
// named by $FULLBURN_EVENTS, and the reader that turns it into store records.
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "fullburn/store.h"

namespace fullburn {
namespace {

using nlohmann::json;

// A non-negative finite number, or the reason it is not.
Status NonNegative(const json& j, const char* key, double* out) {
  if (!j.contains(key) || j[key].is_null()) return Status::NotFound(key);
  if (!j[key].is_number() || !std::isfinite(j[key].get<double>()) || j[key].get<double>() < 0)
    return Status::InvalidArgument(std::string("\"") + key + "\" must be a non-negative number");
  *out = j[key].get<double>();
  return Status::Ok();
}

// JSON has no NaN or infinity: a diverged loss travels as "nan", "inf" or
// "-inf" (what the Python helper and StepEventLine write).
json LossJson(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

std::optional<double> LossValue(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;
  std::string s = v.get<std::string>();
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "nan") return NAN;
  if (s == "inf" || s == "infinity") return INFINITY;
  if (s == "-inf" || s == "-infinity") return -INFINITY;
  return std::nullopt;
}

// Python's json.dumps writes NaN, Infinity and -Infinity as bare words,
// which no JSON parser takes: quote them (outside strings) so such a line
// keeps its step.
std::string QuoteNonFiniteWords(const std::string& line) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < line.size())
        out += line[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    bool matched = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      size_t n = std::strlen(word);
      if (line.compare(i, n, word) == 0) {
        out += std::string("\"") + word + "\"";
        i += n - 1;
        matched = true;
        break;
      }
    }
    if (!matched) out += c;
  }
  return out;
}

// An optional whole-number field (absent or null: `*out` is kept). json's
// value() throws on a field of another type and a cast of an out-of-range
// double is undefined: a job's bad line must be a counted error, not a crash.
template <typename T>
Status WholeField(const json& j, const char* key, T* out) {
  if (!j.contains(key) || j[key].is_null()) return Status::Ok();
  const json& v = j[key];
  double x = v.is_number() ? v.get<double>() : NAN;
  // 2^63 is a double; the largest int64 is not, so the bound is exclusive.
  bool fits = x >= static_cast<double>(std::numeric_limits<T>::min()) &&
              x < -static_cast<double>(std::numeric_limits<T>::min()) && x == std::floor(x);
  if (!fits) return Status::InvalidArgument(std::string("\"") + key + "\" must be a whole number");
  *out = v.is_number_integer() ? static_cast<T>(v.get<int64_t>()) : static_cast<T>(x);
  return Status::Ok();
}

Result<StepRecord> ParseStep(const json& j, double run_start) {
  StepRecord r;
  double time = 0, step_s = 0;
  for (const char* key : {"time", "step_s"})
    if (Status s = NonNegative(j, key, key[0] == 't' ? &time : &step_s); !s.ok())
      return s.code() == Status::Code::kNotFound
                 ? Status::InvalidArgument(std::string("a step needs \"") + key + "\"")
                 : s;
  if (!j.contains("step") || !j["step"].is_number_integer())
    return Status::InvalidArgument("a step needs an integer \"step\"");
  r.step = j["step"].get<int64_t>();
  r.t = time - run_start;
  r.step_s = step_s;
  for (Status s : {WholeField(j, "rank", &r.rank), WholeField(j, "epoch", &r.epoch),
                   WholeField(j, "samples", &r.samples)})
    if (!s.ok()) return s;
  if (j.contains("lr") && !j["lr"].is_null()) {
    if (!j["lr"].is_number()) return Status::InvalidArgument("\"lr\" must be a number");
    r.lr = j["lr"].get<double>();
  }
  if (j.contains("skipped") && !j["skipped"].is_null()) {
    if (!j["skipped"].is_boolean()) return Status::InvalidArgument("\"skipped\" must be true or false");
    r.skipped = j["skipped"].get<bool>();
  }
  r.loss = NAN;  // none reported
  if (j.contains("loss") && !j["loss"].is_null()) {
    std::optional<double> loss = LossValue(j["loss"]);
    if (!loss) return Status::InvalidArgument("\"loss\" must be a number, \"nan\" or \"inf\"");
    r.loss = *loss;
  }
  if (j.contains("loss_scale") && j["loss_scale"].is_number())
    r.loss_scale = j["loss_scale"].get<double>();
  for (const StepPhase& p : kStepPhases) {
    std::string key = std::string(p.name) + "_s";
    double v = 0;
    Status s = NonNegative(j, key.c_str(), &v);
    if (s.ok())
      r.*p.field = v;
    else if (s.code() != Status::Code::kNotFound)
      return s;
  }
  return r;
}

}  // namespace

std::string StepEventLine(const StepRecord& r, double run_start) {
  json j{
      {"kind", "step"},          {"rank", r.rank},     {"step", r.step},       {"epoch", r.epoch},
      {"time", r.t + run_start}, {"step_s", r.step_s}, {"samples", r.samples}, {"lr", r.lr}};
  j["loss"] = LossJson(r.loss);
  if (r.loss_scale) j["loss_scale"] = *r.loss_scale;
  if (r.skipped) j["skipped"] = true;
  for (const StepPhase& p : kStepPhases)
    if (r.*p.field && std::isfinite(*(r.*p.field))) j[std::string(p.name) + "_s"] = *(r.*p.field);
  return j.dump() + "\n";
}

std::string RunEventLine(const RunEvent& e, double run_start) {
  json data = json::parse(e.data, nullptr, false);
  if (!data.is_object()) data = json::object();
  json j{{"kind", "event"}, {"name", e.kind}, {"time", e.t + run_start}, {"data", data}};
  if (data.contains("duration_s") && data["duration_s"].is_number())
    j["duration_s"] = data["duration_s"];
  return j.dump() + "\n";
}

Result<MarkerEvent> ParseEventLine(const std::string& line, double run_start) {
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) j = json::parse(QuoteNonFiniteWords(line), nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument("not a JSON object");
  std::string kind = j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "";
  MarkerEvent out;
  if (kind == "step") {
    Result<StepRecord> r = ParseStep(j, run_start);
    if (!r.ok()) return r.status();
    out.is_step = true;
    out.step = *r;
    return out;
  }
  if (kind != "event") return Status::InvalidArgument("\"kind\" must be \"step\" or \"event\"");
  double time = 0;
  if (!NonNegative(j, "time", &time).ok())
    return Status::InvalidArgument("an event needs \"time\"");
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    return Status::InvalidArgument("an event needs a \"name\"");
  json data = j.contains("data") && j["data"].is_object() ? j["data"] : json::object();
  if (j.contains("duration_s") && j["duration_s"].is_number()) data["duration_s"] = j["duration_s"];
  if (j.contains("rank")) data["rank"] = j["rank"];
  out.event = {time - run_start, j["name"].get<std::string>(), data.dump()};
  return out;
}

Status EventFileReader::Poll(double run_start, std::vector<StepRecord>* steps,
                             std::vector<RunEvent>* events) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return Status::Ok();  // nothing written yet
  in.seekg(static_cast<std::streamoff>(offset_));
  std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  offset_ += chunk.size();
  partial_ += chunk;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = partial_.substr(start, nl - start);
    ++lines_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result<MarkerEvent> e = ParseEventLine(line, run_start);
    if (!e.ok()) {
      if (first_error_.empty())
        first_error_ =
            "line " + std::to_string(lines_) + " of " + path_ + ": " + e.status().message();
      ++bad_lines_;
    } else if (e->is_step) {
      Renumber(&e->step);
      steps->push_back(e->step);
    } else {
      events->push_back(e->event);
    }
  }
  partial_.erase(0, start);
  return Status::Ok();
}

void EventFileReader::Renumber(StepRecord* step) {
  RankCounter& c = counters_[step->rank];
  if (c.seen && step->step + c.offset <= c.last) {
    c.offset = c.last + 1 - step->step;
    if (restarts_++ == 0) first_restarted_rank_ = step->rank;
  }
  step->step += c.offset;
  c.last = step->step;
  c.seen = true;
}

}  // namespace fullburn
