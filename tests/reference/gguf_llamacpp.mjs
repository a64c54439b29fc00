// Runs a GGUF file in llama.cpp itself, through node-llama-cpp's prebuilt CPU build (installed by
// `scripts/install-deps.sh --with-llama-cpp` into third_party/npm-llamacpp/), and compares its
// next-token probabilities with reference logits: for every prefix ids[0..t) of the sequence, the
// probabilities llama.cpp gives for token t against softmax(logits[t - 1]). Prints one JSON line:
// {"llama_cpp": release, "positions", "greedy_agree", "max_abs_prob_diff", "n_probabilities"}.
//
//   node gguf_llamacpp.mjs NODE_MODULES_DIR FILE.gguf EXPECTED.json
//
// EXPECTED.json: {"ids": [T ints], "logits": [T rows of V floats]}. Token ids are fed directly:
// llama.cpp's SentencePiece tokenizer aborts on a character a vocabulary without byte pieces
// (<0x0A> ...) cannot cover, as Brigade's tokenizers have none, so node-llama-cpp's tokenize probes
// at load time are replaced by a no-op here.
import { pathToFileURL } from "node:url";
import path from "node:path";
import fs from "node:fs";

const [modulesDir, file, expectedFile] = process.argv.slice(2);
if (!modulesDir || !file || !expectedFile) {
  console.error("usage: node gguf_llamacpp.mjs NODE_MODULES_DIR FILE.gguf EXPECTED.json");
  process.exit(2);
}
const { getLlama, LlamaModel } = await import(
  pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href
);
LlamaModel.prototype.tokenize = function () {
  return [];
};

const expected = JSON.parse(fs.readFileSync(expectedFile, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: path.resolve(file) });
// Room past the longest prefix: a full context would shift (drop early tokens) before the next token.
const context = await model.createContext({ contextSize: expected.ids.length + 8, batchSize: expected.ids.length + 8 });
const sequence = context.getSequence();

const softmax = (row) => {
  const m = Math.max(...row);
  const e = row.map((v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
};

let maxDiff = 0;
let greedyAgree = 0;
let nProbabilities = 0;
const T = expected.ids.length;
for (let t = 1; t <= T; ++t) {
  await sequence.clearHistory();
  const it = sequence.evaluateWithMetadata(expected.ids.slice(0, t), { probabilities: true }, { temperature: 0 });
  const step = (await it.next()).value;
  await it.return();
  const p = softmax(expected.logits[t - 1]);
  let argmax = 0;
  for (let i = 1; i < p.length; ++i) if (p[i] > p[argmax]) argmax = i;
  if (step.token === argmax) greedyAgree++;
  nProbabilities = Math.max(nProbabilities, step.probabilities.size);
  for (let i = 0; i < p.length; ++i) maxDiff = Math.max(maxDiff, Math.abs((step.probabilities.get(i) ?? 0) - p[i]));
}
process.stdout.write(
  JSON.stringify({
    llama_cpp: llama.llamaCppRelease,
    positions: T,
    greedy_agree: greedyAgree,
    max_abs_prob_diff: maxDiff,
    n_probabilities: nProbabilities,
  }) + "\n",
);
process.exit(0);
