#!/usr/bin/env bash
# Builds the engine and its tests with GCC's sanitizers and runs them (docs/reliability.md
# "Sanitizers"):
#   bash scripts/sanitize.sh address [CTEST_ARGS...]  ASan + UBSan (build-asan/), the whole suite
#   bash scripts/sanitize.sh thread  [CTEST_ARGS...]  TSan (build-tsan/), the communication-thread,
#                                                     overlap and data-parallel tests
# CTEST_ARGS go to ctest (e.g. -R Cli to run a subset). A sanitizer report fails the test that
# produced it (halt_on_error / exitcode), so the run's ctest summary is the verdict. Reports are
# also kept in build-<kind>/sanitizer-logs/ (log_path), one file per process that reported.
# The compiler is the project's own g++ (clang 14 cannot build the tests: it does not capture
# structured bindings in lambdas). The build jobs default to nproc; SANITIZE_JOBS overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND="${1:-}"
shift || true
case "$KIND" in
  address) SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
  thread) SAN="-fsanitize=thread" ;;
  *) echo "usage: bash scripts/sanitize.sh address|thread [ctest args...]" >&2; exit 2 ;;
esac
BUILD="build-${KIND/address/asan}"
BUILD="${BUILD/thread/tsan}"
JOBS="${SANITIZE_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$SAN -g" -DCMAKE_CXX_FLAGS="$SAN -g" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" >/dev/null

logs="$PWD/$BUILD/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
supp="$PWD/scripts/sanitizers"
if [ "$KIND" = address ]; then
  cmake --build "$BUILD" -j"$JOBS"
  # Open MPI, hwloc and libevent keep allocations until exit (not ours): leak suppressions.
  # keep_loaded.so is preloaded ahead of libasan, so ASan's link-order check is turned off.
  # intercept_tls_get_addr=0: GCC 12's runtime takes some dynamic-TLS blocks of glibc >= 2.25 for
  # glibc 2.19's layout and reads a bogus range from them; LeakSanitizer's tracer then segfaults at
  # exit ("Tracer caught signal 11", google/sanitizers#1322; dist_np4 hit it on 3 of 4 ranks every
  # run). With it off, dynamic TLS is not scanned for pointers: that can only add leak reports.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23:log_path=$logs/asan:verify_asan_link_order=0:intercept_tls_get_addr=0"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=23:log_path=$logs/ubsan"
  # Golden pins metrics bit for bit to the release build's code (which a * b + c the compiler
  # fuses into an fma, how it vectorises a reduction); the instrumented build rounds differently
  # in the last bits, so those comparisons cannot hold here. The same recipes run in the suite
  # through their other tests (training, resume, parity), which are checked.
  TESTS=(-E 'Golden')
else
  # the tests of the communication thread (CommQueue, overlapped buckets) and of data parallelism
  # end to end; OpenMP runs one thread (libgomp is not instrumented, its barriers would be reported)
  cmake --build "$BUILD" -j"$JOBS" --target test_dist test_data_parallel test_dp_train test_sync_batch_norm brigade
  export TSAN_OPTIONS="halt_on_error=1:exitcode=23:log_path=$logs/tsan:suppressions=$supp/tsan.supp"
  export OMP_NUM_THREADS=1
  TESTS=(-R '^dist_np|DataParallel|DpTrain|sync_batch_norm')
fi
# Suppressions name modules, and MPI_Finalize unloads Open MPI's components: a stack into an
# unloaded one reads "<unknown module>" for ASan, and TSan stops the process when a library a
# called_from_lib suppression matched is unloaded. keep_loaded.so (preloaded) makes dlclose do
# nothing, so every library stays mapped until exit.
cc -shared -fPIC -O2 -o "$BUILD/keep_loaded.so" scripts/sanitizers/keep_loaded.c
export LD_PRELOAD="$PWD/$BUILD/keep_loaded.so${LD_PRELOAD:+:$LD_PRELOAD}"
# the two-host test's ranks in the second namespace start from a clean environment (as over ssh):
# netns_mpirun.sh forwards these names to them
if [ "$KIND" = address ]; then san_env="ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS"; else san_env="TSAN_OPTIONS OMP_NUM_THREADS"; fi
export NETNS_MPIRUN_EXPORT="${NETNS_MPIRUN_EXPORT:+$NETNS_MPIRUN_EXPORT }LD_PRELOAD $san_env"
cd "$BUILD"
status=0
ctest --output-on-failure -j"$JOBS" --timeout 2400 "${TESTS[@]}" "$@" || status=$?
reports=$(find "$logs" -type f | wc -l)
echo "sanitize.sh $KIND: ctest status $status, $reports sanitizer report file(s) in $logs"
[ "$reports" -eq 0 ] || { for f in "$logs"/*; do echo "== $f"; head -40 "$f"; done; status=1; }
exit $status
