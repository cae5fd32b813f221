#include "moetron/core/error.h"

#include <cstring>

namespace moetron {

void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(str_cat(msg, " [", base ? base + 1 : file, ":", line, "]"));
}

}  // namespace moetron
