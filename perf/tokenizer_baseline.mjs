// The tiktoken side of perf/run_tokenizer_bench.sh: OpenAI's tiktoken (npm `tiktoken`, the WASM
// build of its Rust core) loading the same rank file and encoding the same text with the same
// pattern as bench_tokenizer, one sample per line in the same format.
//
//   node tokenizer_baseline.mjs NODE_MODULES RANKS O200K_PAT KIMI_PAT TEXT REPS MB [DUMP_PREFIX]
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const [modules, ranksPath, o200kPatPath, kimiPatPath, textPath, repsArg, mbArg, dump] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const { Tiktoken } = require(require.resolve("tiktoken/lite", { paths: [modules] }));

const reps = Number(repsArg);
const ranks = readFileSync(ranksPath, "utf8");
const text = readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
// As bench_tokenizer: each sample encodes the text enough times for about MB megabytes.
const calls = Math.max(1, Math.round((Number(mbArg) * 1e6) / bytes));
const patterns = { o200k: readFileSync(o200kPatPath, "utf8").trim(), kimi: readFileSync(kimiPatPath, "utf8").trim() };

// Wall time and this process's CPU time (the host is shared, so CPU time is the steadier one).
const stopwatch = () => ({ wall: performance.now(), cpu: process.cpuUsage() });
const wallS = (sw) => (performance.now() - sw.wall) / 1e3;
const cpuS = (sw) => {
  const d = process.cpuUsage(sw.cpu);
  return (d.user + d.system) / 1e6;
};

for (let r = 0; r < reps; ++r) {
  const sw = stopwatch();
  const enc = new Tiktoken(ranks, {}, patterns.o200k);
  console.log(`tiktoken load_cpu_ms ${(1e3 * cpuS(sw)).toFixed(3)}`);
  console.log(`tiktoken load_wall_ms ${(1e3 * wallS(sw)).toFixed(3)}`);
  enc.free();
}
console.log(`tiktoken text_bytes ${bytes}`);
for (const [name, pat] of Object.entries(patterns)) {
  const enc = new Tiktoken(ranks, {}, pat);
  let ids = enc.encode_ordinary(text); // warm-up, and the ids to compare
  for (let r = 0; r < reps; ++r) {
    const sw = stopwatch();
    for (let c = 0; c < calls; ++c) ids = enc.encode_ordinary(text);
    const mb = (bytes * calls) / 1e6;
    console.log(`tiktoken encode_${name}_cpu_mbps ${(mb / cpuS(sw)).toFixed(3)}`);
    console.log(`tiktoken encode_${name}_wall_mbps ${(mb / wallS(sw)).toFixed(3)}`);
  }
  console.log(`tiktoken ids_${name} ${ids.length}`);
  if (dump) writeFileSync(`${dump}.${name}.bin`, Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength));
  enc.free();
}
