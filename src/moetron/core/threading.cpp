#include "moetron/core/threading.h"

#include <omp.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

namespace moetron {

void set_flush_denormals_this_thread() {
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

void init_compute_threads(int num_threads) {
  if (num_threads > 0) omp_set_num_threads(num_threads);
  set_flush_denormals_this_thread();
#pragma omp parallel
  set_flush_denormals_this_thread();
}

int num_compute_threads() {
  return omp_get_max_threads();
}

}  // namespace moetron
