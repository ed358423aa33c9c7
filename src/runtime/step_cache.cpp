// Step cache settings and their arithmetic (see gfdit/step_cache.h, NOTE [step caches]).
#include "gfdit/step_cache.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "gfdit/error.h"

namespace gfdit {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

double parseNumber(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  char* end = nullptr;
  errno = 0;
  const double v = t.empty() ? 0.0 : std::strtod(t.c_str(), &end);
  GFDIT_CHECK(!t.empty() && end != nullptr && *end == '\0' && errno != ERANGE).param("cache")
      << "cache: " << what << " '" << t << "' is not a number";
  return v;
}

int32_t parseInt(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  char* end = nullptr;
  errno = 0;
  const long long v = t.empty() ? 0 : std::strtoll(t.c_str(), &end, 10);
  GFDIT_CHECK(!t.empty() && end != nullptr && *end == '\0' && errno != ERANGE &&
              v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max())
          .param("cache")
      << "cache: " << what << " '" << t << "' is not an integer";
  return static_cast<int32_t>(v);
}

}  // namespace

const char* cacheKindName(CacheKind k) {
  switch (k) {
    case CacheKind::kNone: return "none";
    case CacheKind::kFbCache: return "fbcache";
    case CacheKind::kTeaCache: return "teacache";
  }
  return "unknown";
}

CacheKind cacheKindFromName(const std::string& name) {
  for (CacheKind k : {CacheKind::kNone, CacheKind::kFbCache, CacheKind::kTeaCache}) {
    if (name == cacheKindName(k)) return k;
  }
  GFDIT_THROW(kInvalidUsage).param("cache") << "unknown cache '" << name << "'; valid caches: none, fbcache, teacache";
  return CacheKind::kNone;  // unreachable
}

CacheSpec CacheSpec::defaults(CacheKind kind) {
  CacheSpec s;
  s.kind = kind;
  switch (kind) {
    case CacheKind::kFbCache:
      s.threshold = 0.08;
      s.warmup = 8;
      break;
    case CacheKind::kTeaCache:
      s.threshold = 0.08;
      s.warmup = 1;
      break;
    case CacheKind::kNone: break;
  }
  return s;
}

CacheSpec CacheSpec::parse(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty() || t == "none") return CacheSpec();
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(t);
  while (std::getline(in, part, ',')) parts.push_back(trim(part));
  if (!t.empty() && t.back() == ',') parts.push_back("");
  // the kind and its threshold: "fbcache" or "fbcache:0.1"
  std::string head = parts[0];
  const size_t colon = head.find(':');
  const CacheKind kind = cacheKindFromName(trim(head.substr(0, colon)));
  GFDIT_CHECK(kind != CacheKind::kNone || parts.size() == 1).param("cache")
      << "cache: 'none' takes no options, got '" << t << "'";
  CacheSpec s = defaults(kind);
  if (colon != std::string::npos) s.threshold = parseNumber(head.substr(colon + 1), "threshold");
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    GFDIT_CHECK(eq != std::string::npos).param("cache")
        << "cache: option '" << parts[i] << "' is not name=value (options: threshold, warmup, max_skip)";
    const std::string name = trim(parts[i].substr(0, eq));
    const std::string value = parts[i].substr(eq + 1);
    if (name == "warmup") {
      s.warmup = parseInt(value, "warmup");
    } else if (name == "max_skip") {
      s.max_skip = parseInt(value, "max_skip");
    } else if (name == "threshold") {
      s.threshold = parseNumber(value, "threshold");
    } else {
      GFDIT_THROW(kInvalidUsage).param("cache")
          << "cache: unknown option '" << name << "'; options: threshold, warmup, max_skip";
    }
  }
  s.check();
  return s;
}

void CacheSpec::check() const {
  GFDIT_CHECK(kind == CacheKind::kNone || kind == CacheKind::kFbCache || kind == CacheKind::kTeaCache).param("cache")
      << "cache: unknown kind " << static_cast<int32_t>(kind);
  if (!on()) return;
  GFDIT_CHECK(std::isfinite(threshold) && threshold >= 0 && threshold <= kMaxCacheThreshold).param("cache")
      << "cache: the threshold must be a finite number in [0, " << kMaxCacheThreshold << "], got " << threshold;
  GFDIT_CHECK(warmup >= 0).param("cache") << "cache: warmup must be >= 0 steps, got " << warmup;
  GFDIT_CHECK(max_skip >= -1).param("cache")
      << "cache: max_skip must be >= 0 steps, or -1 for no limit, got " << max_skip;
}

std::string CacheSpec::str() const {
  if (!on()) return "none";
  // the shortest decimal that reads back to the same threshold
  std::string t;
  for (int digits = 1; digits <= 17; ++digits) {
    std::ostringstream os;
    os.precision(digits);
    os << threshold;
    t = os.str();
    if (std::strtod(t.c_str(), nullptr) == threshold) break;
  }
  std::ostringstream os;
  os << cacheKindName(kind) << ":" << t << ",warmup=" << warmup << ",max_skip=" << max_skip;
  return os.str();
}

bool CacheSpec::alwaysFull(int32_t step, int32_t num_steps) const {
  if (!on()) return true;
  if (step < warmup) return true;
  return kind == CacheKind::kTeaCache && step == num_steps - 1;
}

int32_t CacheSpec::eligibleSteps(int32_t from, int32_t count, int32_t num_steps) const {
  int32_t n = 0;
  for (int32_t k = std::max(0, from); k < std::min(num_steps, from + count); ++k) n += alwaysFull(k, num_steps) ? 0 : 1;
  return n;
}

double cachedShare(double p, int32_t max_skip) {
  p = std::min(1.0, std::max(0.0, p));
  if (max_skip == 0 || p <= 0) return 0.0;
  if (max_skip < 0) return p;
  double s = 0;
  double pk = 1;
  for (int32_t i = 0; i < max_skip; ++i) {
    pk *= p;
    s += pk;
  }
  return s / (s + 1.0);
}

double SkipCurve::at(double threshold) const {
  if (points.empty() || threshold <= 0) return 0.0;
  double x0 = 0;
  double y0 = 0;
  for (const auto& [x, y] : points) {
    if (threshold <= x) return x > x0 ? y0 + (y - y0) * (threshold - x0) / (x - x0) : y;
    x0 = x;
    y0 = y;
  }
  return y0;
}

}  // namespace gfdit
