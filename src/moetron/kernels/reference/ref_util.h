// Helpers for the reference backend: every input is read into doubles, the
// math runs in double, and results are rounded once into the output dtype.
// Slow and obviously correct on purpose: this backend is the test oracle.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::kernels::reference {

// Any float dtype (f32, bf16, f16, f64) or integer dtype, element i as double.
double load(const Tensor& t, int64_t i);
std::vector<double> load_all(const Tensor& t);
// Rounds v into element i of a float tensor (round to nearest even).
void store(const Tensor& t, int64_t i, double v);
// store(), except into a bf16 tensor (a bf16 master weight): v rounded to
// fp32 first, as the fp32 backends hold it, then stochastically to bf16
// with element i's bits under `key` (kernels/stochastic_round.h).
void store_master(const Tensor& t, int64_t i, double v, uint32_t key);
void store_all(const Tensor& t, const std::vector<double>& v);
// Reads integer ids (i32 or i64) as int64.
std::vector<int64_t> load_ids(const Tensor& t);

}  // namespace moetron::kernels::reference
