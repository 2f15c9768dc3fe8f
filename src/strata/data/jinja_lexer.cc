// jinja2's lexer (jinja2/lexer.py) with transformers' settings: trim_blocks (the first newline
// after %} and #} goes), lstrip_blocks (spaces and tabs from a line's start to {% or {# go),
// keep_trailing_newline=False, and newlines normalized to \n.
#include <cctype>

#include "strata/data/jinja_syntax.h"
#include "strata/data/jinja_text.h"

namespace strata::data::jinja {
namespace {

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    s_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        s_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        s_.push_back(source[i]);
      }
    }
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i) {
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        push_data(pos_, s_.substr(pos_));
        break;
      }
      const char kind = s_[tag + 1];
      const char sign =
          tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+') ? s_[tag + 2] : '\0';
      const size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string::npos;
      push_data(pos_, strip_before_tag(s_.substr(pos_, tag - pos_), sign, kind, line_starting));
      if (raw_end != std::string::npos) {
        pos_ = raw_end;
        line_starting = lex_raw();
      } else if (kind == '#') {
        pos_ = tag + 2 + (sign ? 1 : 0);
        line_starting = lex_comment();
      } else {
        push(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, tag, kind == '{' ? "{{" : "{%");
        pos_ = tag + 2 + (sign ? 1 : 0);
        line_starting = lex_tag(kind == '{');
      }
    }
    push(Tok::kEof, s_.size(), "");
    return std::move(tokens_);
  }

 private:
  Pos pos_of(size_t offset) const {
    size_t line = size_t(std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) -
                         line_starts_.begin());
    const size_t start = line_starts_[line - 1];
    const std::string_view head(s_.data() + start, offset - start);
    return Pos{int(line), int(count_code_points(head)) + 1};
  }

  [[noreturn]] void error(const std::string& message, size_t offset) const {
    throw TemplateSyntax{message, pos_of(offset)};
  }

  void push(Tok type, size_t offset, std::string value, Value literal = {}) {
    tokens_.push_back(Token{type, std::move(value), std::move(literal), pos_of(offset)});
  }

  void push_data(size_t offset, std::string text) {
    if (!text.empty()) push(Tok::kData, offset, std::move(text));
  }

  // The first {{, {% or {# at or after `from`.
  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  bool space_at(size_t i, size_t* len) const {
    const auto b = static_cast<unsigned char>(s_[i]);
    if (b < 0x80) {
      *len = 1;
      return is_space(b);
    }
    const std::vector<char32_t> cp = decode_utf8(std::string_view(s_).substr(i, 4));
    std::string one;
    append_utf8(one, cp[0]);
    *len = one.size();
    return is_space(cp[0]);
  }

  size_t skip_space(size_t i) const {
    size_t len = 0;
    while (i < s_.size() && space_at(i, &len)) i += len;
    return i;
  }

  // jinja2's OptionalLStrip: {%- / {{- / {#- strip all whitespace before the tag; with
  // lstrip_blocks, a {% or {# tag alone after a line's start takes the indentation away.
  std::string strip_before_tag(std::string text, char sign, char kind, bool line_starting) const {
    if (sign == '-') return strip(text, nullptr, false, true);
    if (sign == '+' || kind == '{') return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (char32_t c : decode_utf8(std::string_view(text).substr(l_pos))) {
      if (!is_space(c)) return text;
    }
    return text.substr(0, l_pos);
  }

  // {% raw %}: the offset after its %}, or npos when the tag at `tag` is not one.
  size_t match_raw_begin(size_t tag) const {
    size_t i = tag + 2;
    if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) ++i;
    i = skip_space(i);
    if (s_.compare(i, 3, "raw") != 0) return std::string::npos;
    i = skip_space(i + 3);
    if (s_.compare(i, 3, "-%}") == 0) return skip_space(i + 3);
    if (s_.compare(i, 2, "%}") == 0) return i + 2;
    return std::string::npos;
  }

  // The text up to {% endraw %}; returns whether what was consumed ends a line.
  bool lex_raw() {
    for (size_t i = find_tag(pos_); i != std::string::npos; i = find_tag(i + 1)) {
      if (s_[i + 1] != '%') continue;
      size_t j = i + 2;
      const char sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j] : '\0';
      if (sign) ++j;
      j = skip_space(j);
      if (s_.compare(j, 6, "endraw") != 0) continue;
      j = skip_space(j + 6);
      size_t end = std::string::npos;
      if (s_.compare(j, 3, "+%}") == 0) {
        end = j + 3;
      } else if (s_.compare(j, 3, "-%}") == 0) {
        end = skip_space(j + 3);
      } else if (s_.compare(j, 2, "%}") == 0) {
        end = j + 2;
        if (end < s_.size() && s_[end] == '\n') ++end;
      }
      if (end == std::string::npos) continue;
      push_data(pos_, strip_before_tag(s_.substr(pos_, i - pos_), sign, '%', false));
      pos_ = end;
      return s_[end - 1] == '\n';
    }
    error("Missing end of raw directive", pos_);
  }

  bool lex_comment() {
    const size_t start = pos_;
    for (size_t i = s_.find("#}", pos_); i != std::string::npos; i = s_.find("#}", i + 1)) {
      if (i > start && s_[i - 1] == '+') {
        pos_ = i + 2;
      } else if (i > start && s_[i - 1] == '-') {
        pos_ = skip_space(i + 2);
      } else {
        pos_ = i + 2;
        if (pos_ < s_.size() && s_[pos_] == '\n') ++pos_;
      }
      return s_[pos_ - 1] == '\n';
    }
    error("Missing end of comment tag", start);
  }

  // Tokens inside {{ }} or {% %} up to the closing delimiter; returns whether what the closing
  // delimiter consumed ends a line (lstrip_blocks' line_starting).
  bool lex_tag(bool variable) {
    std::vector<char> balance;
    while (pos_ < s_.size()) {
      if (balance.empty()) {
        if (variable) {
          if (s_.compare(pos_, 3, "-}}") == 0) {
            push(Tok::kVarEnd, pos_, "}}");
            pos_ = skip_space(pos_ + 3);
            return s_[pos_ - 1] == '\n';
          }
          if (s_.compare(pos_, 2, "}}") == 0) {
            push(Tok::kVarEnd, pos_, "}}");
            pos_ += 2;
            return false;
          }
        } else {
          if (s_.compare(pos_, 3, "+%}") == 0) {
            push(Tok::kBlockEnd, pos_, "%}");
            pos_ += 3;
            return false;
          }
          if (s_.compare(pos_, 3, "-%}") == 0) {
            push(Tok::kBlockEnd, pos_, "%}");
            pos_ = skip_space(pos_ + 3);
            return s_[pos_ - 1] == '\n';
          }
          if (s_.compare(pos_, 2, "%}") == 0) {
            push(Tok::kBlockEnd, pos_, "%}");
            pos_ += 2;
            if (pos_ < s_.size() && s_[pos_] == '\n') {
              ++pos_;
              return true;
            }
            return false;
          }
        }
      }
      size_t len = 0;
      if (space_at(pos_, &len)) {
        pos_ = skip_space(pos_);
      } else if (!lex_number() && !lex_name() && !lex_string()) {
        lex_operator(balance);
      }
    }
    return false;
  }

  // (\d+_)*\d+ at i: the end, or npos.
  size_t digits(size_t i, bool (*is_digit)(char)) const {
    size_t j = i;
    if (j >= s_.size() || !is_digit(s_[j])) return std::string::npos;
    while (true) {
      while (j < s_.size() && is_digit(s_[j])) ++j;
      if (j + 1 < s_.size() && s_[j] == '_' && is_digit(s_[j + 1])) {
        ++j;
        continue;
      }
      return j;
    }
  }

  static bool dec(char c) { return c >= '0' && c <= '9'; }
  static bool bin(char c) { return c == '0' || c == '1'; }
  static bool oct(char c) { return c >= '0' && c <= '7'; }
  static bool hex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

  static std::string without_underscores(std::string_view text) {
    std::string out;
    for (char c : text) {
      if (c != '_') out.push_back(c);
    }
    return out;
  }

  // The float and integer rules, in jinja2's order.
  bool lex_number() {
    const size_t start = pos_;
    if (!dec(s_[start])) return false;
    if (start == 0 || s_[start - 1] != '.') {
      const size_t int_end = digits(start, dec);
      size_t end = int_end;
      bool is_float = false;
      if (end + 1 < s_.size() && s_[end] == '.') {
        const size_t frac = digits(end + 1, dec);
        if (frac != std::string::npos) {
          end = frac;
          is_float = true;
        }
      }
      if (end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {
        size_t e = end + 1;
        if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
        const size_t exp = digits(e, dec);
        if (exp != std::string::npos) {
          end = exp;
          is_float = true;
        }
      }
      if (is_float) {
        const std::string text = without_underscores(s_.substr(start, end - start));
        push(Tok::kFloat, start, text, Value::floating(std::strtod(text.c_str(), nullptr)));
        pos_ = end;
        return true;
      }
    }
    size_t end = std::string::npos;
    int base = 10;
    const char p = start + 1 < s_.size() ? char(std::tolower(s_[start + 1])) : '\0';
    auto prefixed = [&](bool (*is_digit)(char)) {
      size_t j = start + 2;
      size_t last = std::string::npos;
      while (true) {
        size_t k = j;
        if (k < s_.size() && s_[k] == '_') ++k;
        if (k < s_.size() && is_digit(s_[k])) {
          j = last = k + 1;
        } else {
          return last;
        }
      }
    };
    if (s_[start] == '0' && p == 'b') {
      end = prefixed(bin);
      base = 2;
    } else if (s_[start] == '0' && p == 'o') {
      end = prefixed(oct);
      base = 8;
    } else if (s_[start] == '0' && p == 'x') {
      end = prefixed(hex);
      base = 16;
    }
    if (end == std::string::npos) {
      base = 10;
      if (s_[start] == '0') {
        end = start + 1;
        while (true) {
          size_t k = end;
          if (k < s_.size() && s_[k] == '_') ++k;
          if (k < s_.size() && s_[k] == '0') {
            end = k + 1;
          } else {
            break;
          }
        }
      } else {
        end = digits(start, dec);
      }
    }
    const std::string text = s_.substr(start, end - start);
    std::string body = without_underscores(text);
    if (base != 10) body = body.substr(2);
    errno = 0;
    char* stop = nullptr;
    const long long v = std::strtoll(body.c_str(), &stop, base);
    if (errno == ERANGE) error("the integer " + text + " is out of 64-bit range", start);
    push(Tok::kInt, start, text, Value::integer(v));
    pos_ = end;
    return true;
  }

  bool lex_name() {
    auto head = [](unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; };
    auto tail = [&](unsigned char c) { return head(c) || std::isdigit(c); };
    if (!head(static_cast<unsigned char>(s_[pos_]))) return false;
    size_t end = pos_ + 1;
    while (end < s_.size() && tail(static_cast<unsigned char>(s_[end]))) ++end;
    push(Tok::kName, pos_, s_.substr(pos_, end - pos_));
    pos_ = end;
    return true;
  }

  bool lex_string() {
    const char q = s_[pos_];
    if (q != '\'' && q != '"') return false;
    size_t i = pos_ + 1;
    while (i < s_.size() && s_[i] != q) i += s_[i] == '\\' ? 2 : 1;
    if (i >= s_.size()) error("unexpected char '" + std::string(1, q) + "'", pos_);
    push(Tok::kString, pos_, s_.substr(pos_, i + 1 - pos_), Value::string(unescape(pos_ + 1, i)));
    pos_ = i + 1;
    return true;
  }

  // Python's unicode-escape decoding of the literal, as jinja2 applies it after
  // encode("ascii", "backslashreplace"): a backslash before a non-ASCII character stays, and the
  // character becomes its \xNN / \uNNNN / \UNNNNNNNN spelling.
  std::string unescape(size_t begin, size_t end) const {
    std::string out;
    size_t i = begin;
    auto hex_value = [&](size_t at, int n) -> char32_t {
      char32_t v = 0;
      for (int k = 0; k < n; ++k) {
        const size_t j = at + size_t(k);
        if (j >= end || !hex(s_[j])) {
          error(std::string("truncated \\") + s_[at - 1] + " escape in a string", at);
        }
        v = v * 16 + char32_t(std::stoi(std::string(1, s_[j]), nullptr, 16));
      }
      return v;
    };
    while (i < end) {
      if (s_[i] != '\\') {
        out.push_back(s_[i++]);
        continue;
      }
      const char d = s_[i + 1];
      i += 2;
      switch (d) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          append_utf8(out, hex_value(i, 2));
          i += 2;
          break;
        case 'u':
          append_utf8(out, hex_value(i, 4));
          i += 4;
          break;
        case 'U': {
          const char32_t cp = hex_value(i, 8);
          if (cp > 0x10ffff) error("illegal Unicode character in a string escape", i);
          append_utf8(out, cp);
          i += 8;
          break;
        }
        case 'N':
          error("\\N{...} escapes are not supported", i - 2);
        default:
          if (oct(d)) {
            char32_t v = char32_t(d - '0');
            for (int k = 0; k < 2 && i < end && oct(s_[i]); ++k)
              v = v * 8 + char32_t(s_[i++] - '0');
            append_utf8(out, v);
          } else if (static_cast<unsigned char>(d) >= 0x80) {
            const char32_t cp = decode_utf8(std::string_view(s_).substr(i - 1, 4))[0];
            std::string one;
            append_utf8(one, cp);
            i += one.size() - 1;
            static const char* digits16 = "0123456789abcdef";
            const int n = cp < 0x100 ? 2 : cp < 0x10000 ? 4 : 8;
            out += cp < 0x100 ? "\\x" : cp < 0x10000 ? "\\u" : "\\U";
            for (int k = n - 1; k >= 0; --k) out.push_back(digits16[(cp >> (4 * k)) & 0xf]);
          } else {
            out.push_back('\\');
            out.push_back(d);
          }
      }
    }
    return out;
  }

  void lex_operator(std::vector<char>& balance) {
    static const char* ops[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/",
                                "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                "=",  ".",  ":",  "|",  ",",  ";",  ">", "<"};
    for (const char* op : ops) {
      const size_t n = std::char_traits<char>::length(op);
      if (s_.compare(pos_, n, op) != 0) continue;
      const char c = op[0];
      if (n == 1 && (c == '(' || c == '[' || c == '{')) {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance.empty()) error(std::string("unexpected '") + c + "'", pos_);
        if (balance.back() != c) {
          error(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", pos_);
        }
        balance.pop_back();
      }
      push(Tok::kOp, pos_, op);
      pos_ += n;
      return;
    }
    const std::vector<char32_t> cp = decode_utf8(std::string_view(s_).substr(pos_, 4));
    std::string one;
    append_utf8(one, cp[0]);
    error("unexpected char '" + one + "'", pos_);
  }

  std::string s_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace strata::data::jinja
