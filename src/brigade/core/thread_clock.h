// The CPU seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID: user and system time,
// the kernel's copies on its behalf included), for timing work by the CPU it takes rather than
// by the wall clock.
#pragma once
#include <time.h>

namespace brigade {

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace brigade
