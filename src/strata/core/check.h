// Errors and checks. Two kinds of failure, because the CLI maps them to different exit codes:
//   InputError — the user's input is wrong (config, data file, command line): exit 2.
//   Error      — anything else that went wrong at run time: exit 1.
// What a user can cause and fix (bad input, out of memory, a full disk) is a sentence saying what
// to change, without a source location: STRATA_INPUT_CHECK / STRATA_INPUT_FAIL and
// STRATA_RUNTIME_FAIL. Only a broken invariant (STRATA_CHECK / STRATA_FAIL), a bug to report,
// carries file:line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InputError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_input_error(const std::string& msg);
[[noreturn]] void throw_runtime_error(const std::string& msg);
}  // namespace detail

}  // namespace strata

// Internal invariant or runtime failure: throws strata::Error with file:line.
#define STRATA_CHECK(cond, ...)                                                                    \
  do {                                                                                             \
    if (!(cond)) [[unlikely]] {                                                                    \
      ::strata::detail::throw_error(                                                               \
          __FILE__, __LINE__, ::strata::detail::concat("check failed: " #cond ": ", __VA_ARGS__)); \
    }                                                                                              \
  } while (0)

// Bad user input: throws strata::InputError whose message is exactly the sentence given.
#define STRATA_INPUT_CHECK(cond, ...)                                             \
  do {                                                                            \
    if (!(cond)) [[unlikely]] {                                                   \
      ::strata::detail::throw_input_error(::strata::detail::concat(__VA_ARGS__)); \
    }                                                                             \
  } while (0)

#define STRATA_FAIL(...) \
  ::strata::detail::throw_error(__FILE__, __LINE__, ::strata::detail::concat(__VA_ARGS__))
#define STRATA_INPUT_FAIL(...) \
  ::strata::detail::throw_input_error(::strata::detail::concat(__VA_ARGS__))
// A run-time failure the user can act on (out of memory, a disk full): throws strata::Error whose
// message is exactly the sentence given.
#define STRATA_RUNTIME_FAIL(...) \
  ::strata::detail::throw_runtime_error(::strata::detail::concat(__VA_ARGS__))
