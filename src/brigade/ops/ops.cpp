// The backend switch (ops.h). Every op's front-end is in ops/<family>.cpp.
#include "brigade/ops/ops.h"

namespace brigade::ops {

namespace {
thread_local Backend t_backend = Backend::Cpu;
}  // namespace

Backend current_backend() { return t_backend; }
void set_backend(Backend b) { t_backend = b; }

}  // namespace brigade::ops
