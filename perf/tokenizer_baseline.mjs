// The tiktoken side of perf/run_tokenizer_bench.sh: OpenAI's tiktoken (npm `tiktoken`, the WASM
// build of its Rust core) loading the same rank file and encoding the same text with the same
// pattern as bench_tokenizer, one sample per line in the same format.
//
//   node tokenizer_baseline.mjs NODE_MODULES RANKS O200K_PAT KIMI_PAT TEXT REPS [DUMP_PREFIX]
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const [modules, ranksPath, o200kPatPath, kimiPatPath, textPath, repsArg, dump] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const { Tiktoken } = require(require.resolve("tiktoken/lite", { paths: [modules] }));

const reps = Number(repsArg);
const ranks = readFileSync(ranksPath, "utf8");
const text = readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const patterns = { o200k: readFileSync(o200kPatPath, "utf8").trim(), kimi: readFileSync(kimiPatPath, "utf8").trim() };

for (let r = 0; r < reps; ++r) {
  const t0 = performance.now();
  const enc = new Tiktoken(ranks, {}, patterns.o200k);
  console.log(`tiktoken load_ms ${(performance.now() - t0).toFixed(3)}`);
  enc.free();
}
console.log(`tiktoken text_bytes ${bytes}`);
for (const [name, pat] of Object.entries(patterns)) {
  const enc = new Tiktoken(ranks, {}, pat);
  let ids = enc.encode_ordinary(text); // warm-up, and the ids to compare
  for (let r = 0; r < reps; ++r) {
    const t0 = performance.now();
    ids = enc.encode_ordinary(text);
    const secs = (performance.now() - t0) / 1e3;
    console.log(`tiktoken encode_${name}_mbps ${(bytes / 1e6 / secs).toFixed(3)}`);
  }
  console.log(`tiktoken ids_${name} ${ids.length}`);
  if (dump) writeFileSync(`${dump}.${name}.bin`, Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength));
  enc.free();
}
