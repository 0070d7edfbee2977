#include "pipeline/run/sampler_flags.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

namespace k3::pipeline {

void add_sampler_flags(CLI::App& sub, stages::SamplerOptions& o) {
  // Ranges are checked by stages::validate before any file is read (exit 2 naming the flag).
  sub.add_option("--temperature", o.temperature, "T >= 0: 0 = greedy (the default, bit-exact); > 0 samples")
      ->capture_default_str();
  sub.add_option("--top-k", o.top_k, "K >= 0: sample among the K most likely ids (0 = all)")
      ->capture_default_str();
  sub.add_option("--top-p", o.top_p,
                 "P in (0, 1]: nucleus, the smallest set of ids with this much probability")
      ->capture_default_str();
  sub.add_option("--min-p", o.min_p,
                 "M in [0, 1): drop ids below this fraction of the most likely one's probability")
      ->capture_default_str();
  sub.add_option("--repeat-penalty", o.repeat_penalty,
                 "R > 0: recent ids' positive logits are divided by R, negative ones multiplied (1 = off)")
      ->capture_default_str();
  sub.add_option("--repeat-last-n", o.repeat_last_n, "N >= 0: how many recent tokens the penalty looks at")
      ->capture_default_str();
  sub.add_option("--presence-penalty", o.presence_penalty,
                 "P in [-2, 2]: subtract P from the logit of every id already generated (OpenAI's; 0 = off)")
      ->capture_default_str();
  sub.add_option("--frequency-penalty", o.frequency_penalty,
                 "F in [-2, 2]: subtract F x (times generated) from each id's logit (OpenAI's; 0 = off)")
      ->capture_default_str();
  sub.add_option("--seed", o.seed, "random seed (0..2^64-1): the same seed gives the same text on every path")
      ->capture_default_str();
}

std::string describe_sampling(const stages::SamplerOptions& o) {
  std::string s = o.temperature > 0 ? fmt::format("sampled (temperature {}", o.temperature) : "greedy (";
  std::string sep = o.temperature > 0 ? ", " : "";
  auto add = [&](const std::string& part) {
    s += sep + part;
    sep = ", ";
  };
  if (o.temperature > 0) {
    if (o.top_k > 0) add(fmt::format("top-k {}", o.top_k));
    if (o.top_p < 1) add(fmt::format("top-p {}", o.top_p));
    if (o.min_p > 0) add(fmt::format("min-p {}", o.min_p));
    add(fmt::format("seed {}", o.seed));
  }
  if (o.repeat_penalty != 1) add(fmt::format("repeat penalty {} over {}", o.repeat_penalty, o.repeat_last_n));
  if (o.presence_penalty != 0) add(fmt::format("presence penalty {}", o.presence_penalty));
  if (o.frequency_penalty != 0) add(fmt::format("frequency penalty {}", o.frequency_penalty));
  if (sep.empty()) return "greedy";
  return s + ")";
}

}  // namespace k3::pipeline
