// The built-in dynamic policies (fcfs, srtf, edf, priority): one planning policy in four orders (see
// makePlanningPolicy in gfdit/policy.h).
//
// NOTE [planning]
// A dynamic policy plans the whole cluster at every scheduling point, then acts on the part it may touch.
//  1. Candidates are the requests waiting for a decision and those running one (not decoding: a decode holds
//     one rank outside any policy). The capacity is the free ranks plus the ranks the running candidates
//     hold: at their next step boundary those come back.
//  2. Candidates are ordered by the policy (arrival, remaining time with aging, deadline, priority class);
//     only the first `capacity` can get a rank, so only those are sorted, and only those (or the few more NOTE
//     [deadline admission] reads) are candidates at all when the view carries the policy's order of the
//     waiting requests (NOTE [planning order]), as the control plane's views do.
//  3. Base degrees, in order: 1 each, or for edf and priority the smallest degree at which the request's
//     predicted remaining time, times `deadline_margin`, fits before its deadline (a request no degree can
//     save goes last, on one rank; so does one NOTE [deadline admission] turns away). A candidate left
//     without ranks waits; a running one yields its ranks at its next step boundary (preemption).
//  6. Disaggregated stages (stages=split, aux_ranks > 0; the policy places decodes, NOTE [stages] in
//     src/runtime/control.cpp): the last aux_ranks ranks run the decodes of the requests whose steps are done (in
//     arrival order, first) and the encodes of new requests (in the policy's order), one rank each, as GF-DiT's
//     disaggregate policy does; the other ranks are planned by 1-5 for the requests with steps left, whose state
//     migrates from the auxiliary rank to their group and back for the decode. This walks every waiting request.
// 3a. Groups (with a cost model, max_batch > 1): requests submitted together (RequestSpec::group, the n images of
//     one HTTP request) run as one batch whatever the load: each joins the first ready one of its group before it
//     in order, at that one's base degree, while joinBatch takes it (room, memory, and each request's share of a
//     step falling by batch_gain); joined requests take no rank of their own. A batch keeps its degree (no growth
//     in 4).
// 3b. Batches (with a cost model, when more candidates wait than there are ranks, max_batch > 1): once the base
//     degrees have taken every rank, each ready candidate left without ranks joins, in order, the smallest batch
//     of its shape and guidance among the waiting candidates that got ranks (the earliest among equals), while the
//     batch has room (max_batch, the cost model's memory limit, CostModel::maxBatch) and each request's share of a step
//     stays batch_gain (5%) below a step alone and no dearer than before, and no member that would meet its deadline
//     misses it for the longer step (joinBatch in gfdit/planning.h). So requests
//     batch only when they would otherwise wait, small images (whose step hardly grows with the batch) batch on one
//     rank while a long video keeps its ranks, and a request whose step is already compute-bound stays alone. A running
//     batch takes no new members: they join at its boundary, where its members are candidates again (NOTE [batches] in
//     src/runtime/control.cpp). The head of the head (max_batch x capacity candidates) is sorted for it.
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
// The plan is recomputed from the view each time, so the policy holds no state besides scratch buffers (its
// order of the waiting requests belongs to the control plane), and the lookahead (NOTE [lookahead] in
// src/runtime/control.cpp) gets the same answer it would get at the boundary.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
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
  int unit = -1;                          // step 3b: the candidate whose batch it joins
  int members = 1;                        // step 3b: a unit's requests, itself included
};

int limit(const RequestRecord& r, int world) { return std::max(1, std::min({r.max_degree, world, kMaxRanks})); }

// Step seconds on `degree` ranks; without a cost model, perfect scaling of a per-token unit.
double stepOf(const RequestRecord& r, int degree) {
  if (r.cost.known) return r.cost.stepSeconds(degree);
  return static_cast<double>(std::max<int64_t>(1, r.shape.tokens)) * kUnitStepSPerToken / degree;
}
double remainingOf(const RequestRecord& r, int degree) {
  if (r.cost.known) return r.remainingSeconds(degree);
  return r.stepsLeft() * stepOf(r, degree);
}

// NOTE [planning order]
// The waiting requests in a dynamic policy's order, kept between rounds (NOTE [ready order] in
// src/runtime/control.cpp), so that a round computes candidates for the head alone and sorts those with the
// same comparison as a full sort (Candidate's keys, then the id); the head is a superset of the requests a full
// sort puts first, so the decisions are the same.
//  - fcfs: by arrival, which is the policy's key.
//  - srtf: by remaining time at one rank plus arrival / aging. The policy's key, remaining - (now - arrival) /
//    aging, is this minus now / aging, the same for all, but it is rounded differently: the head takes
//    everything within a band of rounding (a relative 1e-12, thousands of times the error) past the last
//    request it needs, and the exact keys order it.
//  - edf and priority: per priority class (edf: one), three sets, each by deadline (or arrival), then arrival:
//    requests whose deadline some degree may still meet, those without a deadline, those that missed theirs.
//    Whether a degree meets a deadline depends on the clock, and only one way: a request that cannot make its
//    deadline now cannot later. So each request in the first set has the time its fastest degree stops
//    meeting its deadline (again with a margin of rounding), in a heap; a round first moves those whose time
//    has passed into the third set, then walks the first set computing the exact keys (a request inside the
//    margin may have missed its deadline already: it is counted as such), and goes on to the other two sets
//    only when the first holds fewer than the head needs. If the clock ever goes back, the missed ones are
//    put back.
class PlanningOrder : public ReadyOrder {
 public:
  // One waiting request in a set: ordered by (a, b, id).
  struct Entry {
    double a = 0, b = 0;
    uint64_t id = 0;
    const RequestRecord* rec = nullptr;
    bool operator<(const Entry& o) const {
      if (a != o.a) return a < o.a;
      if (b != o.b) return b < o.b;
      return id < o.id;
    }
  };
  using Set = std::set<Entry>;
  // edf, priority: one class of requests.
  struct Class {
    Set met;     // with a deadline some degree may still meet (or one nothing predicts): by deadline
    Set none;    // without a deadline: by arrival
    Set missed;  // with a deadline no degree meets any more: by deadline
    size_t size() const { return met.size() + none.size() + missed.size(); }
  };

  explicit PlanningOrder(const PolicyOptions& o) : o_(o), held_(kMaxRanks, 0) {}

  size_t insert(const RequestRecord* r) override {
    size_t h = slots_.size();
    if (free_.empty()) {
      slots_.emplace_back();
    } else {
      h = free_.back();
      free_.pop_back();
    }
    Slot& s = slots_[h];
    s.live = true;
    s.seq = next_seq_++;
    s.cls = nullptr;
    s.expires = false;
    Entry e;
    e.id = r->id;
    e.rec = r;
    const double arrival_s = r->arrival_ns * 1e-9;  // as Candidate's keys are computed
    Set* set = &main_;
    switch (o_.order) {
      case PolicyOrder::kArrival: e.a = arrival_s; break;
      case PolicyOrder::kRemaining: {
        const double remaining = remainingOf(*r, 1);
        e.a = remaining + arrival_s / o_.aging;
        e.b = arrival_s;
        const double magnitude = std::abs(remaining) + std::abs(arrival_s) / o_.aging;
        if (std::isfinite(magnitude)) max_magnitude_ = std::max(max_magnitude_, magnitude);
        break;
      }
      case PolicyOrder::kDeadline:
      case PolicyOrder::kPriority: {
        s.priority = o_.order == PolicyOrder::kPriority ? r->priority : 0;
        auto cls = classes_.find(s.priority);
        if (cls == classes_.end()) cls = classes_.emplace(s.priority, Class()).first;
        s.cls = &cls->second;
        e.b = arrival_s;
        if (r->deadline_ns <= 0) {
          e.a = arrival_s;
          set = &s.cls->none;
          break;
        }
        const double deadline_s = r->deadline_ns * 1e-9;
        e.a = deadline_s;
        set = &s.cls->met;
        if (!r->cost.known) break;  // plain EDF: never missed
        // Its fastest degree (of all the request allows: at least those deadlineKeys tries) meets the deadline
        // while now + fastest <= deadline.
        double fastest = std::numeric_limits<double>::infinity();
        const int top = std::max(1, std::min(r->max_degree, kMaxRanks));
        for (int d = 1; d <= top; ++d) {
          const double need = remainingOf(*r, d) * o_.deadline_margin;
          if (need < fastest) fastest = need;
        }
        if (fastest == std::numeric_limits<double>::infinity()) {
          set = &s.cls->missed;  // no degree has a prediction: missed whatever the time
        } else if (std::isfinite(fastest)) {
          s.expires_s = deadline_s - fastest + 1e-12 * (1 + std::abs(deadline_s) + std::abs(fastest));
          s.expires = true;
          expiry_.push({s.expires_s, s.seq, h});
        }
        break;
      }
    }
    s.set = set;
    // by arrival, a request almost always goes last
    const bool by_arrival =
        (set == &main_ && o_.order == PolicyOrder::kArrival) || (s.cls != nullptr && set == &s.cls->none);
    s.it = by_arrival ? set->insert(set->end(), e) : set->insert(e).first;
    s.ranks = r->ranks;
    for (int w : s.ranks) {
      if (w >= 0 && w < kMaxRanks) ++held_[w];
    }
    ++size_;
    return h;
  }

  void erase(size_t h) override {
    Slot& s = slots_[h];
    s.set->erase(s.it);
    for (int w : s.ranks) {
      if (w >= 0 && w < kMaxRanks) --held_[w];
    }
    if (o_.order == PolicyOrder::kPriority && s.cls->size() == 0) classes_.erase(s.priority);
    s.live = false;
    free_.push_back(h);
    --size_;
    if (expiry_.size() > 2 * size_ + 1024) rebuildExpiry();  // erased requests' times pile up
  }

  size_t size() const override { return size_; }

  bool madeFor(const PolicyOptions& o) const {
    return o.order == o_.order && o.aging == o_.aging && o.deadline_margin == o_.deadline_margin;
  }

  // edf, priority: moves the requests that can no longer meet their deadline at `now_s` into `missed`.
  void advance(double now_s) {
    if (now_s < now_s_) {  // the clock went back: what was missed may be met again
      for (Slot& s : slots_) {
        if (s.live && s.expires && s.set == &s.cls->missed) move(s, &s.cls->met);
      }
      rebuildExpiry();
    }
    now_s_ = now_s;
    while (!expiry_.empty() && expiry_.top().at_s < now_s) {
      const Expiry x = expiry_.top();
      expiry_.pop();
      Slot& s = slots_[x.slot];
      if (!s.live || s.seq != x.seq) continue;  // erased since
      move(s, &s.cls->missed);
    }
  }

  const Set& main() const { return main_; }
  // Every request it holds, in no particular order.
  template <typename Fn>
  void forEach(Fn fn) const {
    for (const Slot& s : slots_) {
      if (s.live) fn(s.it->rec);
    }
  }
  // Classes in the order they are served (larger priority first).
  const std::map<int32_t, Class, std::greater<int32_t>>& classes() const { return classes_; }
  // Waiting requests holding their state on rank w.
  int held(int w) const { return held_[w]; }
  // srtf: the largest |remaining| + |arrival| / aging inserted (a bound for the band of rounding).
  double maxMagnitude() const { return max_magnitude_; }

 private:
  struct Slot {
    bool live = false;
    Set* set = nullptr;
    Set::iterator it;
    Class* cls = nullptr;  // edf, priority
    int32_t priority = 0;
    uint64_t seq = 0;      // tells a reused slot from the one an expiry was for
    bool expires = false;  // in `met` until expires_s
    double expires_s = 0;
    std::vector<int> ranks;  // what it added to held_
  };
  struct Expiry {
    double at_s;
    uint64_t seq;
    size_t slot;
    bool operator>(const Expiry& o) const { return at_s != o.at_s ? at_s > o.at_s : seq > o.seq; }
  };

  void move(Slot& s, Set* to) {
    const Entry e = *s.it;
    s.set->erase(s.it);
    s.set = to;
    s.it = to->insert(e).first;
  }
  void rebuildExpiry() {
    expiry_ = decltype(expiry_)();
    for (size_t h = 0; h < slots_.size(); ++h) {
      const Slot& s = slots_[h];
      if (s.live && s.expires && s.set == &s.cls->met) expiry_.push({s.expires_s, s.seq, h});
    }
  }

  PolicyOptions o_;
  Set main_;                                                 // fcfs, srtf
  std::map<int32_t, Class, std::greater<int32_t>> classes_;  // edf (one class), priority
  std::vector<Slot> slots_;                                  // by handle
  std::vector<size_t> free_;                                 // handles to reuse
  size_t size_ = 0;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<Expiry>> expiry_;
  std::vector<int> held_;
  double now_s_ = -std::numeric_limits<double>::infinity();
  double max_magnitude_ = 0;
  uint64_t next_seq_ = 0;
};

class PlanningPolicy : public Policy {
 public:
  explicit PlanningPolicy(const PolicyOptions& o) : o_(o) {
    GFDIT_CHECK(o.steps_per_decision >= 1) << "steps per decision must be >= 1";
    GFDIT_CHECK(o.min_gain >= 0 && o.min_gain < 1) << "min_gain must be in [0, 1)";
    GFDIT_CHECK(o.aging > 0) << "aging must be positive";
    GFDIT_CHECK(o.deadline_margin >= 1) << "deadline_margin must be >= 1";
    GFDIT_CHECK(o.max_batch >= 1 && o.max_batch <= kMaxBatch).param("max_batch")
        << "max_batch must be in [1, " << kMaxBatch << "], got " << o.max_batch;
    GFDIT_CHECK(o.batch_gain >= 0 && o.batch_gain < 1).param("batch_gain") << "batch_gain must be in [0, 1)";
    GFDIT_CHECK(o.decode_degree >= 0 && o.decode_degree <= kMaxRanks).param("decode_degree")
        << "decode_degree must be in [0, " << kMaxRanks << "], got " << o.decode_degree;
    GFDIT_CHECK(o.aux_ranks >= 0 && o.aux_ranks < kMaxRanks).param("aux_ranks")
        << "aux_ranks must be in [0, " << kMaxRanks << "), got " << o.aux_ranks;
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
    if (o_.max_batch != PolicyOptions().max_batch) n += ":batch=" + std::to_string(o_.max_batch);
    if (o_.decode_degree != 0) n += ":decode=" + std::to_string(o_.decode_degree);
    if (o_.aux_ranks != 0) n += ":stages=split" + (o_.aux_ranks != 1 ? "=" + std::to_string(o_.aux_ranks) : "");
    return n;
  }
  LayoutFamily layouts() const override { return o_.layouts; }
  std::unique_ptr<ReadyOrder> makeReadyOrder() const override { return std::make_unique<PlanningOrder>(o_); }

  bool placesDecodes() const override { return o_.aux_ranks > 0; }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    if (o_.aux_ranks > 0) return split(view);
    return plan(view);
  }

 private:
  // NOTE [planning], 6: the auxiliary ranks (the last aux_ranks) take the decodes of the requests whose steps are
  // done, in arrival order, then the encodes of new requests in the policy's order, one rank each; the other ranks
  // are planned as usual for the requests that have steps left.
  std::vector<Decision> split(const SchedulerView& view) {
    const int world = view.world_size;
    const int first_aux = std::max(1, world - o_.aux_ranks);  // the denoise side keeps one rank at least
    std::vector<const RequestRecord*> waiting(view.ready.begin(), view.ready.end());
    if (view.order != nullptr) {
      auto* order = dynamic_cast<PlanningOrder*>(view.order);
      GFDIT_CHECK(order != nullptr && order->madeFor(o_))
          << "policy " << name() << ": the view's ready order was made by another policy";
      order->forEach([&](const RequestRecord* r) { waiting.push_back(r); });
    }
    std::sort(waiting.begin(), waiting.end(), [](const RequestRecord* a, const RequestRecord* b) {
      return a->arrival_ns != b->arrival_ns ? a->arrival_ns < b->arrival_ns : a->id < b->id;
    });
    std::vector<int> aux, rest;
    for (int w : view.free_ranks) (w >= first_aux ? aux : rest).push_back(w);
    std::vector<Decision> out;
    std::vector<const RequestRecord*> queued, stepping;
    for (const RequestRecord* r : waiting) {
      if (r->state == RequestState::kQueued) {
        queued.push_back(r);
      } else if (r->stepsLeft() <= 0) {
        if (aux.empty()) continue;
        Decision d;
        d.request_id = r->id;
        d.stage = cost::Stage::kDecode;
        d.ranks = {aux.front()};
        aux.erase(aux.begin());
        out.push_back(std::move(d));
      } else {
        stepping.push_back(r);
      }
    }
    if (!queued.empty() && !aux.empty()) {  // encodes in the policy's order
      cands_.clear();
      const double now_s = view.now_ns * 1e-9;
      for (const RequestRecord* r : queued) cands_.push_back(candidate(r, true, now_s));
      std::sort(cands_.begin(), cands_.end(), [](const Candidate& a, const Candidate& b) {
        return std::make_tuple(a.k0, a.k1, a.k2, a.k3, a.rec->id) < std::make_tuple(b.k0, b.k1, b.k2, b.k3, b.rec->id);
      });
      for (size_t i = 0; i < cands_.size() && !aux.empty(); ++i) {
        Decision d;
        d.request_id = cands_[i].rec->id;
        d.stage = cost::Stage::kEncode;
        d.ranks = {aux.front()};
        aux.erase(aux.begin());
        out.push_back(std::move(d));
      }
    }
    // the steps, on the other ranks, of the requests that have steps left
    SchedulerView v = view;
    v.free_ranks = rest;
    v.ready = stepping;
    v.order = nullptr;
    v.running.clear();
    for (const RequestRecord* r : view.running) {
      if (r->state == RequestState::kDenoising) v.running.push_back(r);  // not an encode or a decode
    }
    std::vector<Decision> steps = plan(v);
    out.insert(out.end(), steps.begin(), steps.end());
    return out;
  }

 public:
  std::vector<Decision> plan(const SchedulerView& view) {
    const int world = view.world_size;
    world_ = world;
    now_ns_ = view.now_ns;
    const double now_s = view.now_ns * 1e-9;
    PlanningOrder* order = view.order != nullptr ? dynamic_cast<PlanningOrder*>(view.order) : nullptr;
    GFDIT_CHECK(view.order == nullptr || (order != nullptr && order->madeFor(o_)))
        << "policy " << name() << ": the view's ready order was made by another policy";
    cands_.clear();
    int capacity = static_cast<int>(view.free_ranks.size());
    int decoding = 0;  // ranks a decode holds: outside the plan, but each takes a core (step 4)
    for (const RequestRecord* r : view.ready) cands_.push_back(candidate(r, true, now_s));
    for (const RequestRecord* r : view.running) {
      if (r->batch_leader != 0 && r->batch_leader != r->id) continue;  // its batch's head plans for it (3b)
      if (r->state == RequestState::kDecoding) {
        ++decoding;  // a decode runs on one rank (its holders' others are free)
        continue;
      }
      Candidate c = candidate(r, false, now_s);
      c.current = std::max(1, r->layout.degree());
      capacity += c.current;
      cands_.push_back(c);
    }
    const size_t num_cands = cands_.size() + (order != nullptr ? order->size() : 0);
    if (num_cands == 0 || capacity == 0) return {};

    // 2. order; only the first `capacity` can get ranks
    size_t top = std::min(num_cands, static_cast<size_t>(capacity));
    const bool deadlines = o_.order == PolicyOrder::kDeadline || o_.order == PolicyOrder::kPriority;
    // see NOTE [deadline admission]: the first few in order, then those that fit drop the ones that do not
    size_t head =
        deadlines
            ? std::min(num_cands, std::max(kAdmissionHeadPerRank * static_cast<size_t>(capacity), kAdmissionHeadMin))
            : top;
    // 3b: those that get no rank may join a batch of the first `capacity`, as many as the batches hold
    const bool batching = o_.max_batch > 1 && view.cost != nullptr && num_cands > static_cast<size_t>(capacity);
    if (batching) {
      head = std::max(head, std::min(num_cands, static_cast<size_t>(capacity) *
                                                    static_cast<size_t>(std::min(o_.max_batch, kMaxBatch))));
    }
    if (order != nullptr) addHead(*order, head, now_s);  // see NOTE [planning order]
    auto before = [](const Candidate& a, const Candidate& b) {
      if (a.k0 != b.k0) return a.k0 < b.k0;
      if (a.k1 != b.k1) return a.k1 < b.k1;
      if (a.k2 != b.k2) return a.k2 < b.k2;
      if (a.k3 != b.k3) return a.k3 < b.k3;
      return a.rec->id < b.rec->id;
    };
    // The order is total (the id breaks ties), so either sort puts the same candidates first, the same way;
    // a heap pays only when the head is a small part of all (a full list).
    if (cands_.size() <= 2 * head) {
      std::sort(cands_.begin(), cands_.end(), before);
    } else {
      std::partial_sort(cands_.begin(), cands_.begin() + head, cands_.end(), before);
    }
    if (deadlines && admit(head, capacity, now_s)) std::sort(cands_.begin(), cands_.begin() + head, before);
    head_ = std::min(head, cands_.size());
    if (o_.max_batch > 1 && view.cost != nullptr && joinGroups(*view.cost)) {
      // 3a: joined siblings take no rank of their own: the first `capacity` of the others can get ranks
      size_t own = 0;
      top = 0;
      while (top < head_ && own < static_cast<size_t>(capacity)) own += cands_[top++].unit < 0;
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
        if (c.unit >= 0) continue;  // in a sibling's batch (3a)
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

    if (batching && left == 0) formBatches(head_, top, *view.cost);

    // 5. placement
    pool_.assign(world, false);
    int num_pool = 0;
    for (int w : view.free_ranks) {
      pool_[w] = true;
      ++num_pool;
    }
    held_.assign(world, 0);
    if (order != nullptr) {
      for (int w = 0; w < world; ++w) held_[w] = order->held(w);
    }
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
      if (c.members > 1 && degree == batches_[i].degree) {  // its batch (3a, 3b), on the degree it was priced for
        for (size_t j = 0; j < head_; ++j) {
          if (cands_[j].unit == static_cast<int>(i)) d.batch.push_back(cands_[j].rec->id);
        }
      }
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
      d.decode_degree = o_.decode_degree;
      out.push_back(std::move(d));
    }
    return out;
  }

 private:
  // The largest degree of at most `d` ranks the request can run on (a finite prediction); `d` without one.
  static int fitDegree(const RequestRecord& r, int d) {
    if (!r.cost.known) return std::max(1, d);
    for (int k = d; k > 1; --k) {
      if (std::isfinite(r.cost.stepSeconds(k))) return k;
    }
    return 1;
  }

  // Step 3b (NOTE [planning]): every ready candidate of the first `head` that got no rank joins, in order, the
  // smallest batch of its shape among the first `top` that got ranks and wait for a decision (not one running: its
  // members join at its boundary), while the batch has room (max_batch, the cost model's memory limit) and each
  // request's share of the step stays batch_gain below a step alone (joinBatch).
  void formBatches(size_t head, size_t top, const cost::CostModel& cost) {
    if (batches_.size() < top) batches_.resize(top);
    for (size_t j = 0; j < head; ++j) {
      Candidate& c = cands_[j];
      if (c.plan > 0 || c.unit >= 0 || !c.ready || c.rec->state == RequestState::kDecoding) continue;
      while (true) {  // the smallest batch of its shape with room first (the earliest among equals)
        int best = -1;
        for (size_t i = 0; i < top; ++i) {
          const Candidate& u = cands_[i];
          const BatchPlan& b = batches_[i];
          if (u.plan <= 0 || !u.ready || !sameBatchShape(u.rec->shape, c.rec->shape)) continue;
          if (b.max_members != 0 && b.members >= b.max_members) continue;
          if (best < 0 || u.members < cands_[best].members) best = static_cast<int>(i);
        }
        if (best < 0) break;
        Candidate& u = cands_[best];
        BatchPlan& b = batches_[best];
        if (b.max_members == 0 && b.members == 1) {
          b.start(*u.rec, u.plan,
                  u.rec->cost.known ? u.rec->cost.layoutFor(u.plan) : plainLayout(u.plan, u.rec->num_heads), now_ns_);
        }
        if (!joinBatch(cost, o_.max_batch, o_.batch_gain, *c.rec, now_ns_, b)) {
          if (b.members < b.max_members) break;  // refused for its deadline: it waits
          continue;                              // that one is full now: the next
        }
        u.members = b.members;
        c.unit = best;
        break;
      }
    }
  }

  // Step 3a (NOTE [planning]): a ready candidate joins the batch of the first ready candidate of its group (the
  // requests submitted together, RequestSpec::group) before it in order, whatever the load, while joinBatch takes
  // it at that candidate's base degree. Returns whether any joined.
  bool joinGroups(const cost::CostModel& cost) {
    batches_.assign(head_, BatchPlan());
    bool any = false;
    for (size_t j = 1; j < head_; ++j) {
      Candidate& c = cands_[j];
      if (c.rec->group == 0 || !c.ready || c.rec->state == RequestState::kDecoding) continue;
      for (size_t i = 0; i < j; ++i) {
        Candidate& u = cands_[i];
        if (u.rec->group != c.rec->group || !u.ready || u.unit >= 0 || !sameBatchShape(u.rec->shape, c.rec->shape)) {
          continue;
        }
        BatchPlan& b = batches_[i];
        if (b.max_members == 0) {
          const int degree = fitDegree(*u.rec, std::min(u.base, limit(*u.rec, world_)));
          b.start(*u.rec, degree,
                  u.rec->cost.known ? u.rec->cost.layoutFor(degree) : plainLayout(degree, u.rec->num_heads), now_ns_);
        }
        if (joinBatch(cost, o_.max_batch, o_.batch_gain, *c.rec, now_ns_, b)) {
          u.members = b.members;
          c.unit = static_cast<int>(i);
          any = true;
        }
        break;  // the group's first one only
      }
    }
    return any;
  }

  // Step 4: the degree that c's group grows to with at most `left` more ranks, the one that saves the most
  // remaining time per added rank among those worth growing to (NOTE [planning]); false when none is. Cached
  // in c: the best of fewer spare ranks is the same while it still fits.
  bool growth(Candidate& c, int left, int world) const {
    if (c.plan <= 0 || c.members > 1) return false;  // a batch runs on the degree it was priced for (3a, 3b)
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

  // Candidates for a superset of the first `n` waiting requests `order` holds, in the policy's order at now_s
  // (NOTE [planning order]); a full sort of all candidates and of these puts the same ones first.
  void addHead(PlanningOrder& order, size_t n, double now_s) {
    if (n == 0) return;
    switch (o_.order) {
      case PolicyOrder::kArrival: {
        size_t k = 0;
        for (auto it = order.main().begin(); it != order.main().end() && k < n; ++it, ++k) {
          cands_.push_back(candidate(it->rec, true, now_s));
        }
        break;
      }
      case PolicyOrder::kRemaining: {
        // keys within the band of rounding of the n-th may come before it when computed exactly
        const double band = 2e-12 * (1 + order.maxMagnitude() + std::abs(now_s) / o_.aging);
        size_t k = 0;
        double last = 0;
        for (const PlanningOrder::Entry& e : order.main()) {
          if (k >= n && !(e.a <= last + band)) break;
          cands_.push_back(candidate(e.rec, true, now_s));
          if (k < n) last = e.a;
          ++k;
        }
        break;
      }
      case PolicyOrder::kDeadline:
      case PolicyOrder::kPriority: {
        order.advance(now_s);
        size_t need = n;
        for (const auto& kv : order.classes()) {  // the first `need` of each class in turn
          if (need == 0) break;
          const PlanningOrder::Class& cls = kv.second;
          const size_t take = std::min(need, cls.size());
          need -= take;
          size_t met = 0;  // exactly (a request inside the margin of its time may have missed its deadline)
          for (auto it = cls.met.begin(); it != cls.met.end() && met < take; ++it) {
            cands_.push_back(candidate(it->rec, true, now_s));
            met += cands_.back().k1 == 0;
          }
          if (met == take) continue;
          size_t left = take - met;  // every one in `met` is a candidate now; then no deadline, then missed
          for (auto it = cls.none.begin(); it != cls.none.end() && left > 0; ++it, --left) {
            cands_.push_back(candidate(it->rec, true, now_s));
          }
          for (auto it = cls.missed.begin(); it != cls.missed.end() && left > 0; ++it, --left) {
            cands_.push_back(candidate(it->rec, true, now_s));
          }
        }
        break;
      }
    }
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
  int64_t now_ns_ = 0;
  size_t head_ = 0;  // candidates of this round that are sorted
  std::vector<Candidate> cands_;
  std::vector<BatchPlan> batches_;  // step 3b, by candidate
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
