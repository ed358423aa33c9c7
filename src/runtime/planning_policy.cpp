// The built-in dynamic policies (fcfs, srtf, edf, priority): one planning policy in four orders (see
// makePlanningPolicy in gfdit/policy.h).
//
// NOTE [planning]
// A dynamic policy plans the whole cluster at every scheduling point, then acts on the part it may touch.
//  1. Candidates are the requests waiting for a decision and those running one (not decoding: a decode holds
//     one rank outside any policy). The capacity is the free ranks plus the ranks the running candidates
//     hold: at their next step boundary those come back.
//  2. Candidates are ordered by the policy (arrival, remaining time with aging, deadline, priority class);
//     only the first `capacity` can get a rank, so a partial sort suffices.
//  3. Base degrees, in order: 1 each, or for edf and priority the smallest degree at which the request's
//     predicted remaining time, times `deadline_margin`, fits before its deadline (a request no degree can
//     save goes last, on one rank; so does one NOTE [deadline admission] turns away). A candidate left
//     without ranks waits; a running one yields its ranks at its next step boundary (preemption).
//  4. Spare ranks: a group of d ranks may grow to any d' ranks (not only powers of two: a lone request on 6
//     ranks takes 6) whose predicted step is at least `min_gain` faster per doubling, step(d') <= step(d) x
//     (1 - min_gain)^log2(d' / d) (a doubling: min_gain faster). Of those it grows to the one that saves the
//     most remaining time per added rank. edf and priority grow their requests in order (the earliest
//     deadlines first) as far as that pays; fcfs and srtf give each spare rank to the growth that saves the
//     most remaining time per added rank, so a long video that scales gets them before a short image that
//     hardly does. A small image whose step is dominated by communication stays on one or two ranks, and
//     under load every request runs on one rank, where a rank-second does the most work. Where the ranks
//     share fewer cores (a CPU, CostModel::sharedCores), ranks are spare only while every busy rank (decodes
//     included) keeps a core: a rank beyond the cores adds no compute, only waits in collectives for peers the
//     OS is not running, and the cost model, measured with the ranks it used alone, would promise a speed-up
//     the load takes away. Priority classes are strict: steps 3 and 4 run for a whole class before the next
//     class gets a rank.
//  5. Placement, in order: a running candidate whose plan is larger than its group reserves the difference
//     among the free ranks (lower candidates may not take them; they stay idle at most until its boundary).
//     A waiting candidate takes as many of the unreserved free ranks as its plan asks, or the largest degree
//     below that which the cost model prices: its holders first (nothing moves), then ranks on one node (best
//     fit), avoiding ranks that hold the state of other waiting requests. The layout comes from the cost
//     model for the node span it got (bestLayout: every Ulysses x Ring factorisation of the degree with
//     Ulysses at most the heads, and CFG-parallel halves for a request with guidance on an even degree);
//     without a cost model, Ulysses as far as the heads split evenly and Ring for the rest (plainLayout).
// A decision that runs on spare ranks (more than its base degree) with steps of 5 ms or more is one step with
// no dispatch-ahead, so an arrival waits at most one step for those ranks (the gap between two steps, tens
// of microseconds, is then under 1%); long steps (>= 0.1 s) are one step each too.
// The plan is recomputed from the view each time, so the policy holds no state besides scratch buffers, and
// the lookahead (NOTE [lookahead] in src/runtime/control.cpp) gets the same answer it would get at the boundary.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "gfdit/policy.h"

namespace gfdit {
namespace runtime {

namespace {

// A decision on spare ranks (more than its base degree) whose steps take this long or longer runs one step
// with no dispatch-ahead, so the ranks come back after one step (NOTE [planning]).
constexpr double kLentStepS = 0.005;
// Without a cost model a step is assumed to take this long per token on one rank and to scale perfectly:
// only the ratios matter (orders and growth compare steps of the same request, or remaining times).
constexpr double kUnitStepSPerToken = 1e-6;
// NOTE [deadline admission] sorts and admits the first max(kAdmissionHeadPerRank x capacity,
// kAdmissionHeadMin) candidates in deadline order; the rest cannot get a rank this round anyway.
constexpr size_t kAdmissionHeadPerRank = 4;
constexpr size_t kAdmissionHeadMin = 64;

// One request the plan considers (NOTE [planning]).
struct Candidate {
  const RequestRecord* rec = nullptr;
  bool ready = false;
  int current = 0;  // running: its group's size
  int base = 1;     // degree before spare ranks
  int plan = 0;
  int grow_to = 0;                        // step 4: the best degree to grow to from `plan` (0: not computed, -1: none)
  int grow_left = 0;                      // the spare ranks grow_to was computed for
  double grow_gain = 0;                   // its remaining seconds saved per added rank
  bool deadline_feasible = false;         // edf/priority: some degree meets its deadline (base is the smallest)
  double k0 = 0, k1 = 0, k2 = 0, k3 = 0;  // order: smaller first, then the id
};

class PlanningPolicy : public Policy {
 public:
  explicit PlanningPolicy(const PolicyOptions& o) : o_(o) {
    GFDIT_CHECK(o.steps_per_decision >= 1) << "steps per decision must be >= 1";
    GFDIT_CHECK(o.min_gain >= 0 && o.min_gain < 1) << "min_gain must be in [0, 1)";
    GFDIT_CHECK(o.aging > 0) << "aging must be positive";
    GFDIT_CHECK(o.deadline_margin >= 1) << "deadline_margin must be >= 1";
    // growing a group from d to d' must make its step (1 - min_gain)^log2(d' / d) as long or shorter
    const double per_doubling = std::log2(1.0 - o.min_gain);
    growth_.resize((kMaxRanks + 1) * (kMaxRanks + 1), 0.0);
    for (int a = 1; a <= kMaxRanks; ++a) {
      for (int b = a; b <= kMaxRanks; ++b) {
        growth_[a * (kMaxRanks + 1) + b] = std::exp2(per_doubling * std::log2(static_cast<double>(b) / a));
      }
    }
  }

  std::string name() const override {
    static const char* names[] = {"fcfs", "srtf", "edf", "priority"};
    std::string n = names[static_cast<int>(o_.order)];
    if (o_.layouts != LayoutFamily::kAuto) n += std::string(":layout=") + layoutFamilyName(o_.layouts);
    return n;
  }
  LayoutFamily layouts() const override { return o_.layouts; }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    const int world = view.world_size;
    world_ = world;
    const double now_s = view.now_ns * 1e-9;
    cands_.clear();
    int capacity = static_cast<int>(view.free_ranks.size());
    int decoding = 0;  // ranks a decode holds: outside the plan, but each takes a core (step 4)
    for (const RequestRecord* r : view.ready) cands_.push_back(candidate(r, true, now_s));
    for (const RequestRecord* r : view.running) {
      if (r->state == RequestState::kDecoding) {
        ++decoding;  // a decode runs on one rank (its holders' others are free)
        continue;
      }
      Candidate c = candidate(r, false, now_s);
      c.current = std::max(1, r->layout.degree());
      capacity += c.current;
      cands_.push_back(c);
    }
    if (cands_.empty() || capacity == 0) return {};

    // 2. order; only the first `capacity` can get ranks
    const size_t top = std::min(cands_.size(), static_cast<size_t>(capacity));
    auto before = [](const Candidate& a, const Candidate& b) {
      if (a.k0 != b.k0) return a.k0 < b.k0;
      if (a.k1 != b.k1) return a.k1 < b.k1;
      if (a.k2 != b.k2) return a.k2 < b.k2;
      if (a.k3 != b.k3) return a.k3 < b.k3;
      return a.rec->id < b.rec->id;
    };
    if (o_.order == PolicyOrder::kDeadline || o_.order == PolicyOrder::kPriority) {
      // see NOTE [deadline admission]: the first few in order, then those that fit drop the ones that do not
      const size_t head =
          std::min(cands_.size(), std::max(kAdmissionHeadPerRank * static_cast<size_t>(capacity), kAdmissionHeadMin));
      std::partial_sort(cands_.begin(), cands_.begin() + head, cands_.end(), before);
      if (admit(head, capacity, now_s)) std::sort(cands_.begin(), cands_.begin() + head, before);
    } else {
      std::partial_sort(cands_.begin(), cands_.begin() + top, cands_.end(), before);
    }

    // 3 and 4, class by class (priority classes are strict; the other orders have one class)
    int left = capacity;
    // Ranks that share cores (a CPU): a rank beyond the cores adds no compute, so spare ranks are lent only
    // while every busy rank still has a core (NOTE [planning], 4). Decoding ranks are busy too: a decode takes
    // a core as surely as a step does (a dead rank, neither free nor running, takes none).
    const int cores = view.cost != nullptr ? view.cost->sharedCores() : 0;
    int busy = decoding;
    auto spare = [&] { return cores > 0 ? std::min(left, std::max(0, cores - busy)) : left; };
    for (size_t begin = 0; begin < top && left > 0;) {
      size_t end = begin + 1;
      while (end < top && (o_.order != PolicyOrder::kPriority || cands_[end].k0 == cands_[begin].k0)) ++end;
      for (size_t i = begin; i < end && left > 0; ++i) {  // base degrees
        Candidate& c = cands_[i];
        c.plan = fitDegree(*c.rec, std::min({c.base, left, limit(*c.rec, world)}));
        left -= c.plan;
        busy += c.plan;
      }
      if (o_.order == PolicyOrder::kDeadline || o_.order == PolicyOrder::kPriority) {
        for (size_t i = begin; i < end && spare() > 0; ++i) {  // spare ranks to the earliest deadlines
          Candidate& c = cands_[i];
          while (spare() > 0 && growth(c, spare(), world)) {
            left -= c.grow_to - c.plan;
            busy += c.grow_to - c.plan;
            c.plan = c.grow_to;
            c.grow_to = 0;
          }
        }
      } else {
        // spare ranks where they save the most time per rank
        while (spare() > 0) {
          Candidate* best = nullptr;
          double best_gain = 0;
          for (size_t i = begin; i < end; ++i) {
            Candidate& c = cands_[i];
            if (!growth(c, spare(), world)) continue;
            if (c.grow_gain > best_gain) {
              best_gain = c.grow_gain;
              best = &c;
            }
          }
          if (best == nullptr) break;
          left -= best->grow_to - best->plan;
          busy += best->grow_to - best->plan;
          best->plan = best->grow_to;
          best->grow_to = 0;
        }
      }
      begin = end;
    }

    // 5. placement
    pool_.assign(world, false);
    int num_pool = 0;
    for (int w : view.free_ranks) {
      pool_[w] = true;
      ++num_pool;
    }
    held_.assign(world, 0);
    for (const RequestRecord* r : view.ready) {
      for (int w : r->ranks) {
        if (w >= 0 && w < world) ++held_[w];
      }
    }
    std::vector<Decision> out;
    int reserved = 0;
    for (size_t i = 0; i < top && num_pool - reserved > 0; ++i) {
      const Candidate& c = cands_[i];
      if (c.plan == 0) continue;
      if (!c.ready) {
        if (c.plan > c.current) reserved += std::min(c.plan - c.current, num_pool - reserved);
        continue;
      }
      const int degree = fitDegree(*c.rec, std::min(c.plan, num_pool - reserved));
      Decision d;
      d.request_id = c.rec->id;
      pick(*c.rec, degree, view, d.ranks);
      for (int w : d.ranks) pool_[w] = false;
      num_pool -= degree;
      d.layout = layoutOf(*c.rec, d.ranks, view);
      // Long steps, and steps on spare ranks (more than the base degree) that are long enough for the gap
      // between steps not to matter, one at a time and none ahead: the next boundary, where an arrival can
      // take those ranks back, is one step away.
      const double step_s = c.rec->cost.known ? c.rec->cost.stepSeconds(degree) : 0;
      const bool lent = degree > c.base && step_s >= kLentStepS;
      d.dispatch_ahead = !lent;
      d.num_steps = lent || step_s >= view.long_step_s ? 1 : o_.steps_per_decision;
      out.push_back(std::move(d));
    }
    return out;
  }

 private:
  static int limit(const RequestRecord& r, int world) {
    return std::max(1, std::min({r.max_degree, world, kMaxRanks}));
  }
  // The largest degree of at most `d` ranks the request can run on (a finite prediction); `d` without one.
  static int fitDegree(const RequestRecord& r, int d) {
    if (!r.cost.known) return std::max(1, d);
    for (int k = d; k > 1; --k) {
      if (std::isfinite(r.cost.stepSeconds(k))) return k;
    }
    return 1;
  }

  // Step seconds on `degree` ranks; without a cost model, perfect scaling of a per-token unit.
  static double stepOf(const RequestRecord& r, int degree) {
    if (r.cost.known) return r.cost.stepSeconds(degree);
    return static_cast<double>(std::max<int64_t>(1, r.shape.tokens)) * kUnitStepSPerToken / degree;
  }
  static double remainingOf(const RequestRecord& r, int degree) {
    if (r.cost.known) return r.remainingSeconds(degree);
    return r.stepsLeft() * stepOf(r, degree);
  }

  // Step 4: the degree that c's group grows to with at most `left` more ranks, the one that saves the most
  // remaining time per added rank among those worth growing to (NOTE [planning]); false when none is. Cached
  // in c: the best of fewer spare ranks is the same while it still fits.
  bool growth(Candidate& c, int left, int world) const {
    if (c.plan <= 0) return false;
    if (c.grow_to > 0 && c.grow_to - c.plan <= left) return true;
    if (c.grow_to < 0 && c.grow_left >= left) return false;  // none with at least as many spare ranks
    const int top = std::min(limit(*c.rec, world), c.plan + left);
    const double from_step = stepOf(*c.rec, c.plan);
    const double from = remainingOf(*c.rec, c.plan);
    c.grow_to = -1;
    c.grow_left = left;
    c.grow_gain = 0;
    for (int d = c.plan + 1; d <= top; ++d) {
      const double step = stepOf(*c.rec, d);
      if (!(step <= from_step * growth_[c.plan * (kMaxRanks + 1) + d])) continue;  // infinite or not worth it
      const double gain = (from - remainingOf(*c.rec, d)) / (d - c.plan);
      if (gain > c.grow_gain) {
        c.grow_gain = gain;
        c.grow_to = d;
      }
    }
    return c.grow_to > 0;
  }

  Candidate candidate(const RequestRecord* r, bool ready, double now_s) const {
    Candidate c;
    c.rec = r;
    c.ready = ready;
    const double arrival_s = r->arrival_ns * 1e-9;
    c.k3 = arrival_s;
    switch (o_.order) {
      case PolicyOrder::kArrival: c.k0 = arrival_s; break;
      case PolicyOrder::kRemaining: c.k0 = remainingOf(*r, 1) - (now_s - arrival_s) / o_.aging; break;
      case PolicyOrder::kDeadline: deadlineKeys(*r, now_s, c); break;
      case PolicyOrder::kPriority:
        deadlineKeys(*r, now_s, c);
        c.k0 = -static_cast<double>(r->priority);
        break;
    }
    return c;
  }

  // NOTE [deadline admission]
  // EDF alone collapses under overload: every request it starts late makes the next one late (the domino
  // effect). Moore and Hodgson's rule (1968; it minimises the number of late jobs on one machine) keeps it
  // useful: walk the requests in deadline order adding up the rank-seconds each needs at the degree that
  // meets its deadline; when the total no longer fits in capacity x (deadline - now), the request needing
  // the most rank-seconds so far gives way: it is counted as one that cannot make it (goes last). Priority
  // applies the rule in its class-then-deadline order. Returns whether any request gave way.
  bool admit(size_t head, int capacity, double now_s) {
    heap_.clear();
    double work = 0;
    bool changed = false;
    for (size_t i = 0; i < head; ++i) {
      Candidate& c = cands_[i];
      if (!c.deadline_feasible) continue;
      const double w = c.base * remainingOf(*c.rec, c.base);
      work += w;
      heap_.emplace_back(w, i);
      std::push_heap(heap_.begin(), heap_.end());
      if (work > capacity * (c.k2 - now_s) * (1 + 1e-9)) {
        std::pop_heap(heap_.begin(), heap_.end());
        Candidate& out = cands_[heap_.back().second];
        work -= heap_.back().first;
        heap_.pop_back();
        out.deadline_feasible = false;
        out.base = 1;
        out.k1 = 2;
        changed = true;
      }
    }
    return changed;
  }

  // EDF: k1 = 0 feasible (k2 deadline), 1 no deadline (k2 arrival), 2 cannot make it (k2 deadline); base =
  // the smallest degree whose predicted finish meets the deadline.
  void deadlineKeys(const RequestRecord& r, double now_s, Candidate& c) const {
    if (r.deadline_ns <= 0) {
      c.k1 = 1;
      c.k2 = r.arrival_ns * 1e-9;
      return;
    }
    const double deadline_s = r.deadline_ns * 1e-9;
    c.k2 = deadline_s;
    if (!r.cost.known) return;  // nothing to predict with: plain EDF
    const int top = limit(r, world_);
    for (int d = 1; d <= top; ++d) {
      if (now_s + remainingOf(r, d) * o_.deadline_margin <= deadline_s) {
        c.base = d;
        c.deadline_feasible = true;
        return;
      }
    }
    c.k1 = 2;
  }

  // Ranks for a group of `degree`: holders first, then one node (best fit), then ranks nobody waits on.
  void pick(const RequestRecord& r, int degree, const SchedulerView& view, std::vector<int>& out) {
    const int world = view.world_size;
    auto nodeOf = [&](int w) { return view.node_of.empty() ? 0 : view.node_of[w]; };
    out.clear();
    for (int w : r.ranks) {
      if (static_cast<int>(out.size()) < degree && w >= 0 && w < world && pool_[w]) out.push_back(w);
    }
    if (static_cast<int>(out.size()) < degree) {
      const int need = degree - static_cast<int>(out.size());
      int anchor = out.empty() ? -1 : nodeOf(out[0]);
      if (anchor < 0) {  // the node whose unheld free ranks fit the group most tightly, else the one with most
        counts_.assign(world, 0);
        for (int w = 0; w < world; ++w) {
          if (pool_[w] && held_[w] == 0) ++counts_[nodeOf(w)];
        }
        int best = -1;
        for (int n = 0; n < world; ++n) {
          if (counts_[n] == 0) continue;
          auto better = [&](int a, int b) {
            const bool fa = counts_[a] >= need, fb = counts_[b] >= need;
            if (fa != fb) return fa;
            return fa ? counts_[a] < counts_[b] : counts_[a] > counts_[b];
          };
          if (best < 0 || better(n, best)) best = n;
        }
        anchor = best;
      }
      order_.clear();
      for (int w = 0; w < world; ++w) {
        if (pool_[w] && std::find(out.begin(), out.end(), w) == out.end()) order_.push_back(w);
      }
      auto rank_key = [&](int w) { return std::make_tuple(nodeOf(w) != anchor, held_[w] > 0, w); };
      std::partial_sort(order_.begin(), order_.begin() + std::min<size_t>(need, order_.size()), order_.end(),
                        [&](int a, int b) { return rank_key(a) < rank_key(b); });
      for (int i = 0; i < need && i < static_cast<int>(order_.size()); ++i) out.push_back(order_[i]);
    }
    // One order for one set, nodes together: the layout's placement reads it (Layout::placement).
    std::sort(out.begin(), out.end(),
              [&](int a, int b) { return std::make_pair(nodeOf(a), a) < std::make_pair(nodeOf(b), b); });
  }

  Layout layoutOf(const RequestRecord& r, const std::vector<int>& ranks, const SchedulerView& view) const {
    const int degree = static_cast<int>(ranks.size());
    if (!r.cost.known || view.cost == nullptr) return plainLayout(degree, r.num_heads);
    int nodes = 1;
    if (!view.node_of.empty()) {
      for (size_t i = 1; i < ranks.size(); ++i) nodes += view.node_of[ranks[i]] != view.node_of[ranks[i - 1]];
    }
    int per_node = 0;
    for (int n : view.node_of) per_node += n == (view.node_of.empty() ? 0 : view.node_of[0]);
    per_node = per_node > 0 ? per_node : view.world_size;
    if (nodes == (degree + per_node - 1) / per_node) return r.cost.layoutFor(degree);  // as predicted
    return bestLayout(*view.cost, r.shape, degree, nodes, r.cost.max_ulysses, o_.layouts, nullptr);
  }

  PolicyOptions o_;
  int world_ = 1;
  std::vector<Candidate> cands_;
  std::vector<bool> pool_;
  std::vector<int> held_, counts_, order_;
  std::vector<std::pair<double, size_t>> heap_;  // (rank-seconds, candidate) admitted (NOTE [deadline admission])
  std::vector<double> growth_;  // [d * (kMaxRanks + 1) + d']: growing d -> d' needs step(d') <= this x step(d)
};

}  // namespace

std::unique_ptr<Policy> makePlanningPolicy(const PolicyOptions& options) {
  return std::make_unique<PlanningPolicy>(options);
}

}  // namespace runtime
}  // namespace gfdit
