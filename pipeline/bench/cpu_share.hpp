// How much of the CPU compute threads actually get, measured from inside the process by spinning.
//
// Each of `threads` spinner threads reads the steady clock in a tight loop; a step between two reads
// longer than kGapSeconds is time that thread did not run. On bare metal that is the kernel's
// scheduler giving the core to someone else; on a virtual machine it is also the host taking the
// vCPU away, which a guest's /proc/stat may never report as steal. `k3flow probe` and `k3flow bench`
// spin once with the device quiet and once while a deep queue of reads streams, so the CPU that
// reads cost the compute is a measured number (docs/performance.md "CPU the reads take").
#pragma once
#include <functional>

namespace k3::pipeline {

inline constexpr double kGapSeconds = 200e-6;  // shorter steps are the clock read and the loop itself

struct CpuShare {
  int threads = 0;
  double seconds = 0;      // wall time the spinners ran
  double share = 0;        // 1 - (time lost in gaps, all threads) / (threads x seconds); 0 when not measured
  double longest_gap = 0;  // seconds: the longest time one spinner did not run
  long gaps = 0;           // how many gaps, all threads
  bool measured() const { return threads > 0 && seconds > 0; }
};

// Spins `threads` threads while `beside()` runs on the calling thread, and stops them when it returns.
// An empty `beside` sleeps for `seconds`. Threads inherit the caller's CPU affinity. Throws usage
// Error for threads < 1 or, with an empty `beside`, seconds <= 0.
CpuShare measure_cpu_share(int threads, const std::function<void()>& beside, double seconds = 0);

// The fastest a token can be when reads take part of the compute's CPU. Reads need t_io of time at
// the device's ceiling, compute t_cpu of the whole CPU; while reads are in flight the compute runs at
// `cpu_share` of its speed (in (0, 1]; anything else counts as 1). The reads are taken at their full
// rate -- the most favourable case: of the patterns measured (docs/performance.md), the ceiling's
// deep queue costs the compute the least CPU time per byte -- so this is a floor, not a prediction
// (a run below it would mean the share was measured pessimistically):
//   t_cpu <= cpu_share * t_io: t_io (the compute fits inside the reads, even slowed);
//   otherwise: t_cpu + (1 - cpu_share) * t_io.
// With cpu_share 1 that is max(t_io, t_cpu).
double attainable_seconds(double t_io, double t_cpu, double cpu_share);

}  // namespace k3::pipeline
