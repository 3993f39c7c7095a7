#include "intervals.h"

#include <algorithm>

namespace fullburn::analyze {

std::vector<Interval> Merge(std::vector<Interval> v) {
  std::stable_sort(v.begin(), v.end(),
                   [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (out.empty() || i.start > out.back().end) {
      out.push_back(i);
    } else {
      out.back().end = std::max(out.back().end, i.end);
    }
  }
  return out;
}

int64_t TotalLength(const std::vector<Interval>& merged) {
  int64_t total = 0;
  for (const Interval& i : merged) total += i.Length();
  return total;
}

int64_t OverlapLength(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    int64_t lo = std::max(a[i].start, b[j].start);
    int64_t hi = std::min(a[i].end, b[j].end);
    if (hi > lo) total += hi - lo;
    if (a[i].end < b[j].end)
      ++i;
    else
      ++j;
  }
  return total;
}

std::vector<Interval> Gaps(const std::vector<Interval>& merged) {
  std::vector<Interval> gaps;
  for (size_t i = 1; i < merged.size(); ++i)
    if (merged[i].start > merged[i - 1].end) gaps.push_back({merged[i - 1].end, merged[i].start});
  return gaps;
}

bool Covers(const std::vector<Interval>& merged, int64_t t, int64_t slack) {
  // The last interval starting at or before t.
  auto it = std::upper_bound(merged.begin(), merged.end(), t,
                             [](int64_t v, const Interval& i) { return v < i.start; });
  if (it == merged.begin()) return false;
  --it;
  return t <= it->end + slack;
}

int64_t OverlapWith(const std::vector<Interval>& merged, int64_t a, int64_t b) {
  // The first interval ending after a.
  auto it = std::upper_bound(merged.begin(), merged.end(), a,
                             [](int64_t v, const Interval& i) { return v < i.end; });
  int64_t total = 0;
  for (; it != merged.end() && it->start < b; ++it)
    total += std::min(b, it->end) - std::max(a, it->start);
  return total;
}

std::vector<Interval> Subtract(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  size_t j = 0;
  for (Interval cur : a) {
    while (j < b.size() && b[j].end <= cur.start) ++j;
    size_t k = j;
    while (k < b.size() && b[k].start < cur.end) {
      if (b[k].start > cur.start) out.push_back({cur.start, b[k].start});
      cur.start = std::max(cur.start, b[k].end);
      ++k;
    }
    if (cur.start < cur.end) out.push_back(cur);
  }
  return out;
}

std::vector<Interval> Complement(const std::vector<Interval>& merged, int64_t lo, int64_t hi) {
  return Subtract({{lo, hi}}, merged);
}

}  // namespace fullburn::analyze
