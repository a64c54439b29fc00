// The whole scalar oracle (every family's ops/ref/<family>.h), for the op harness.
#pragma once
#include "brigade/ops/ref/attention.h"
#include "brigade/ops/ref/cast.h"
#include "brigade/ops/ref/common.h"
#include "brigade/ops/ref/conv.h"
#include "brigade/ops/ref/dropout.h"
#include "brigade/ops/ref/elementwise.h"
#include "brigade/ops/ref/embedding.h"
#include "brigade/ops/ref/gemm.h"
#include "brigade/ops/ref/loss.h"
#include "brigade/ops/ref/norm.h"
#include "brigade/ops/ref/position.h"
#include "brigade/ops/ref/reduce.h"
