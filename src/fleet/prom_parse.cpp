// Prometheus's query answers, read with a small scanner instead of a JSON
// document: a week of a thousand GPUs at 2,000 points each is tens of
// megabytes of "[t,\"v\"]" pairs, and a document of it would be ten times
// that in memory. Only the shapes Prometheus writes are accepted; anything
// else is an error naming what was expected.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>

#include "fullburn/fleet.h"

namespace fullburn {
namespace {

// A JSON number or a sample value at [p, end): digits with an optional
// fraction are exact below 2^53 (the mantissa and 10^k are exact, their
// quotient correctly rounded), which is strtod's own fast path; anything
// else (exponents, NaN, Inf, long mantissas) goes to strtod. Timestamps and
// sample values are millions of such numbers.
bool Decimal(const char* p, const char* end, double* out, const char** stop) {
  // Up to 1e16: a number without integer digits (".1234567890123456") has
  // all 16 in its fraction. 1e16 is still exact in a double.
  static const double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7, 1e8,
                                  1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16};
  const char* s = p;
  bool negative = s < end && *s == '-';
  if (negative) ++s;
  uint64_t mantissa = 0;
  int digits = 0, fraction = 0;
  while (s < end && *s >= '0' && *s <= '9' && digits < 16) {
    mantissa = mantissa * 10 + static_cast<uint64_t>(*s++ - '0');
    ++digits;
  }
  if (s < end && *s == '.') {
    ++s;
    while (s < end && *s >= '0' && *s <= '9' && digits < 16) {
      mantissa = mantissa * 10 + static_cast<uint64_t>(*s++ - '0');
      ++digits;
      ++fraction;
    }
  }
  bool simple = digits > 0 && mantissa < (1ull << 53) &&
                (s == end || !((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E'));
  if (simple) {
    double v = static_cast<double>(mantissa) / kPow10[fraction];
    *out = negative ? -v : v;
    *stop = s;
    return true;
  }
  // strtod needs a terminated string: the value is copied (short, rare).
  std::string text(p, static_cast<size_t>(std::min<ptrdiff_t>(end - p, 64)));
  char* tail = nullptr;
  *out = std::strtod(text.c_str(), &tail);
  if (tail == text.c_str()) return false;
  *stop = p + (tail - text.c_str());
  return true;
}

class Scanner {
 public:
  Scanner(const char* p, const char* end) : p_(p), end_(end) {}

  bool Peek(char c) {
    Ws();
    return p_ < end_ && *p_ == c;
  }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++p_;
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    out->clear();
    while (p_ < end_ && *p_ != '"') {
      const char* run = p_;
      while (p_ < end_ && *p_ != '"' && *p_ != '\\') ++p_;
      out->append(run, static_cast<size_t>(p_ - run));
      if (p_ < end_ && *p_ == '\\' && !Escape(out)) return false;
    }
    return Eat('"');
  }
  bool Number(double* out) {
    Ws();
    const char* stop = nullptr;
    if (!Decimal(p_, end_, out, &stop)) return false;
    p_ = stop;
    return true;
  }
  // Any value, skipped.
  bool Skip() {
    Ws();
    if (p_ >= end_) return false;
    std::string s;
    double d;
    switch (*p_) {
      case '"':
        return String(&s);
      case '{':
      case '[': {
        char close = *p_ == '{' ? '}' : ']';
        ++p_;
        if (Eat(close)) return true;
        do {
          if (close == '}' && (!String(&s) || !Eat(':'))) return false;
          if (!Skip()) return false;
        } while (Eat(','));
        return Eat(close);
      }
      case 't':
        return Word("true");
      case 'f':
        return Word("false");
      case 'n':
        return Word("null");
      default:
        return Number(&d);
    }
  }
  bool AtEnd() {
    Ws();
    return p_ == end_;
  }

 private:
  void Ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool Word(const char* w) {
    size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - p_) < n || std::strncmp(p_, w, n) != 0) return false;
    p_ += n;
    return true;
  }
  static void Utf8(unsigned cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool Hex4(unsigned* out) {
    if (end_ - p_ < 4) return false;
    *out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = *p_++;
      unsigned d = c >= '0' && c <= '9'   ? c - '0'
                   : c >= 'a' && c <= 'f' ? c - 'a' + 10
                   : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : 16;
      if (d == 16) return false;
      *out = *out * 16 + d;
    }
    return true;
  }
  bool Escape(std::string* out) {
    if (end_ - p_ < 2) return false;
    char c = p_[1];
    p_ += 2;
    switch (c) {
      case '"': *out += '"'; return true;
      case '\\': *out += '\\'; return true;
      case '/': *out += '/'; return true;
      case 'b': *out += '\b'; return true;
      case 'f': *out += '\f'; return true;
      case 'n': *out += '\n'; return true;
      case 'r': *out += '\r'; return true;
      case 't': *out += '\t'; return true;
      case 'u': {
        unsigned cp = 0, low = 0;
        if (!Hex4(&cp)) return false;
        if (cp >= 0xD800 && cp < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
          p_ += 2;
          if (!Hex4(&low)) return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        Utf8(cp, out);
        return true;
      }
      default:
        return false;
    }
  }
  const char* p_;
  const char* end_;
};

Status Malformed(const std::string& what) {
  return Status::Corruption("Prometheus's answer is not its API's JSON (" + what +
                            "): is the URL a Prometheus server?");
}

// Prometheus answers a range query with at most 11,000 points a series.
constexpr double kMaxPoints = 11000;

// [t, "v"] -> the series' point in its bucket.
bool Point(Scanner* s, double grid_start, double step_s, PromSeries* series, std::string* error) {
  double t = 0;
  std::string v;
  if (!s->Eat('[') || !s->Number(&t) || !s->Eat(',') || !s->String(&v) || !s->Eat(']'))
    return false;
  double b = step_s > 0 ? std::round((t - grid_start) / step_s) : 0;
  if (b < 0) return true;  // before the grid: not asked for
  // A bucket past the most a range query has is no answer of Prometheus's,
  // and would size the series (a far timestamp asked for gigabytes).
  if (!(b <= kMaxPoints)) {
    char text[96];
    std::snprintf(text, sizeof text, "a point at t=%.15g, %.0f steps past the start", t, b);
    *error = text;
    return false;
  }
  int bucket = static_cast<int>(b);
  if (series->values.empty()) series->first = bucket;
  int at = bucket - series->first;
  if (at < 0) return true;  // out of order: Prometheus never does this
  if (static_cast<size_t>(at) >= series->values.size()) series->values.resize(at + 1, NAN);
  const char* stop = nullptr;
  if (!Decimal(v.data(), v.data() + v.size(), &series->values[at], &stop) ||
      stop != v.data() + v.size())
    return false;
  return true;
}

bool Metric(Scanner* s, std::map<std::string, std::string>* labels) {
  if (!s->Eat('{')) return false;
  if (s->Eat('}')) return true;
  std::string k, v;
  do {
    if (!s->String(&k) || !s->Eat(':') || !s->String(&v)) return false;
    if (k != "__name__") (*labels)[k] = v;
  } while (s->Eat(','));
  return s->Eat('}');
}

Status ReadResults(Scanner* s, double grid_start, double step_s, PromMatrix* out) {
  if (!s->Eat('[')) return Malformed("result is not a list");
  if (s->Eat(']')) return Status::Ok();
  do {
    PromSeries series;
    if (!s->Eat('{')) return Malformed("a result is not an object");
    std::string key;
    do {
      if (!s->String(&key) || !s->Eat(':')) return Malformed("a result's keys");
      if (key == "metric") {
        if (!Metric(s, &series.labels)) return Malformed("labels");
      } else if (key == "values") {
        if (!s->Eat('[')) return Malformed("values");
        if (!s->Eat(']')) {
          do {
            std::string error;
            if (!Point(s, grid_start, step_s, &series, &error))
              return Malformed(error.empty() ? "a point" : error);
          } while (s->Eat(','));
          if (!s->Eat(']')) return Malformed("values");
        }
      } else if (key == "value") {
        std::string error;  // an instant query's point is always bucket 0
        if (!Point(s, grid_start, 0, &series, &error)) return Malformed("a point");
      } else if (!s->Skip()) {
        return Malformed(key);
      }
    } while (s->Eat(','));
    if (!s->Eat('}')) return Malformed("a result");
    out->push_back(std::move(series));
  } while (s->Eat(','));
  return s->Eat(']') ? Status::Ok() : Malformed("result");
}

}  // namespace

double PromSeries::At(int bucket) const {
  int i = bucket - first;
  return i >= 0 && static_cast<size_t>(i) < values.size() ? values[i] : NAN;
}

Result<PromMatrix> ParsePromMatrix(const std::string& body, double grid_start, double step_s) {
  Scanner s(body.data(), body.data() + body.size());
  std::string key, status, error, error_type;
  PromMatrix out;
  bool have_data = false;
  if (!s.Eat('{')) return Malformed("not a JSON object");
  if (!s.Eat('}')) {
    do {
      if (!s.String(&key) || !s.Eat(':')) return Malformed("top-level keys");
      if (key == "status") {
        if (!s.String(&status)) return Malformed("status");
      } else if (key == "error") {
        if (!s.String(&error)) return Malformed("error");
      } else if (key == "errorType") {
        if (!s.String(&error_type)) return Malformed("errorType");
      } else if (key == "data") {
        if (!s.Eat('{')) return Malformed("data");
        if (!s.Eat('}')) {
          do {
            if (!s.String(&key) || !s.Eat(':')) return Malformed("data's keys");
            if (key == "result") {
              if (Status st = ReadResults(&s, grid_start, step_s, &out); !st.ok()) return st;
              have_data = true;
            } else if (!s.Skip()) {
              return Malformed(key);
            }
          } while (s.Eat(','));
          if (!s.Eat('}')) return Malformed("data");
        }
      } else if (!s.Skip()) {
        return Malformed(key);
      }
    } while (s.Eat(','));
    if (!s.Eat('}')) return Malformed("the top-level object");
  }
  if (!s.AtEnd()) return Malformed("text after the object");
  if (status == "error")
    return Status::InvalidArgument("Prometheus refused the query (" + error_type + "): " + error);
  if (status != "success" || !have_data) return Malformed("no status success with data");
  return out;
}

Result<double> ParsePromDuration(const std::string& text) {
  // Prometheus's units, also compound as it writes them ("1m30s"); a
  // fraction ("1.5h") is taken too.
  static const std::pair<const char*, double> kUnits[] = {
      {"ms", 1e-3}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 7 * 86400},
      {"y", 365 * 86400}};
  auto not_a_duration = [&] {
    return Status::InvalidArgument("'" + text +
                                   "' is not a duration: use a number and a unit, e.g. 7d, "
                                   "36h, 90m (units: ms s m h d w y)");
  };
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t digits = i, points = 0;
    for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.');
         ++i)
      points += text[i] == '.';
    size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string number = text.substr(digits, unit_start - digits),
                unit = text.substr(unit_start, i - unit_start);
    double scale = -1;
    for (const auto& [name, s] : kUnits)
      if (unit == name) scale = s;
    // A lone "." or "1.2.3" is no number; strtod, unlike stod, never throws.
    if (number.empty() || number == "." || points > 1 || scale < 0) return not_a_duration();
    total += std::strtod(number.c_str(), nullptr) * scale;
  }
  if (!std::isfinite(total))
    return Status::InvalidArgument("'" + text.substr(0, 40) + (text.size() > 40 ? "..." : "") +
                                   "' is longer than any window Prometheus keeps: use e.g. 30d");
  if (total <= 0)
    return Status::InvalidArgument("'" + text + "' is not a positive duration, e.g. 7d");
  return total;
}

}  // namespace fullburn
