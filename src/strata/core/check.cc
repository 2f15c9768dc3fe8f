#include "strata/core/check.h"

namespace strata::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(concat(file, ":", line, ": ", msg));
}

void throw_input_error(const std::string& msg) {
  throw InputError(msg);
}

void throw_runtime_error(const std::string& msg) {
  throw Error(msg);
}

}  // namespace strata::detail
