#include "moetron/ckpt/pieces.h"

#include <algorithm>

#include "moetron/core/error.h"
#include "moetron/kernels/elementwise.h"

namespace moetron::ckpt {

Piece Piece::flat(int64_t offset, int64_t n, int64_t total) {
  Piece p;
  p.total = total;
  p.offset = offset;
  p.cols = n;
  return p;
}

Piece Piece::block(const Shape& full, int64_t row0, int64_t col0, const Shape& local) {
  MOETRON_CHECK(full.rank() == 2 && local.rank() == 2, "a checkpoint block needs 2-D shapes, got ", full.str(),
                " and ", local.str());
  Piece p;
  p.total = full[0] * full[1];
  p.full_cols = full[1];
  p.row0 = row0;
  p.col0 = col0;
  p.rows = local[0];
  p.cols = local[1];
  return p;
}

std::string Piece::metadata() const {
  if (full_cols > 0) {
    return "block:" + std::to_string(row0) + "," + std::to_string(col0) + "," + std::to_string(total / full_cols) +
           "," + std::to_string(full_cols);
  }
  if (offset == 0 && cols == total) return "";
  return std::to_string(offset) + "," + std::to_string(total);
}

Piece Piece::parse(const std::optional<std::string>& meta, int64_t numel, const std::string& what) {
  if (!meta || meta->empty()) return whole(numel);
  std::vector<int64_t> v;
  const std::string body = meta->rfind("block:", 0) == 0 ? meta->substr(6) : *meta;
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
  if (meta->rfind("block:", 0) == 0) {
    MOETRON_CHECK(v.size() == 4 && v[0] >= 0 && v[1] >= 0 && v[2] > 0 && v[3] > 0, what, ": bad block description '",
                  *meta, "'");
    Piece p;
    p.total = v[2] * v[3];
    p.full_cols = v[3];
    p.row0 = v[0];
    p.col0 = v[1];
    // A block's local columns follow from its numel and rows; the saved
    // tensor's shape gives them (checked against the full tensor below).
    return p;
  }
  MOETRON_CHECK(v.size() == 2 && v[0] >= 0 && v[0] + numel <= v[1], what, ": bad element range '", *meta,
                "' for ", numel, " elements");
  return flat(v[0], numel, v[1]);
}

namespace {

// Row-major runs of the full tensor a piece covers, in order: (full start, length).
struct Runs {
  const Piece& p;
  int64_t count() const { return p.full_cols > 0 ? p.rows : 1; }
  int64_t start(int64_t i) const { return p.full_cols > 0 ? (p.row0 + i) * p.full_cols + p.col0 : p.offset; }
  int64_t length() const { return p.cols; }
};

}  // namespace

int64_t copy_overlap(const Piece& sp, const Tensor& src, const Piece& dp, const Tensor& dst) {
  MOETRON_CHECK(sp.total == dp.total, "copying between pieces of tensors of ", sp.total, " and ", dp.total,
                " elements");
  const Tensor s = src.reshape({src.numel()}), d = dst.reshape({dst.numel()});
  kernels::Context conv(kernels::Backend::reference);
  const Runs a{sp}, b{dp};
  int64_t copied = 0;
  // Both run lists ascend through the flattened tensor: one merge pass.
  for (int64_t i = 0, j = 0; i < a.count() && j < b.count();) {
    const int64_t a0 = a.start(i), a1 = a0 + a.length(), b0 = b.start(j), b1 = b0 + b.length();
    const int64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
    if (lo < hi) {
      const Tensor from = s.slice(i * a.length() + (lo - a0), i * a.length() + (hi - a0));
      const Tensor to = d.slice(j * b.length() + (lo - b0), j * b.length() + (hi - b0));
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
      const Shape shape = f->shape(name);
      Piece p = Piece::parse(meta, shape.numel(), "'" + path + "', tensor '" + name + "'");
      if (p.full_cols > 0) {
        MOETRON_CHECK(shape.rank() == 2 && p.row0 + shape[0] <= p.total / p.full_cols &&
                          p.col0 + shape[1] <= p.full_cols,
                      "'", path, "': block ", shape.str(), " of tensor '", name, "' lies outside its full tensor");
        p.rows = shape[0];
        p.cols = shape[1];
      }
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
  if (s.piece.full_cols > 0) return Shape({s.piece.total / s.piece.full_cols, s.piece.full_cols});
  MOETRON_CHECK(s.piece.cols == s.piece.total, "'", s.file->path(), "': tensor '", name,
                "' is a flat range; its full shape is not stored");
  return s.file->shape(name);
}

void PieceIndex::read(const std::string& name, const Shape& full, const Piece& want, const Tensor& dst) const {
  const auto it = pieces_.find(name);
  MOETRON_CHECK(it != pieces_.end(), "checkpoint has no tensor '", name, "'");
  int64_t filled = 0;
  for (const Saved& s : it->second) {
    const bool whole = s.piece.full_cols == 0 && s.piece.offset == 0 && s.piece.cols == s.piece.total;
    const Shape saved = whole ? s.file->shape(name)
                              : s.piece.full_cols > 0 ? Shape({s.piece.total / s.piece.full_cols, s.piece.full_cols})
                                                      : full;
    MOETRON_CHECK(s.piece.total == want.total && saved == full, "'", s.file->path(), "': tensor '", name, "' is ",
                  saved.str(), " (", s.piece.total, " elements), the model expects ", full.str(),
                  " (saved from another model?)");
    filled += copy_overlap(s.piece, s.file->view(name), want, dst);
  }
  MOETRON_CHECK(filled == want.numel(), "checkpoint pieces of tensor '", name, "' cover ", filled, " of the ",
                want.numel(), " elements this rank needs (overlapping or missing pieces)");
}

}  // namespace moetron::ckpt
