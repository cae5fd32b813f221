#include "moetron/ckpt/pieces.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::ckpt {

Piece Piece::flat(int64_t offset, int64_t n, int64_t total) {
  Piece p;
  p.total = total;
  p.offset = offset;
  p.count = n;
  return p;
}

Piece Piece::block(const Shape& full, int64_t row0, int64_t col0, const Shape& local) {
  MOETRON_CHECK(local.rank() == 2, "a checkpoint block needs a 2-D shape, got ", local.str());
  return block_range(full, row0, col0, local, 0, local.numel());
}

Piece Piece::block_range(const Shape& full, int64_t row0, int64_t col0, const Shape& local,
                         int64_t offset, int64_t n) {
  MOETRON_CHECK(full.rank() == 2 && local.rank() == 2, "a checkpoint block needs 2-D shapes, got ",
                full.str(), " and ", local.str());
  MOETRON_CHECK(row0 >= 0 && col0 >= 0 && row0 + local[0] <= full[0] && col0 + local[1] <= full[1],
                "block ", local.str(), " at (", row0, ", ", col0, ") lies outside its full tensor ",
                full.str());
  MOETRON_CHECK(offset >= 0 && n >= 0 && offset + n <= local.numel(), "elements [", offset, ", ",
                offset + n, ") lie outside the block ", local.str());
  Piece p;
  p.total = full[0] * full[1];
  p.full_cols = full[1];
  p.row0 = row0;
  p.col0 = col0;
  p.rows = local[0];
  p.cols = local[1];
  p.offset = offset;
  p.count = n;
  return p;
}

std::string Piece::metadata() const {
  if (is_block()) {
    const std::string m =
        str_cat("block:", row0, ",", col0, ",", total / full_cols, ",", full_cols);
    return whole_block() ? m : str_cat(m, ",", rows, ",", cols, ",", offset);
  }
  if (offset == 0 && count == total) return "";
  if (shape.rank() == 0) return str_cat(offset, ",", total);
  std::string m = str_cat("flat:", offset);
  for (int d = 0; d < shape.rank(); ++d) m += str_cat(",", shape[d]);
  return m;
}

Piece Piece::parse(const std::optional<std::string>& meta, const Shape& saved,
                   const std::string& what) {
  const int64_t numel = saved.numel();
  if (!meta || meta->empty()) return whole(numel);
  std::vector<int64_t> v;
  const bool is_block = meta->rfind("block:", 0) == 0, has_shape = meta->rfind("flat:", 0) == 0;
  const std::string body = is_block ? meta->substr(6) : has_shape ? meta->substr(5) : *meta;
  try {
    size_t pos = 0;
    while (pos <= body.size()) {
      const size_t comma = body.find(',', pos);
      v.push_back(std::stoll(body.substr(pos, comma - pos)));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  } catch (const std::exception&) {
    MOETRON_FAIL(what, ": cannot read the piece description '", *meta, "'");
  }
  if (is_block) {
    MOETRON_CHECK((v.size() == 4 || v.size() == 7) && v[2] > 0 && v[3] > 0, what,
                  ": bad block description '", *meta, "'");
    try {
      if (v.size() == 4) {  // a whole block, in its own shape
        MOETRON_CHECK(saved.rank() == 2, "a whole block is saved 2-D, this one is ", saved.str());
        return block(Shape({v[2], v[3]}), v[0], v[1], saved);
      }
      MOETRON_CHECK(v[4] > 0 && v[5] > 0, "bad block shape");
      return block_range(Shape({v[2], v[3]}), v[0], v[1], Shape({v[4], v[5]}), v[6], numel);
    } catch (const Error& e) {
      MOETRON_FAIL(what, ": piece '", *meta, "' of a saved ", saved.str(), ": ", e.what());
    }
  }
  if (has_shape) {
    MOETRON_CHECK(v.size() >= 2, what, ": bad element range '", *meta, "'");
    Shape full(v.begin() + 1, v.end());
    bool dims_ok = true;
    for (int d = 0; d < full.rank(); ++d) dims_ok = dims_ok && full[d] > 0;
    MOETRON_CHECK(dims_ok && v[0] >= 0 && v[0] + numel <= full.numel(), what,
                  ": bad element range '", *meta, "' for ", numel, " elements");
    Piece p = flat(v[0], numel, full.numel());
    p.shape = full;
    return p;
  }
  MOETRON_CHECK(v.size() == 2 && v[0] >= 0 && v[0] + numel <= v[1], what, ": bad element range '",
                *meta, "' for ", numel, " elements");
  return flat(v[0], numel, v[1]);
}

namespace {

// Row-major runs of the full tensor a piece covers, in ascending order: run i
// starts at full element start(i) and at piece element local(i).
struct Runs {
  const Piece& p;
  int64_t first_row() const { return p.offset / p.cols; }
  int64_t count() const {
    if (!p.is_block()) return 1;
    return p.count == 0 ? 0 : (p.offset + p.count - 1) / p.cols - first_row() + 1;
  }
  // Elements [b0, b1) of the block's row-major order in run i.
  int64_t b0(int64_t i) const { return std::max(p.offset, (first_row() + i) * p.cols); }
  int64_t b1(int64_t i) const {
    return std::min(p.offset + p.count, (first_row() + i + 1) * p.cols);
  }
  int64_t start(int64_t i) const {
    if (!p.is_block()) return p.offset;
    const int64_t r = first_row() + i;
    return (p.row0 + r) * p.full_cols + p.col0 + (b0(i) - r * p.cols);
  }
  int64_t local(int64_t i) const { return p.is_block() ? b0(i) - p.offset : 0; }
  int64_t length(int64_t i) const { return p.is_block() ? b1(i) - b0(i) : p.count; }
};

}  // namespace

int64_t copy_overlap(const Piece& sp, const Tensor& src, const Piece& dp, const Tensor& dst) {
  MOETRON_CHECK(sp.total == dp.total, "copying between pieces of tensors of ", sp.total, " and ",
                dp.total, " elements");
  const Tensor s = src.reshape({src.numel()}), d = dst.reshape({dst.numel()});
  kernels::Context conv(kernels::Backend::reference);
  const Runs a{sp}, b{dp};
  int64_t copied = 0;
  // Both run lists ascend through the flattened tensor: one merge pass.
  for (int64_t i = 0, j = 0, na = a.count(), nb = b.count(); i < na && j < nb;) {
    const int64_t a0 = a.start(i), a1 = a0 + a.length(i), b0 = b.start(j), b1 = b0 + b.length(j);
    const int64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
    if (lo < hi) {
      const Tensor from = s.slice(a.local(i) + (lo - a0), a.local(i) + (hi - a0));
      const Tensor to = d.slice(b.local(j) + (lo - b0), b.local(j) + (hi - b0));
      if (from.dtype() == to.dtype()) {
        to.copy_from(from);
      } else {
        kernels::convert(conv, from, to);
      }
      copied += hi - lo;
    }
    if (a1 <= b1) {
      ++i;
    } else {
      ++j;
    }
  }
  return copied;
}

PieceIndex::PieceIndex(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    files_.push_back(std::make_unique<SafetensorsReader>(path));
    SafetensorsReader* f = files_.back().get();
    for (const std::string& name : f->names()) {
      const auto it = f->metadata().find(name);
      const std::optional<std::string> meta =
          it == f->metadata().end() ? std::nullopt : std::optional<std::string>(it->second);
      const Piece p = Piece::parse(meta, f->shape(name), "'" + path + "', tensor '" + name + "'");
      pieces_[name].push_back({f, p});
    }
  }
}

std::vector<std::string> PieceIndex::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : pieces_) out.push_back(name);
  return out;
}

DType PieceIndex::dtype(const std::string& name) const {
  const auto it = pieces_.find(name);
  MOETRON_CHECK(it != pieces_.end(), "checkpoint has no tensor '", name, "'");
  return it->second.front().file->dtype(name);
}

Shape PieceIndex::full_shape(const std::string& name) const {
  const auto it = pieces_.find(name);
  MOETRON_CHECK(it != pieces_.end(), "checkpoint has no tensor '", name, "'");
  const Saved& s = it->second.front();
  if (s.piece.is_block()) return Shape({s.piece.total / s.piece.full_cols, s.piece.full_cols});
  if (s.piece.shape.rank() > 0) return s.piece.shape;
  MOETRON_CHECK(s.piece.count == s.piece.total, "'", s.file->path(), "': tensor '", name,
                "' is a flat range; its full shape is not stored");
  return s.file->shape(name);
}

void PieceIndex::read(const std::string& name, const Shape& full, const Piece& want,
                      const Tensor& dst) const {
  const auto it = pieces_.find(name);
  MOETRON_CHECK(it != pieces_.end(), "checkpoint has no tensor '", name, "'");
  int64_t filled = 0;
  for (const Saved& s : it->second) {
    const bool whole = !s.piece.is_block() && s.piece.offset == 0 && s.piece.count == s.piece.total;
    const Shape saved = whole ? s.file->shape(name)
                        : s.piece.is_block()
                            ? Shape({s.piece.total / s.piece.full_cols, s.piece.full_cols})
                        : s.piece.shape.rank() > 0 ? s.piece.shape
                                                   : full;
    MOETRON_CHECK(s.piece.total == want.total && saved == full, "'", s.file->path(), "': tensor '",
                  name, "' is ", saved.str(), " (", s.piece.total, " elements), the model expects ",
                  full.str(), " (saved from another model?)");
    filled += copy_overlap(s.piece, s.file->view(name), want, dst);
  }
  MOETRON_CHECK(filled == want.numel(), "checkpoint pieces of tensor '", name, "' cover ", filled,
                " of the ", want.numel(),
                " elements this rank needs (overlapping or missing pieces)");
}

}  // namespace moetron::ckpt
