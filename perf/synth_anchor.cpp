// Keeps k3_synth a real library while perf/ is being filled in.
