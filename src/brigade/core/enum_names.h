// Small enums named by a table, value i by names[i]: enum_name gives a value's name and
// enum_from_name the value of a name, a ValueError "'<s>' is not a <what>; use <choices>" for
// any other string.
#pragma once
#include <cstddef>
#include <string_view>

#include "brigade/core/error.h"

namespace brigade {

template <class E, size_t N>
constexpr std::string_view enum_name(E e, const std::string_view (&names)[N]) {
  return names[size_t(e)];
}

template <class E, size_t N>
E enum_from_name(std::string_view s, const std::string_view (&names)[N], std::string_view what,
                 std::string_view choices) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return E(i);
  throw ValueError(fmt::format("'{}' is not a {}; use {}", s, what, choices));
}

}  // namespace brigade
