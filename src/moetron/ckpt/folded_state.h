// Per-rank state that matters only through its sum over a group, such as
// error-feedback residuals (the gradient each rank has not sent yet; the
// reduction sums over the group). A rank saves its part under "BASE#i", i
// being its index in the group. A group of another size (an elastic resize
// of dp) loads it by folding: rank j adds every saved "BASE#i" with
// i % size == j. Each saved part lands on exactly one rank, so every group's
// sum is kept; at the same size each rank gets exactly its own part back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::ckpt {

// The name a rank saves its part of BASE under.
std::string folded_name(const std::string& base, int index);

struct FoldTarget {
  std::vector<std::string> bases;  // saved names (less "#i") whose parts add into `values`
  Tensor values;                   // f32, 1-D: the whole local tensor (pieces are ranges of it)
};

// Adds into each target (not cleared first) the parts that fold onto group
// index `index` of `size`, from every optimizer file of checkpoint `dir`
// (whose manifest was verified). Returns how many saved parts were added.
// A part of another length than its target is an error naming file and tensor.
int64_t load_folded(const std::string& dir, const std::vector<FoldTarget>& targets, int index,
                    int size);

}  // namespace moetron::ckpt
