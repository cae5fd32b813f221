// Errors are exceptions that carry their context (file, key, rank, shape).
// Library code throws moetron::Error; only main() turns it into an exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moetron {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append_all(os, rest...);
}
}  // namespace detail

// Concatenates its arguments with operator<< into one message.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::append_all(os, args...);
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

}  // namespace moetron

// MOETRON_CHECK(cond, parts...) throws moetron::Error with the parts joined
// and the source location. The condition is always evaluated (also NDEBUG).
#define MOETRON_CHECK(cond, ...)                                                            \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ::moetron::throw_error(__FILE__, __LINE__,                                            \
                             ::moetron::str_cat("check failed: " #cond ": ", __VA_ARGS__)); \
    }                                                                                       \
  } while (0)

#define MOETRON_FAIL(...) \
  ::moetron::throw_error(__FILE__, __LINE__, ::moetron::str_cat(__VA_ARGS__))
