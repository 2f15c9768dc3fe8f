// Python's str semantics on UTF-8 text for the chat-template engine (jinja.h): code points for
// len() and indexing, Unicode whitespace as str.split() and str.strip() see it, case mapping
// (ICU), repr() quoting and str.splitlines().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data::jinja {

// The code points of `s` (a byte that is not well-formed UTF-8 counts as one code point).
std::vector<char32_t> decode_utf8(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode_utf8(const std::vector<char32_t>& cps, size_t begin, size_t end);
// The number of code points in `s`.
int64_t count_code_points(std::string_view s);
bool is_ascii(std::string_view s);

// str.isspace() of one code point (also what Python's regex \s matches).
bool is_space(char32_t c);
bool is_printable(char32_t c);  // str.isprintable(): what repr() leaves unescaped

std::string to_upper(std::string_view s);     // str.upper()
std::string to_lower(std::string_view s);     // str.lower()
std::string to_title(std::string_view s);     // str.title()
std::string capitalize(std::string_view s);   // str.capitalize()
std::string jinja_title(std::string_view s);  // the `title` filter (words split at -, space, ({[<)
bool is_lower(std::string_view s);            // str.islower()
bool is_upper(std::string_view s);            // str.isupper()
// str.isdigit(), isalpha(), isalnum(), isnumeric(), isdecimal(), isspace() by `which`.
bool is_class(std::string_view s, std::string_view which);

// str.strip/lstrip/rstrip: `chars` null strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit) and str.rsplit: `sep` null splits on runs of whitespace.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit,
                               bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);  // str.splitlines()
// str.replace(old, new, count); count < 0 replaces all.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
// str.find / rfind / count over [start, end) in code points; -1 when not found.
int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool right);
int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end);

// repr() of a str: quotes as Python picks them, escapes as Python writes them.
std::string quote(std::string_view s);
// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

}  // namespace strata::data::jinja
