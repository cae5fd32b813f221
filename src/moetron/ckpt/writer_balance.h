// Which replica writes each replicated tensor to a checkpoint or snapshot.
// Every replica holds the same tensors, so any one can write each; putting
// them all on the first makes it write the whole state while the others wait
// (dp 4 without ZeRO on the demo config: rank 0 wrote 110 MB of each
// snapshot, the others almost nothing). Spread by size instead, each replica
// writes about 1/n of it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moetron::ckpt {

// Largest first, onto the replica with the fewest elements so far (ties:
// the lowest index, and equal sizes keep their order): the same answer on
// every replica given the same list. Returns each name's replica in [0, replicas).
std::unordered_map<std::string, int> balance_writers(
    const std::vector<std::pair<std::string, int64_t>>& sizes, int replicas);

}  // namespace moetron::ckpt
