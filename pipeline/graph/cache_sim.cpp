#include "pipeline/graph/cache_sim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "io/error.hpp"
#include "io/json_text.hpp"
#include "pipeline/graph/expert_cache.hpp"
#include "pipeline/support/human_bytes.hpp"

namespace k3::pipeline {

std::vector<ReplayGroup> replay_groups(const RoutingTrace& t, ReplayOrder order) {
  std::vector<ReplayGroup> out;
  if (order == ReplayOrder::recorded) {
    for (const RoutingTrace::Group& g : t.groups) {
      ReplayGroup r{t.layers[size_t(g.layer_index)], {}};
      for (int32_t e : std::span(t.recorded).subspan(g.first, g.count))
        if (std::find(r.experts.begin(), r.experts.end(), e) == r.experts.end()) r.experts.push_back(e);
      out.push_back(std::move(r));
    }
    return out;
  }
  for (size_t p = 0; p < t.positions(); ++p)
    for (size_t l = 0; l < t.layers.size(); ++l) {
      const std::span<const int32_t> e = t.at(p, l);
      out.push_back(ReplayGroup{t.layers[l], std::vector<int32_t>(e.begin(), e.end())});
    }
  return out;
}

uint64_t slots_for_gib(double gib, uint64_t slot_bytes) {
  return uint64_t(std::floor(gib * double(uint64_t(1) << 30) / double(slot_bytes)));
}

uint64_t replay_hits(const RoutingTrace& t, std::span<const ReplayGroup> groups, ExpertPolicy policy,
                     uint64_t slots) {
  ExpertCache cache = ExpertCache::bookkeeping(slots, t.layers.back() + 1, t.n_experts, policy);
  uint64_t hits = 0;
  std::vector<int> held;
  for (const ReplayGroup& g : groups) {
    held.clear();
    for (int32_t e : g.experts) {
      ExpertCache::Result r = cache.request(g.layer, e, 0);
      if (r.found == ExpertCache::Found::full) {  // the next wave, once this one is computed
        for (int s : held) cache.release(s);
        held.clear();
        r = cache.request(g.layer, e, 0);
      }
      if (r.found == ExpertCache::Found::full || r.found == ExpertCache::Found::inflight)
        throw io::runtime_error("cache-sim: a request found no slot (internal error)");
      if (r.found == ExpertCache::Found::claimed)
        cache.landed(r.slot, true);
      else
        ++hits;
      held.push_back(r.slot);
    }
    for (int s : held) cache.release(s);
  }
  return hits;
}

uint64_t belady_hits(const RoutingTrace& t, std::span<const ReplayGroup> groups, uint64_t slots) {
  const uint64_t never = UINT64_MAX;
  const size_t E = size_t(t.n_experts);
  std::vector<int64_t> keys;
  for (const ReplayGroup& g : groups)
    for (int32_t e : g.experts) keys.push_back(int64_t(g.layer) * int64_t(E) + e);
  std::vector<uint64_t> next(keys.size());
  std::vector<uint64_t> upcoming(size_t(t.layers.back() + 1) * E, never);
  for (size_t i = keys.size(); i-- > 0;) {
    next[i] = upcoming[size_t(keys[i])];
    upcoming[size_t(keys[i])] = i;
  }
  std::vector<uint64_t> resident_next(upcoming.size(), 0);  // the key's next use while resident
  std::vector<char> resident(upcoming.size(), 0);
  std::set<std::pair<uint64_t, int64_t>> by_next;  // resident keys by next use (ties: by key)
  uint64_t hits = 0, i = 0;
  std::vector<int64_t> group;
  for (const ReplayGroup& g : groups) {
    group.clear();
    for (size_t j = 0; j < g.experts.size(); ++j, ++i) {
      const int64_t key = keys[i];
      if (resident[size_t(key)]) {
        ++hits;
        by_next.erase({resident_next[size_t(key)], key});
      } else if (by_next.size() >= slots) {        // the farthest next use outside this group
        if (group.size() >= slots) group.clear();  // every slot pinned: the next wave
        auto v = by_next.end();
        do --v;
        while (std::find(group.begin(), group.end(), v->second) != group.end());
        resident[size_t(v->second)] = 0;
        by_next.erase(v);
      }
      resident[size_t(key)] = 1;
      resident_next[size_t(key)] = next[i];
      by_next.insert({next[i], key});
      group.push_back(key);
    }
  }
  return hits;
}

std::vector<PredictorScore> locality_predictors(const RoutingTrace& t) {
  PredictorScore one{"previous position", 0, 0, 0}, two{"previous 2 positions", 0, 0, 0};
  std::vector<int32_t> u;
  for (size_t p = 1; p < t.positions(); ++p)
    for (size_t l = 1; l < t.layers.size(); ++l) {
      const std::span<const int32_t> used = t.at(p, l), prev = t.at(p - 1, l);
      auto hits = [&](std::span<const int32_t> pred) {
        uint64_t n = 0;
        for (int32_t e : pred) n += std::find(used.begin(), used.end(), e) != used.end() ? 1 : 0;
        return n;
      };
      one.predicted += prev.size();
      one.used += used.size();
      one.correct += hits(prev);
      if (p >= 2) {
        u.assign(prev.begin(), prev.end());
        for (int32_t e : t.at(p - 2, l))
          if (std::find(prev.begin(), prev.end(), e) == prev.end()) u.push_back(e);
        two.predicted += u.size();
        two.used += used.size();
        two.correct += hits(u);
      }
    }
  return {one, two};
}

CacheSimResult simulate_cache(const RoutingTrace& t, const CacheSimOptions& o) {
  CacheSimResult r;
  const std::vector<ReplayGroup> groups = replay_groups(t, o.order);
  std::vector<char> seen(size_t(t.layers.back() + 1) * size_t(t.n_experts), 0);
  for (const ReplayGroup& g : groups)
    for (int32_t e : g.experts) {
      ++r.requests;
      char& s = seen[size_t(g.layer) * size_t(t.n_experts) + size_t(e)];
      r.distinct += s ? 0 : 1;
      s = 1;
    }
  r.steps = o.order == ReplayOrder::incremental ? t.positions() : t.passes;
  for (double gib : o.cache_gib) {
    CacheSimRow row{gib, slots_for_gib(gib, o.slot_bytes), {}, 0};
    if (row.slots < uint64_t(t.top_k))
      throw io::usage_error(fmt::format("--cache-gb {}: {} slots of {} B, fewer than one layer's top-{}", gib,
                                        row.slots, o.slot_bytes, t.top_k));
    for (ExpertPolicy p : o.policies) row.hits.push_back(replay_hits(t, groups, p, row.slots));
    row.belady = belady_hits(t, groups, row.slots);
    r.rows.push_back(row);
  }
  r.predictors = locality_predictors(t);
  return r;
}

namespace {
double pct(uint64_t hits, uint64_t of) {
  return of ? 100.0 * double(hits) / double(of) : 0;
}
std::string read_per_step(uint64_t misses, uint64_t steps, uint64_t slot_bytes) {
  return human_bytes(steps ? double(misses) * double(slot_bytes) / double(steps) : 0);
}
}  // namespace

std::string format_cache_sim(const RoutingTrace& t, const CacheSimOptions& o, const CacheSimResult& r,
                             const std::string& name) {
  std::string s = fmt::format(
      "routing trace {}: {} positions x {} MoE layers x top-{} ({} pairs in {} passes), {} experts a layer\n"
      "replay: {} order, {} requests, {} distinct (layer, expert); slot {} B; steps {}\n"
      "compulsory-miss ceiling: no policy hits more than {:.1f} %\n",
      name, t.positions(), t.layers.size(), t.top_k, t.pairs, t.passes, t.n_experts,
      o.order == ReplayOrder::incremental ? "incremental" : "recorded", r.requests, r.distinct, o.slot_bytes,
      r.steps, 100 * r.hit_ceiling());
  s += fmt::format("{:>9} {:>6}", "cache GiB", "slots");
  for (ExpertPolicy p : o.policies) s += fmt::format(" {:>7}", fmt::format("{} %", expert_policy_name(p)));
  s += fmt::format(" {:>9}", "belady %");
  for (ExpertPolicy p : o.policies)
    s += fmt::format(" {:>10}", fmt::format("{}/belady", expert_policy_name(p)));
  for (ExpertPolicy p : o.policies)
    s += fmt::format(" {:>14}", fmt::format("{} read/step", expert_policy_name(p)));
  s += fmt::format(" {:>18}\n", "belady read/step");
  for (const CacheSimRow& row : r.rows) {
    s += fmt::format("{:>9g} {:>6}", row.gib, row.slots);
    for (uint64_t h : row.hits) s += fmt::format(" {:>7.1f}", pct(h, r.requests));
    s += fmt::format(" {:>9.1f}", pct(row.belady, r.requests));
    for (uint64_t h : row.hits)
      s += fmt::format(" {:>10.2f}", row.belady ? double(h) / double(row.belady) : 1.0);
    for (uint64_t h : row.hits)
      s += fmt::format(" {:>14}", read_per_step(r.requests - h, r.steps, o.slot_bytes));
    s += fmt::format(" {:>18}\n", read_per_step(r.requests - row.belady, r.steps, o.slot_bytes));
  }
  s += "prefetch predictors (while layer l runs, read ahead for layer l+1 of the same position):\n";
  for (const PredictorScore& p : r.predictors)
    s += fmt::format("  {:<22} precision {:5.1f} %  recall {:5.1f} %  ({} of {} predicted, {} used)\n",
                     p.name, 100 * p.precision(), 100 * p.recall(), p.correct, p.predicted, p.used);
  return s;
}

std::string cache_sim_json(const RoutingTrace& t, const CacheSimOptions& o, const CacheSimResult& r) {
  io::JsonWriter w;
  w.begin_object();
  w.field("positions", uint64_t(t.positions()))
      .field("layers", uint64_t(t.layers.size()))
      .field("top_k", t.top_k);
  w.field("pairs", t.pairs).field("passes", t.passes);
  w.field("order", o.order == ReplayOrder::incremental ? "incremental" : "recorded");
  w.field("slot_bytes", o.slot_bytes).field("requests", r.requests).field("distinct", r.distinct);
  w.field("steps", r.steps).fixed_field("hit_ceiling", r.hit_ceiling(), 6);
  w.key("rows").begin_array();
  for (const CacheSimRow& row : r.rows) {
    w.begin_object().field("cache_gib", row.gib).field("slots", row.slots);
    w.key("policies").begin_object();
    for (size_t i = 0; i < o.policies.size(); ++i) {
      w.key(expert_policy_name(o.policies[i])).begin_object();
      w.field("hits", row.hits[i]).fixed_field("hit_rate", double(row.hits[i]) / double(r.requests), 6);
      w.fixed_field("bytes_per_step",
                    double(r.requests - row.hits[i]) * double(o.slot_bytes) / double(r.steps), 0);
      w.end_object();
    }
    w.end_object();
    w.key("belady").begin_object().field("hits", row.belady);
    w.fixed_field("hit_rate", double(row.belady) / double(r.requests), 6);
    w.fixed_field("bytes_per_step", double(r.requests - row.belady) * double(o.slot_bytes) / double(r.steps),
                  0);
    w.end_object().end_object();
  }
  w.end_array();
  w.key("predictors").begin_array();
  for (const PredictorScore& p : r.predictors) {
    w.begin_object().field("name", p.name).field("predicted", p.predicted).field("used", p.used);
    w.field("correct", p.correct)
        .fixed_field("precision", p.precision(), 6)
        .fixed_field("recall", p.recall(), 6);
    w.end_object();
  }
  w.end_array();
  w.end_object();
  return w.str() + "\n";
}

}  // namespace k3::pipeline
