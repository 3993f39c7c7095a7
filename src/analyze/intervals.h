// Internal to analyze: time intervals (µs) and the operations the
// analyses make of them.
#pragma once

#include <cstdint>
#include <vector>

namespace fullburn::analyze {

struct Interval {
  int64_t start = 0, end = 0;
  int64_t Length() const { return end - start; }
};

// HTA's merge_kernel_intervals: sorted by start; an interval that starts
// after every earlier one has ended opens a new group, else it joins the
// group (touching intervals join). Sorts `v` in place.
std::vector<Interval> Merge(std::vector<Interval> v);
int64_t TotalLength(const std::vector<Interval>& merged);
// The length of the overlap of two merged (sorted, disjoint) lists.
int64_t OverlapLength(const std::vector<Interval>& a, const std::vector<Interval>& b);
// The gaps between the intervals of a merged list.
std::vector<Interval> Gaps(const std::vector<Interval>& merged);
// Does a merged list contain t (start <= t <= end + slack)?
bool Covers(const std::vector<Interval>& merged, int64_t t, int64_t slack);
// The part of [a, b) inside a merged list.
int64_t OverlapWith(const std::vector<Interval>& merged, int64_t a, int64_t b);
// a without b (both merged).
std::vector<Interval> Subtract(const std::vector<Interval>& a, const std::vector<Interval>& b);
// [lo, hi) without a merged list.
std::vector<Interval> Complement(const std::vector<Interval>& merged, int64_t lo, int64_t hi);

}  // namespace fullburn::analyze
