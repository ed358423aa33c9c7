// The built-in policies by name: makePolicy parses "fcfs", "srtf", "edf", "priority" and "static:D", with options
// ":layout=..." (dynamic) and ":batch=N" (all) (see gfdit/policy.h).
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
  os << " (the dynamic ones take :layout=auto|usp|swift|torus, :decode=N and :stages=split[=K], static:D takes "
        ":fcfs|srtf|edf, every one :batch=N)";
  throw Error(ErrorCode::kInvalidUsage, os.str());
}

}  // namespace

namespace {

// "batch=N": N in [1, kMaxBatch]; false when `opt` is not a batch option.
bool batchOption(const std::string& spec, const std::string& opt, int32_t* max_batch) {
  if (opt.rfind("batch=", 0) != 0) return false;
  int n = 0;
  try {
    size_t used = 0;
    n = std::stoi(opt.substr(6), &used);
    if (used != opt.size() - 6) n = 0;
  } catch (...) {
    n = 0;
  }
  GFDIT_CHECK(n >= 1 && n <= kMaxBatch).param("policy")
      << "policy '" << spec << "': batch must be an integer in [1, " << kMaxBatch << "] (1: no batching)";
  *max_batch = n;
  return true;
}

std::vector<std::string> splitOptions(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(':', begin);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

}  // namespace

std::unique_ptr<Policy> makePolicy(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string base = spec.substr(0, colon);
  std::vector<std::string> opts =
      colon == std::string::npos ? std::vector<std::string>() : splitOptions(spec.substr(colon + 1));
  if (base == "static") {
    int d = 0;
    if (!opts.empty()) {
      try {
        size_t used = 0;
        d = std::stoi(opts[0], &used);
        if (used != opts[0].size()) d = 0;
      } catch (...) {
        d = 0;
      }
    }
    GFDIT_CHECK(d >= 1 && d <= kMaxRanks)
        << "policy '" << spec << "': the degree must be an integer in [1, " << kMaxRanks << "]";
    int32_t max_batch = PolicyOptions().max_batch;
    PolicyOrder order = PolicyOrder::kArrival;
    for (size_t i = 1; i < opts.size(); ++i) {
      if (opts[i] == "fcfs") {
        order = PolicyOrder::kArrival;
      } else if (opts[i] == "srtf") {
        order = PolicyOrder::kRemaining;
      } else if (opts[i] == "edf") {
        order = PolicyOrder::kDeadline;
      } else if (!batchOption(spec, opts[i], &max_batch)) {
        unknownPolicy(spec, ": option '" + opts[i] + "' is not fcfs|srtf|edf or batch=N");
      }
    }
    return makeStaticPolicy(d, max_batch, order);
  }
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
  for (const std::string& opt : opts) {
    if (opt == "layout=auto") {
      o.layouts = LayoutFamily::kAuto;
    } else if (opt == "layout=usp") {
      o.layouts = LayoutFamily::kUsp;
    } else if (opt == "layout=swift") {
      o.layouts = LayoutFamily::kSwift;
    } else if (opt == "layout=torus") {
      o.layouts = LayoutFamily::kTorus;
    } else if (opt == "stages=split") {
      o.aux_ranks = 1;
    } else if (opt.rfind("stages=split=", 0) == 0 || opt.rfind("decode=", 0) == 0) {
      const bool stages = opt[0] == 's';
      const std::string v = opt.substr(opt.rfind('=') + 1);
      int n = -1;
      try {
        size_t used = 0;
        n = std::stoi(v, &used);
        if (used != v.size()) n = -1;
      } catch (...) {
        n = -1;
      }
      GFDIT_CHECK(stages ? n >= 1 && n < kMaxRanks : n >= 0 && n <= kMaxRanks).param("policy")
          << "policy '" << spec << "': " << (stages ? "stages=split=K needs K in [1, " : "decode=N needs N in [0, ")
          << (stages ? kMaxRanks - 1 : kMaxRanks) << "]";
      (stages ? o.aux_ranks : o.decode_degree) = n;
    } else if (!batchOption(spec, opt, &o.max_batch)) {
      unknownPolicy(spec,
                    ": option '" + opt + "' is not layout=auto|usp|swift|torus, batch=N, decode=N or stages=split[=K]");
    }
  }
  return makePlanningPolicy(o);
}

}  // namespace runtime
}  // namespace gfdit
