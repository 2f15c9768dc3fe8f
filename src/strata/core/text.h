// Words for messages: case folding and the nearest spelling, for "did you mean" suggestions in the
// config parser and the command line.
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

}  // namespace strata
