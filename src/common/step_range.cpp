#include "fullburn/step_range.h"

#include <cctype>

namespace fullburn {
namespace {

// The digits at `text[*at...]` as a number; false when there are none or too many.
bool Number(const std::string& text, size_t* at, int64_t* out) {
  size_t start = *at;
  int64_t v = 0;
  while (*at < text.size() && std::isdigit(static_cast<unsigned char>(text[*at]))) {
    if (*at - start >= 18) return false;  // past int64 soon: no step count is that long
    v = v * 10 + (text[*at] - '0');
    ++*at;
  }
  *out = v;
  return *at > start;
}

}  // namespace

Result<std::pair<int64_t, int64_t>> ParseStepRange(const std::string& text, int64_t min_first) {
  size_t at = 0;
  int64_t first = 0, last = 0;
  if (!Number(text, &at, &first))
    return Status::InvalidArgument("'" + text + "' is not a range of steps: give A-B or one step N");
  last = first;
  if (at < text.size() && text[at] == '-') {
    ++at;
    if (!Number(text, &at, &last))
      return Status::InvalidArgument("'" + text + "' has no last step after its '-': give A-B");
  }
  if (at != text.size())
    return Status::InvalidArgument("'" + text + "' is not a range of steps: give A-B or one step N, digits only");
  if (first < min_first)
    return Status::InvalidArgument("'" + text + "': the steps count from " + std::to_string(min_first));
  if (last < first) return Status::InvalidArgument("'" + text + "': B is before A; give A-B with A <= B");
  return std::make_pair(first, last);
}

}  // namespace fullburn
