// Swaps whole directories between ranks in bounded memory: each rank sends
// the regular files of one directory to rank `to` while it receives rank
// `from`'s files into another, in chunks of at most `chunk_bytes`. Memory is
// two chunks whatever the directories' sizes (a snapshot part of a large
// model is gigabytes; packing it whole would double the rank's footprint).
// Used by ckpt/snapshot.cpp for the neighbour copies.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/comm/communicator.h"

namespace moetron::ckpt {

struct ExchangeStats {
  int64_t sent_bytes = 0, received_bytes = 0;
};

// Collective between the pairs (to, from) of every rank taking part (a
// ring: to = rank + 1, from = rank - 1). `into` must exist; the received
// files are written in it under their names, in place where it already has
// them (a recycled directory keeps its pages), and any other file in it is
// removed. An I/O error does not stop
// the transfer (the pair would wait forever): the rank finishes it, then
// throws naming the file; a receiver whose sender could not read its files
// throws too, naming the sender.
ExchangeStats exchange_directory(comm::Communicator& comm, const std::string& send_dir, int to,
                                 const std::string& into, int from,
                                 int64_t chunk_bytes = int64_t{64} << 20);

}  // namespace moetron::ckpt
