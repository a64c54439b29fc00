// Placeholder until the torch-compatible generator lands (see rng.h).
#include "brigade/core/rng.h"
