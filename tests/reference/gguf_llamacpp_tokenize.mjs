// llama.cpp's own tokenizer on a GGUF file's tokenizer.ggml.* vocabulary, through node-llama-cpp's
// prebuilt CPU build (installed by `scripts/install-deps.sh --with-llama-cpp` into
// third_party/npm-llamacpp/): the ids llama.cpp gives each string of IN.json (no BOS added,
// special-token text not parsed), printed as one JSON line {"llama_cpp": release, "ids": [[...]]}.
//
//   node gguf_llamacpp_tokenize.mjs NODE_MODULES_DIR FILE.gguf IN.json
import { pathToFileURL } from "node:url";
import path from "node:path";
import fs from "node:fs";

const [modulesDir, file, inFile] = process.argv.slice(2);
if (!modulesDir || !file || !inFile) {
  console.error("usage: node gguf_llamacpp_tokenize.mjs NODE_MODULES_DIR FILE.gguf IN.json");
  process.exit(2);
}
const { getLlama } = await import(pathToFileURL(path.join(modulesDir, "node-llama-cpp", "dist", "index.js")).href);
const strings = JSON.parse(fs.readFileSync(inFile, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: path.resolve(file) });
const ids = strings.map((s) => Array.from(model.tokenize(s, false)));
process.stdout.write(JSON.stringify({ llama_cpp: llama.llamaCppRelease, ids }) + "\n");
process.exit(0);
