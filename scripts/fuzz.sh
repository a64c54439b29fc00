#!/usr/bin/env bash
# Fuzzes the parsers of outside input (tests/fuzz/targets.h) with libFuzzer under ASan + UBSan.
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 600 s, every target)
#   FUZZ_JOBS=N: build jobs (default: nproc)
# Builds build-fuzz/ with clang-14 (installed here if missing: clang-14, libclang-rt-14-dev,
# libomp-14-dev), runs each target from a working copy of its corpus (tests/fuzz/corpus/<target>,
# grown in build-fuzz/corpus/<target>, not in the repo) and prints libFuzzer's final stats line
# (executions, coverage). An input that crashes, leaks, trips a sanitizer or lets an exception
# other than brigade::Error escape is a finding: it is copied into tests/fuzz/corpus/<target>/
# as <kind>-<sha1> (libFuzzer's kind: crash, timeout, leak, oom), which the test command then
# replays for good (commit it with the fix).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-600}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] ||
  TARGETS=(safetensors recipe token_file fashion_idx checkpoint_state optimizer_index hf_config hf_index tokenizer sft_jsonl)

need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
[ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
[ -e /usr/lib/llvm-14/lib/libomp.so ] || need+=(libomp-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz.sh: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link -g"
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DBRIGADE_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-fuzz -j"${FUZZ_JOBS:-$(nproc)}" --target $(printf 'fuzz_%s ' "${TARGETS[@]}")

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for t in "${TARGETS[@]}"; do
  work="build-fuzz/corpus/$t" art="build-fuzz/artifacts/$t/"
  mkdir -p "$work" "$art"
  cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  echo "== fuzz_$t for ${SECONDS_PER_TARGET} s"
  if ! build-fuzz/tests/fuzz/fuzz_"$t" "$work" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 \
        -timeout=20 -print_final_stats=1 -artifact_prefix="$art" 2> "build-fuzz/fuzz_$t.log"; then
    status=1
    echo "fuzz.sh: fuzz_$t found a failing input (build-fuzz/fuzz_$t.log); kept as a regression input:"
    for f in "$art"*; do
      [ -f "$f" ] || continue
      kind="$(basename "$f" | cut -d- -f1)"  # libFuzzer's crash / timeout / leak / oom
      dst="tests/fuzz/corpus/$t/$kind-$(sha1sum "$f" | cut -c1-12)"
      cp "$f" "$dst" && echo "  $dst"
    done
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov:" "build-fuzz/fuzz_$t.log" | tail -3 || true
done
exit $status
