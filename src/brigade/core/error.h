// One exception hierarchy for the whole engine. Every user-facing message says
// what was wrong, where (file, key, tensor, rank) and what to do about it.
// Not for internal invariants that users cannot cause: those are InternalError.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace brigade {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// clang-format off
class ConfigError : public Error { using Error::Error; };      // recipe / CLI input
class DataError : public Error { using Error::Error; };        // corpus / token files
class CheckpointError : public Error { using Error::Error; };  // safetensors / train state
class ShapeError : public Error { using Error::Error; };       // tensor shapes / dtypes
class ValueError : public Error { using Error::Error; };       // bad argument values
class IoError : public Error { using Error::Error; };          // files that cannot be read or written
class InternalError : public Error { using Error::Error; };    // a bug in Brigade
// clang-format on

}  // namespace brigade

// BRIGADE_CHECK(cond, ErrorType, "fmt {}", args...): throw ErrorType if cond is false.
#define BRIGADE_CHECK(cond, ErrType, ...)                            \
  do {                                                               \
    if (!(cond)) throw ::brigade::ErrType(fmt::format(__VA_ARGS__)); \
  } while (0)

// Internal invariant: names the source location, for bugs rather than user errors.
#define BRIGADE_ASSERT(cond, ...)                                                                                \
  do {                                                                                                           \
    if (!(cond))                                                                                                 \
      throw ::brigade::InternalError(                                                                            \
          fmt::format("internal error at {}:{}: {} ({})", __FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__))); \
  } while (0)
