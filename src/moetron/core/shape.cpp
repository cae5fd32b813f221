#include "moetron/core/shape.h"

#include "moetron/core/error.h"

namespace moetron {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::dim(int i) const {
  const int j = i < 0 ? rank_ + i : i;
  MOETRON_CHECK(j >= 0 && j < rank_, "dimension ", i, " out of range for shape ", str());
  return dims_[static_cast<size_t>(j)];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

void Shape::push_back(int64_t d) {
  MOETRON_CHECK(rank_ < kMaxRank, "shape rank exceeds ", kMaxRank);
  MOETRON_CHECK(d >= 0, "negative dimension ", d);
  dims_[static_cast<size_t>(rank_++)] = d;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

}  // namespace moetron
