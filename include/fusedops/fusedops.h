// Umbrella header of the fusedops C++ API.
#pragma once

#include "fusedops/core/check.h"
#include "fusedops/core/context.h"
#include "fusedops/core/dtype.h"
#include "fusedops/core/error.h"
#include "fusedops/core/registry.h"
#include "fusedops/core/tensor.h"
#include "fusedops/ops/causal_conv1d.h"
#include "fusedops/ops/l2norm.h"
#include "fusedops/ops/rmsnorm.h"
#include "fusedops/ops/cross_entropy.h"
#include "fusedops/ops/chunk_loss.h"
#include "fusedops/ops/sort_chunks.h"
#include "fusedops/ops/matmul_add.h"
#include "fusedops/ops/clipped_swiglu.h"
#include "fusedops/ops/mhc.h"
#include "fusedops/ops/gated_delta_rule.h"
