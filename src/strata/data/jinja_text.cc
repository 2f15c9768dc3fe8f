#include "strata/data/jinja_text.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>

#include "strata/data/jinja_value.h"

namespace strata::data::jinja {

std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    char32_t cp = n == 0 ? b : n == 1 ? (b & 0x1f) : n == 2 ? (b & 0x0f) : (b & 0x07);
    bool ok = n >= 0 && i + size_t(n) < s.size();
    for (int k = 1; ok && k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((c >> 6) != 2) ok = false;
      cp = (cp << 6) | (c & 0x3f);
    }
    if (!ok) {
      out.push_back(b);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += size_t(n) + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xc0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xe0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(char(0xf0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  }
}

std::string encode_utf8(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

int64_t count_code_points(std::string_view s) {
  if (is_ascii(s)) return int64_t(s.size());
  return int64_t(decode_utf8(s).size());
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(UChar32(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

namespace {

enum class CaseOp { kUpper, kLower, kTitle };

// ICU's full (string) case mapping, root locale: what Python's str methods do.
std::string map_case(std::string_view s, CaseOp op) {
  if (s.empty()) return {};
  UErrorCode err = U_ZERO_ERROR;
  int32_t n16 = 0;
  u_strFromUTF8WithSub(nullptr, 0, &n16, s.data(), int32_t(s.size()), 0xfffd, nullptr, &err);
  std::u16string in(size_t(n16), u'\0');
  err = U_ZERO_ERROR;
  u_strFromUTF8WithSub(in.data(), n16, nullptr, s.data(), int32_t(s.size()), 0xfffd, nullptr, &err);
  std::u16string mapped(in.size() * 3 + 4, u'\0');
  err = U_ZERO_ERROR;
  int32_t m = 0;
  if (op == CaseOp::kUpper) {
    m = u_strToUpper(mapped.data(), int32_t(mapped.size()), in.data(), n16, "", &err);
  } else if (op == CaseOp::kLower) {
    m = u_strToLower(mapped.data(), int32_t(mapped.size()), in.data(), n16, "", &err);
  } else {
    m = u_strToTitle(mapped.data(), int32_t(mapped.size()), in.data(), n16, nullptr, "", &err);
  }
  if (U_FAILURE(err)) fail("cannot change the case of a string (ICU error)");
  int32_t n8 = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &n8, mapped.data(), m, &err);
  std::string out(size_t(n8), '\0');
  err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), n8, nullptr, mapped.data(), m, &err);
  return out;
}

std::string map_one(char32_t c, CaseOp op) {
  std::string s;
  append_utf8(s, c);
  return map_case(s, op);
}

bool has_property(char32_t c, UProperty p) {
  return u_hasBinaryProperty(UChar32(c), p);
}

}  // namespace

std::string to_upper(std::string_view s) {
  return map_case(s, CaseOp::kUpper);
}
std::string to_lower(std::string_view s) {
  return map_case(s, CaseOp::kLower);
}

std::string to_title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : decode_utf8(s)) {
    out += map_one(c, previous_cased ? CaseOp::kLower : CaseOp::kTitle);
    previous_cased = has_property(c, UCHAR_CASED);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  const std::vector<char32_t> cps = decode_utf8(s);
  if (cps.empty()) return {};
  return map_one(cps[0], CaseOp::kTitle) + to_lower(encode_utf8(cps, 1, cps.size()));
}

std::string jinja_title(std::string_view s) {
  auto is_delim = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
  };
  const std::vector<char32_t> cps = decode_utf8(s);
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    if (is_delim(cps[i])) {
      while (j < cps.size() && is_delim(cps[j])) ++j;
      out += encode_utf8(cps, i, j);
    } else {
      while (j < cps.size() && !is_delim(cps[j])) ++j;
      out += map_one(cps[i], CaseOp::kUpper) + to_lower(encode_utf8(cps, i + 1, j));
    }
    i = j;
  }
  return out;
}

bool is_lower(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (has_property(c, UCHAR_UPPERCASE) || u_charType(UChar32(c)) == U_TITLECASE_LETTER) {
      return false;
    }
    if (has_property(c, UCHAR_LOWERCASE)) cased = true;
  }
  return cased;
}

bool is_upper(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (has_property(c, UCHAR_LOWERCASE) || u_charType(UChar32(c)) == U_TITLECASE_LETTER) {
      return false;
    }
    if (has_property(c, UCHAR_UPPERCASE)) cased = true;
  }
  return cased;
}

bool is_class(std::string_view s, std::string_view which) {
  if (s.empty()) return false;
  for (char32_t c : decode_utf8(s)) {
    const auto numeric = u_getIntPropertyValue(UChar32(c), UCHAR_NUMERIC_TYPE);
    const bool decimal = numeric == U_NT_DECIMAL;
    const bool digit = decimal || numeric == U_NT_DIGIT;
    const bool number = digit || numeric == U_NT_NUMERIC;
    const auto type = u_charType(UChar32(c));
    const bool alpha = type == U_UPPERCASE_LETTER || type == U_LOWERCASE_LETTER ||
                       type == U_TITLECASE_LETTER || type == U_MODIFIER_LETTER ||
                       type == U_OTHER_LETTER;
    bool ok = false;
    if (which == "isdigit") ok = digit;
    if (which == "isdecimal") ok = decimal;
    if (which == "isnumeric") ok = number;
    if (which == "isalpha") ok = alpha;
    if (which == "isalnum") ok = alpha || number;
    if (which == "isspace") ok = is_space(c);
    if (!ok) return false;
  }
  return true;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = decode_utf8(s);
  std::vector<char32_t> set;
  if (chars != nullptr) set = decode_utf8(*chars);
  auto strips = [&](char32_t c) {
    return chars == nullptr ? is_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strips(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strips(cps[e - 1])) --e;
  }
  return encode_utf8(cps, b, e);
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep != nullptr) {
    if (sep->empty()) fail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit-- > 0) {
        const size_t hit = s.find(*sep, pos);
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      out.emplace_back(s.substr(pos));
      return out;
    }
    size_t end = s.size();
    while (maxsplit-- > 0 && end >= sep->size()) {
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::vector<char32_t> cps = decode_utf8(s);
  const size_t n = cps.size();
  if (!from_right) {
    size_t i = 0;
    while (maxsplit-- > 0) {
      while (i < n && is_space(cps[i])) ++i;
      if (i == n) break;
      const size_t j = i;
      while (i < n && !is_space(cps[i])) ++i;
      out.push_back(encode_utf8(cps, j, i));
    }
    while (i < n && is_space(cps[i])) ++i;
    if (i < n) out.push_back(encode_utf8(cps, i, n));
    return out;
  }
  size_t i = n;
  while (maxsplit-- > 0) {
    while (i > 0 && is_space(cps[i - 1])) --i;
    if (i == 0) break;
    const size_t j = i;
    while (i > 0 && !is_space(cps[i - 1])) --i;
    out.push_back(encode_utf8(cps, i, j));
  }
  while (i > 0 && is_space(cps[i - 1])) --i;
  if (i > 0) out.push_back(encode_utf8(cps, 0, i));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  const std::vector<char32_t> cps = decode_utf8(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                     c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
    out.push_back(encode_utf8(cps, start, keepends ? eol : i));
    start = i = eol;
  }
  if (start < cps.size()) out.push_back(encode_utf8(cps, start, cps.size()));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    const std::vector<char32_t> cps = decode_utf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count > 0) {
        out += with;
        --count;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  while (count > 0) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(with);
    pos = hit + old.size();
    --count;
  }
  out.append(s.substr(pos));
  return out;
}

namespace {

// Byte offsets of the code points of s, and one past the end.
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> off;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) off.push_back(i);
  }
  off.push_back(s.size());
  return off;
}

// Python's slice normalization of [start, end) for find() and count().
void normalize_range(int64_t n, int64_t& start, int64_t& end) {
  if (end > n) end = n;
  if (end < 0) end = std::max<int64_t>(0, end + n);
  if (start < 0) start = std::max<int64_t>(0, start + n);
}

}  // namespace

int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool right) {
  const std::vector<size_t> off = code_point_offsets(s);
  const int64_t n = int64_t(off.size()) - 1;
  normalize_range(n, start, end);
  if (start > n || end - start < 0) return -1;
  const std::string_view window =
      s.substr(off[size_t(start)], off[size_t(end)] - off[size_t(start)]);
  const size_t hit = right ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos) return -1;
  const size_t byte = off[size_t(start)] + hit;
  return int64_t(std::lower_bound(off.begin(), off.end(), byte) - off.begin());
}

int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  const std::vector<size_t> off = code_point_offsets(s);
  const int64_t n = int64_t(off.size()) - 1;
  normalize_range(n, start, end);
  if (start > n || end - start < 0) return 0;
  if (sub.empty()) return end - start + 1;
  const std::string_view window =
      s.substr(off[size_t(start)], off[size_t(end)] - off[size_t(start)]);
  int64_t k = 0;
  for (size_t pos = window.find(sub); pos != std::string_view::npos;
       pos = window.find(sub, pos + sub.size())) {
    ++k;
  }
  return k;
}

std::string quote(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  static const char* hex = "0123456789abcdef";
  auto escape_hex = [&](char32_t c, int digits, char tag) {
    out.push_back('\\');
    out.push_back(tag);
    for (int k = digits - 1; k >= 0; --k) out.push_back(hex[(c >> (4 * k)) & 0xf]);
  };
  for (char32_t c : decode_utf8(s)) {
    if (c == char32_t(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      escape_hex(c, 2, 'x');
    } else if (c < 0x7f || is_printable(c)) {
      append_utf8(out, c);
    } else if (c <= 0xff) {
      escape_hex(c, 2, 'x');
    } else if (c <= 0xffff) {
      escape_hex(c, 4, 'u');
    } else {
      escape_hex(c, 8, 'U');
    }
  }
  out.push_back(q);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace strata::data::jinja
