// The built-in policies by name: makePolicy parses "fcfs", "srtf", "edf", "priority" and "static:D" (see
// gfdit/policy.h).
#include <sstream>
#include <string>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/policy.h"

namespace gfdit {
namespace runtime {

const char* layoutFamilyName(LayoutFamily f) {
  switch (f) {
    case LayoutFamily::kAuto: return "auto";
    case LayoutFamily::kUsp: return "usp";
    case LayoutFamily::kSwift: return "swift";
    case LayoutFamily::kTorus: return "torus";
  }
  return "unknown";
}

std::vector<std::string> policyNames() { return {"fcfs", "srtf", "edf", "priority", "static:D"}; }

namespace {

[[noreturn]] void unknownPolicy(const std::string& spec, const std::string& why) {
  std::ostringstream os;
  os << "unknown policy '" << spec << "'" << why << "; built in:";
  for (const auto& n : policyNames()) os << " " << n;
  os << " (the dynamic ones take :layout=auto|usp|swift|torus)";
  throw Error(ErrorCode::kInvalidUsage, os.str());
}

}  // namespace

std::unique_ptr<Policy> makePolicy(const std::string& spec) {
  if (spec.rfind("static:", 0) == 0) {
    int d = 0;
    try {
      size_t used = 0;
      d = std::stoi(spec.substr(7), &used);
      if (used != spec.size() - 7) d = 0;
    } catch (...) {
      d = 0;
    }
    GFDIT_CHECK(d >= 1 && d <= kMaxRanks)
        << "policy '" << spec << "': the degree must be an integer in [1, " << kMaxRanks << "]";
    return makeStaticPolicy(d);
  }
  const size_t colon = spec.find(':');
  const std::string base = spec.substr(0, colon);
  PolicyOptions o;
  if (base == "fcfs") {
    o.order = PolicyOrder::kArrival;
  } else if (base == "srtf") {
    o.order = PolicyOrder::kRemaining;
  } else if (base == "edf") {
    o.order = PolicyOrder::kDeadline;
  } else if (base == "priority") {
    o.order = PolicyOrder::kPriority;
  } else {
    unknownPolicy(spec, "");
  }
  if (colon != std::string::npos) {
    const std::string opt = spec.substr(colon + 1);
    if (opt == "layout=auto") {
      o.layouts = LayoutFamily::kAuto;
    } else if (opt == "layout=usp") {
      o.layouts = LayoutFamily::kUsp;
    } else if (opt == "layout=swift") {
      o.layouts = LayoutFamily::kSwift;
    } else if (opt == "layout=torus") {
      o.layouts = LayoutFamily::kTorus;
    } else {
      unknownPolicy(spec, ": option '" + opt + "' is not layout=auto|usp|swift|torus");
    }
  }
  return makePlanningPolicy(o);
}

}  // namespace runtime
}  // namespace gfdit
