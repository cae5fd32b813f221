// Pieces of a tensor in checkpoint files: each rank writes what it holds and
// a reader of any layout cuts what it needs from whatever pieces were saved.
// A piece is
//  - a tensor-parallel block: rows [row0, row0 + rows) x columns
//    [col0, col0 + cols) of a [R, C] tensor, saved in its [rows, cols] shape
//    (metadata "block:row0,col0,R,C");
//  - a flat range [offset, offset + n) of a block's row-major elements,
//    saved 1-D (ZeRO-1 chunks of a tp block; "block:row0,col0,R,C,rows,cols,offset");
//  - a flat range [offset, offset + n) of the row-major flattened tensor of
//    `total` elements (ZeRO-1 chunks; "offset,total"), or of a tensor of the
//    shape it names (ZeRO-1 chunks of master weights, so an export can
//    assemble them; "flat:offset,d0,d1,...").
// A tensor without metadata is whole. Every kind reduces to row-major runs of
// the flattened full tensor, so any piece can be copied into any other.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moetron/ckpt/safetensors.h"
#include "moetron/core/tensor.h"

namespace moetron::ckpt {

struct Piece {
  int64_t total = 0;      // elements of the full tensor
  int64_t full_cols = 0;  // C of a block's [R, C] full tensor (0: a flat range of the full tensor)
  int64_t row0 = 0, col0 = 0, rows = 0, cols = 0;  // the block
  // Elements [offset, offset + count) of the block's row-major order (of
  // the full tensor's for a flat range).
  int64_t offset = 0, count = 0;
  Shape shape;  // a flat range's full shape where it records it (rank 0: not recorded)

  static Piece whole(int64_t numel) { return flat(0, numel, numel); }
  static Piece flat(int64_t offset, int64_t n, int64_t total);
  static Piece block(const Shape& full, int64_t row0, int64_t col0, const Shape& local);
  // Elements [offset, offset + n) of that block.
  static Piece block_range(const Shape& full, int64_t row0, int64_t col0, const Shape& local,
                           int64_t offset, int64_t n);
  bool is_block() const { return full_cols > 0; }
  bool whole_block() const { return is_block() && offset == 0 && count == rows * cols; }
  int64_t numel() const { return count; }
  // The metadata string ("" for a whole tensor).
  std::string metadata() const;
  // Reads back the piece a saved tensor of shape `saved` holds; `meta`
  // absent: the whole tensor. Errors name `what`.
  static Piece parse(const std::optional<std::string>& meta, const Shape& saved,
                     const std::string& what);
};

// Copies the elements `src` (laid out as piece `sp`) shares with `dst`
// (piece `dp`) of the same full tensor, converting the dtype where they
// differ; returns how many. The pieces must describe the same full tensor.
int64_t copy_overlap(const Piece& sp, const Tensor& src, const Piece& dp, const Tensor& dst);

// Saved pieces of every tensor name across a checkpoint's files.
class PieceIndex {
 public:
  explicit PieceIndex(const std::vector<std::string>& paths);
  bool contains(const std::string& name) const { return pieces_.count(name) != 0; }
  // The dtype the first saved piece of `name` has.
  DType dtype(const std::string& name) const;
  // Shape of the full tensor (a block's [R, C], else the saved tensor's shape).
  Shape full_shape(const std::string& name) const;
  // Fills `dst` (piece `want` of tensor `name`, whose full shape is `full`)
  // from the saved pieces, converting the dtype; every element must be
  // covered exactly once. Errors name the tensor and the file.
  void read(const std::string& name, const Shape& full, const Piece& want, const Tensor& dst) const;
  std::vector<std::string> names() const;

 private:
  struct Saved {
    SafetensorsReader* file;
    Piece piece;
  };
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::vector<Saved>> pieces_;
};

}  // namespace moetron::ckpt
