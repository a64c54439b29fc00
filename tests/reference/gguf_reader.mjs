// An independent GGUF reader for tests/models/test_gguf.cpp: Hugging Face's @huggingface/gguf
// parser (pinned, installed into third_party/npm/ by scripts/install-deps.sh) reads a file and
// this prints, as one JSON object on stdout: the header version, tensor and metadata counts, the
// absolute offset of the tensor data, every metadata key with its GGUF value type (arrays: element
// type, length and first items) and every tensor info (name, shape in GGML order, ggml type id,
// offset into the data section).
//
//   node gguf_reader.mjs PACKAGE_DIR FILE.gguf [N_FIRST]
import { pathToFileURL } from "node:url";
import path from "node:path";

const [pkgDir, file, nFirstArg] = process.argv.slice(2);
if (!pkgDir || !file) {
  console.error("usage: node gguf_reader.mjs PACKAGE_DIR FILE.gguf [N_FIRST]");
  process.exit(2);
}
const nFirst = nFirstArg ? Number(nFirstArg) : 8;
const { gguf } = await import(pathToFileURL(path.join(pkgDir, "dist", "index.mjs")).href);

// BigInt (u64 fields) as a Number when exact, else as a string.
const plain = (v) => {
  if (typeof v === "bigint") return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v.toString();
  if (Array.isArray(v)) return v.map(plain);
  return v;
};

const parsed = await gguf(path.resolve(file), { allowLocalFile: true, typedMetadata: true });
const out = {
  version: plain(parsed.metadata.version),
  tensor_count: plain(parsed.metadata.tensor_count),
  kv_count: plain(parsed.metadata.kv_count),
  tensor_data_offset: plain(parsed.tensorDataOffset),
  metadata: {},
  tensors: parsed.tensorInfos.map((t) => ({
    name: t.name,
    shape: plain(t.shape),
    dtype: t.dtype,
    offset: plain(t.offset),
  })),
};
for (const [key, entry] of Object.entries(parsed.typedMetadata)) {
  if (key === "version" || key === "tensor_count" || key === "kv_count") continue;
  if (Array.isArray(entry.value)) {
    out.metadata[key] = {
      type: entry.type,
      subtype: entry.subType,
      length: entry.value.length,
      first: plain(entry.value.slice(0, nFirst)),
    };
  } else {
    out.metadata[key] = { type: entry.type, value: plain(entry.value) };
  }
}
process.stdout.write(JSON.stringify(out) + "\n");
