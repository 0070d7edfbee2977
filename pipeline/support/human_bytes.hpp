// The one formatter for numbers of bytes people read (stdout tables, stderr messages). One convention
// for every command: sizes of memory, budgets and files in binary units with the base in the name
// (KiB, MiB, GiB, TiB: 1 GiB = 2^30 B), rates in decimal GB/s (1 GB = 10^9 B, as disks are quoted).
// Exact byte counts, where they matter, are printed beside the human figure by the caller.
#pragma once
#include <string>

namespace k3::pipeline {

// "512 B", "1.50 KiB", "597.00 MiB", "7.84 GiB", "1.42 TiB": the largest unit that keeps the figure
// >= 1, two decimals.
std::string human_bytes(double bytes);
// Always GiB, two decimals ("0.10 GiB", "8.00 GiB"): budgets, which are given in GiB.
std::string gib(double bytes);
// "2.81 GB/s", "0.042 GB/s": bytes per second in decimal GB/s, three significant digits below 1.
std::string human_rate(double bytes_per_second);

}  // namespace k3::pipeline
