#include "moetron/core/error.h"

#include <cstring>

namespace moetron {

void throw_error(const char* file, int line, const std::string& msg, const char* expr) {
  const char* base = std::strrchr(file, '/');
  const std::string at = str_cat("[", base ? base + 1 : file, ":", line, "]");
  throw Error(msg, expr ? str_cat("check failed: ", expr, " ", at) : at);
}

}  // namespace moetron
