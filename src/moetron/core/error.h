// Errors are exceptions that carry their context (file, key, rank, shape).
// Library code throws moetron::Error; only main() turns it into an exit code.
// what() is the sentence a user reads; where() is for the developer: the
// failed expression and the source location ([file:line]), which main()
// prints only in debug builds or with --verbose.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moetron {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string where = "")
      : std::runtime_error(what), where_(std::move(where)) {}
  // "check failed: <expression> [file.cpp:123]" (empty when thrown without one).
  const std::string& where() const { return where_; }

 private:
  std::string where_;
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

// Throws Error(msg) with where() = "check failed: <expr> [file:line]" (expr
// may be null).
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg,
                              const char* expr = nullptr);

}  // namespace moetron

// MOETRON_CHECK(cond, parts...) throws moetron::Error with the parts joined
// (and the expression and source location in where()). The condition is
// always evaluated (also NDEBUG).
#define MOETRON_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::moetron::throw_error(__FILE__, __LINE__, ::moetron::str_cat(__VA_ARGS__), #cond); \
    }                                                                                     \
  } while (0)

#define MOETRON_FAIL(...) \
  ::moetron::throw_error(__FILE__, __LINE__, ::moetron::str_cat(__VA_ARGS__))
