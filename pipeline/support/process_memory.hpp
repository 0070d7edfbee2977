// This process's memory as the kernel counts it, from /proc/self/status.
//
// Why not getrusage(RUSAGE_SELF).ru_maxrss for the peak: Linux keeps that figure in the process's
// signal state, which outlives exec, and at exec it takes in the peak of the address space being
// replaced -- for a spawned child (fork or posix_spawn's vfork), the parent's. So `k3flow generate`
// started by a Python session holding 1 GiB reported "PEAK RSS 1.01 GiB" for a 16 MiB run, and every
// child of `k3flow bench` reported the bench's own probe buffers (527 MiB) as its peak. VmHWM belongs
// to the address space this program's exec created, so it is this program's own peak.
#pragma once
#include <cstdint>

namespace k3::pipeline {

// The number in kB after "KEY:" in a /proc file of "Key: value kB" lines (0 when absent/unreadable).
uint64_t proc_field_kb(const char* file, const char* key);

// VmRSS of this process in bytes (0 when unreadable).
uint64_t current_rss_bytes();

// VmHWM -- the most this process has held resident since its exec -- in bytes; ru_maxrss where
// /proc is not mounted.
uint64_t peak_rss_bytes();

}  // namespace k3::pipeline
