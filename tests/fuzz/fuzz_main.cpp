// libFuzzer's entry point for one target, chosen at compile time (BRIGADE_FUZZ_TARGET, e.g.
// brigade::fuzz::safetensors); built by scripts/fuzz.sh with clang's -fsanitize=fuzzer.
#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return BRIGADE_FUZZ_TARGET(data, size); }
