// --grid specs for external commands, and durations such as --budget 10m.
#include <cctype>
#include <cmath>
#include <set>

#include "fullburn/tune.h"

namespace fullburn {
namespace {

bool IsName(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

std::string GridValue(const std::vector<GridAxis>& axes,
                      const std::map<std::string, std::string>& combo) {
  std::string value;
  for (const GridAxis& a : axes)
    value += (value.empty() ? "" : " ") + a.name + "=" + combo.at(a.name);
  return value;
}

Result<GridAxis> ParseGridAxis(const std::string& spec) {
  size_t eq = spec.find('=');
  GridAxis axis;
  axis.name = spec.substr(0, eq);
  if (eq == std::string::npos || !IsName(axis.name))
    return Status::InvalidArgument("--grid '" + spec + "' is not NAME=V1,V2,...: write e.g. --grid 'batch=64,128'");
  std::string rest = spec.substr(eq + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string v = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (v.empty())
      return Status::InvalidArgument("--grid '" + spec + "' has an empty value: write e.g. --grid '" + axis.name +
                                     "=64,128'");
    axis.values.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return axis;
}

std::vector<std::map<std::string, std::string>> ExpandGrid(const std::vector<GridAxis>& axes) {
  std::vector<std::map<std::string, std::string>> out = {{}};
  for (const GridAxis& axis : axes) {
    std::vector<std::map<std::string, std::string>> next;
    for (const auto& partial : out)
      for (const std::string& v : axis.values) {
        auto combo = partial;
        combo[axis.name] = v;
        next.push_back(std::move(combo));
      }
    out = std::move(next);
  }
  return out;
}

Result<std::vector<std::string>> Substitute(const std::vector<std::string>& command,
                                            const std::map<std::string, std::string>& values) {
  std::set<std::string> used;
  std::vector<std::string> out;
  for (const std::string& arg : command) {
    std::string s;
    for (size_t i = 0; i < arg.size(); ++i) {
      size_t close = arg[i] == '{' ? arg.find('}', i) : std::string::npos;
      std::string name = close == std::string::npos ? "" : arg.substr(i + 1, close - i - 1);
      if (!IsName(name)) {
        s += arg[i];
        continue;
      }
      auto it = values.find(name);
      if (it == values.end())
        return Status::InvalidArgument("the command uses {" + name + "} but no --grid gives it: add --grid '" + name +
                                       "=V1,V2'");
      s += it->second;
      used.insert(name);
      i = close;
    }
    out.push_back(s);
  }
  for (const auto& [name, v] : values)
    if (!used.count(name))
      return Status::InvalidArgument("--grid " + name + " is not used by the command: put {" + name +
                                     "} where its value goes");
  return out;
}

Result<double> ParseDuration(const std::string& text) {
  double total = 0;
  size_t i = 0;
  bool any = false;
  auto bad = [&] {
    return Status::InvalidArgument("'" + text +
                                   "' is not a duration: write e.g. 90s, 10m, 1h, 1m30s or 30d");
  };
  while (i < text.size()) {
    size_t used = 0;
    double v;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (...) {
      return bad();
    }
    if (used == 0 || v < 0 || text[i] == '-' || text[i] == '+' || std::isspace(static_cast<unsigned char>(text[i])))
      return bad();
    i += used;
    double unit = 1;
    if (i < text.size()) {
      char u = text[i];
      if (u == 'd')
        unit = 86400;
      else if (u == 'h')
        unit = 3600;
      else if (u == 'm') unit = 60;
      else if (u == 's') unit = 1;
      else return bad();
      ++i;
    } else if (any) {
      return bad();  // "1m30": the last part needs its unit too
    }
    total += v * unit;
    any = true;
  }
  if (!any || !(total > 0) || !std::isfinite(total)) return bad();
  return total;
}

}  // namespace fullburn
