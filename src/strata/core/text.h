// Words for messages: case folding and the nearest spelling, for "did you mean" suggestions in the
// config parser and the command line; the time now, for records of a run.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

std::string lower(std::string_view s);  // ASCII lower case

// Edit distance (optimal string alignment, case-insensitive): insertion, deletion, substitution
// and transposition of adjacent characters each cost 1.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `word` by edit distance; "" when there are none.
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

// The time now in UTC, as strftime writes `format` (at most 63 bytes), e.g. kUtcMinute:
// "2026-12-05 07:25 UTC".
inline constexpr const char* kUtcMinute = "%Y-%m-%d %H:%M UTC";
std::string utc_now(const char* format);

}  // namespace strata
