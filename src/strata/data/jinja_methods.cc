// The Python methods templates call on str, dict, list and tuple values, jinja2's and
// transformers' globals, and Python's string formatting (% and str.format).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_text.h"

namespace strata::data::jinja {
namespace {

std::string as_string(const Value& v, const std::string& what) {
  if (!v.is_string()) fail(what + " must be str, not " + type_name(v));
  return v.str();
}

int64_t as_index(const Value& v, const std::string& what) {
  if (!v.is_integral()) fail(what + " must be an integer, not " + type_name(v));
  return v.as_int();
}

// s[start:end] in code points, with Python's slice bounds (None for a missing bound).
std::string slice(const std::string& s, const Value& start, const Value& end) {
  if (start.is_none() && end.is_none()) return s;
  const std::vector<char32_t> cps = decode_utf8(s);
  const auto n = int64_t(cps.size());
  auto adjust = [n](const Value& b, int64_t fallback) {
    if (b.is_none()) return fallback;
    int64_t i = as_index(b, "slice index");
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  const int64_t b = adjust(start, 0), e = adjust(end, n);
  return b >= e ? std::string() : encode_utf8(cps, size_t(b), size_t(e));
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, char align) {
  const int64_t n = count_code_points(s);
  if (width <= n) return s;
  const int64_t marg = width - n;
  const int64_t left = align == '<' ? 0 : align == '>' ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

// startswith / endswith: a str or a tuple of str, within [start, end).
bool affix(const std::string& s, CallArgs& a, const char* name, bool at_end) {
  ArgReader r(name, a);
  const Value what = r.next("prefix");
  const Value start = r.next_or("start", Value::none());
  const Value end = r.next_or("end", Value::none());
  r.done();
  const std::string window = slice(s, start, end);
  std::vector<Value> options;
  if (what.kind() == Kind::kSeq && what.seq().kind == SeqKind::kTuple) {
    options = what.seq().items;
  } else {
    options.push_back(what);
  }
  for (const Value& o : options) {
    const std::string x = as_string(o, std::string(name) + " argument");
    if (x.size() > window.size()) continue;
    if (at_end ? window.compare(window.size() - x.size(), x.size(), x) == 0
               : window.compare(0, x.size(), x) == 0) {
      return true;
    }
  }
  return false;
}

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  for (const std::string& p : parts) out.push_back(Value::string(p));
  return Value::list(std::move(out));
}

std::string str_format(const std::string& format, CallArgs& a);

Value str_method(Evaluator&, const std::string& s, const std::string& name, CallArgs& a) {
  ArgReader r(name, a);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value chars = r.next_or("chars", Value::none());
    r.done();
    const std::string c = chars.is_none() ? "" : as_string(chars, name + " arg");
    return Value::string(
        strip(s, chars.is_none() ? nullptr : &c, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value sep = r.next_or("sep", Value::none());
    const int64_t maxsplit = as_index(r.next_or("maxsplit", Value::integer(-1)), "maxsplit");
    r.done();
    const std::string sep_s = sep.is_none() ? "" : as_string(sep, "sep");
    return string_list(split(s, sep.is_none() ? nullptr : &sep_s, maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    const bool keepends = truthy(r.next_or("keepends", Value::boolean(false)));
    r.done();
    return string_list(splitlines(s, keepends));
  }
  if (name == "startswith" || name == "endswith") {
    return Value::boolean(affix(s, a, name.c_str(), name == "endswith"));
  }
  if (name == "replace") {
    const std::string old = as_string(r.next("old"), "replace() argument 1");
    const std::string with = as_string(r.next("new"), "replace() argument 2");
    const int64_t count = as_index(r.next_or("count", Value::integer(-1)), "count");
    r.done();
    return Value::string(replace(s, old, with, count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const std::string sub = as_string(r.next("sub"), name + "() argument");
    const Value start = r.next_or("start", Value::none());
    const Value end = r.next_or("end", Value::none());
    r.done();
    const int64_t b = start.is_none() ? 0 : as_index(start, "start");
    const int64_t e = end.is_none() ? INT64_MAX : as_index(end, "end");
    if (name == "count") return Value::integer(count(s, sub, b, e));
    const int64_t at = find(s, sub, b, e, name[0] == 'r');
    if (at < 0 && name.find("index") != std::string::npos) fail("substring not found");
    return Value::integer(at);
  }
  if (name == "join") {
    const Value items = r.next("iterable");
    r.done();
    std::string out;
    size_t i = 0;
    for (const Value& item : iterate(items)) {
      if (!item.is_string()) {
        fail("sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) +
             " found");
      }
      if (i++ > 0) out += s;
      out += item.str();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(str_format(s, a));
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int64_t width = as_index(r.next("width"), "width");
    const std::string fill = as_string(r.next_or("fillchar", Value::string(" ")), "fillchar");
    r.done();
    if (count_code_points(fill) != 1) fail("The fill character must be exactly one character long");
    return Value::string(pad(s, width, fill, name == "ljust" ? '<' : name == "rjust" ? '>' : '^'));
  }
  if (name == "zfill") {
    const int64_t width = as_index(r.next("width"), "width");
    r.done();
    const int64_t n = count_code_points(s);
    if (width <= n) return Value::string(s);
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    return Value::string((sign ? s.substr(0, 1) : "") + std::string(size_t(width - n), '0') +
                         s.substr(sign ? 1 : 0));
  }
  if (name == "partition" || name == "rpartition") {
    const std::string sep = as_string(r.next("sep"), "sep");
    r.done();
    if (sep.empty()) fail("empty separator");
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition"
                 ? Value::tuple({Value::string(s), Value::string(""), Value::string("")})
                 : Value::tuple({Value::string(""), Value::string(""), Value::string(s)});
    }
    return Value::tuple({Value::string(s.substr(0, at)), Value::string(sep),
                         Value::string(s.substr(at + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string x = as_string(r.next("affix"), name + "() argument");
    r.done();
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0)
      return Value::string(s.substr(x.size()));
    if (name == "removesuffix" && x.size() <= s.size() && !x.empty() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return Value::string(s.substr(0, s.size() - x.size()));
    }
    return Value::string(s);
  }
  r.done();
  if (name == "upper") return Value::string(to_upper(s));
  if (name == "lower") return Value::string(to_lower(s));
  if (name == "title") return Value::string(to_title(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "islower") return Value::boolean(is_lower(s));
  if (name == "isupper") return Value::boolean(is_upper(s));
  return Value::boolean(is_class(s, name));
}

const std::vector<std::string>& str_methods() {
  static const std::vector<std::string> names = {
      "strip",      "lstrip",   "rstrip",    "split",      "rsplit",       "splitlines",
      "startswith", "endswith", "replace",   "find",       "rfind",        "index",
      "rindex",     "count",    "join",      "format",     "center",       "ljust",
      "rjust",      "zfill",    "partition", "rpartition", "removeprefix", "removesuffix",
      "upper",      "lower",    "title",     "capitalize", "islower",      "isupper",
      "isdigit",    "isalpha",  "isalnum",   "isspace",    "isnumeric",    "isdecimal"};
  return names;
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  ArgReader r(name, a);
  if (name == "get") {
    const Value key = r.next("key");
    const Value fallback = r.next_or("default", Value::none());
    r.done();
    const Value* v = d.dict().find(key);
    return v != nullptr ? *v : fallback;
  }
  r.done();
  if (name == "copy") return Value::dict(std::make_shared<Dict>(d.dict()));
  std::vector<Value> out;
  for (const auto& [k, v] : d.dict().items) {
    out.push_back(name == "keys" ? k : name == "values" ? v : Value::tuple({k, v}));
  }
  return Value::sequence(name == "keys"     ? SeqKind::kDictKeys
                         : name == "values" ? SeqKind::kDictValues
                                            : SeqKind::kDictItems,
                         std::move(out));
}

Value seq_method(const Value& s, const std::string& name, CallArgs& a) {
  ArgReader r(name, a);
  const std::vector<Value>& items = s.seq().items;
  if (name == "copy") {
    r.done();
    return Value::list(items);
  }
  const Value x = r.next("value");
  r.done();
  if (name == "count") {
    return Value::integer(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, x); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (equal(items[i], x)) return Value::integer(int64_t(i));
  }
  fail(repr(x) + " is not in " + type_name(s));
}

Value bound(const Value& receiver, const std::string& name,
            std::function<Value(Evaluator&, const Value&, CallArgs&)> fn) {
  return builtin(name, [receiver, fn](Evaluator& ev, CallArgs& a) { return fn(ev, receiver, a); });
}

// What ImmutableSandboxedEnvironment refuses: methods that change a list or dict.
Value unsafe(const Value& receiver, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(receiver) +
                          "' object is unsafe.");
}

}  // namespace

std::optional<Value> method(const Value& v, const std::string& name) {
  if (v.is_string()) {
    const auto& names = str_methods();
    if (std::find(names.begin(), names.end(), name) == names.end()) return std::nullopt;
    return bound(v, name, [name](Evaluator& ev, const Value& self, CallArgs& a) {
      return str_method(ev, self.str(), name, a);
    });
  }
  if (v.kind() == Kind::kDict) {
    if (name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy") {
      return bound(v, name, [name](Evaluator&, const Value& self, CallArgs& a) {
        return dict_method(self, name, a);
      });
    }
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
        name == "clear") {
      return unsafe(v, name);
    }
    return std::nullopt;
  }
  if (v.kind() == Kind::kSeq &&
      (v.seq().kind == SeqKind::kList || v.seq().kind == SeqKind::kTuple)) {
    const bool list = v.seq().kind == SeqKind::kList;
    if (name == "index" || name == "count" || (list && name == "copy")) {
      return bound(v, name, [name](Evaluator&, const Value& self, CallArgs& a) {
        return seq_method(self, name, a);
      });
    }
    if (list && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                 name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
      return unsafe(v, name);
    }
  }
  return std::nullopt;
}

namespace {

std::shared_ptr<Dict> dict_from(CallArgs& a, const char* what) {
  if (a.args.size() > 1) fail(std::string(what) + " expected at most 1 argument");
  auto d = std::make_shared<Dict>();
  if (!a.args.empty()) {
    const Value& src = a.args[0];
    if (src.kind() == Kind::kDict) {
      *d = src.dict();
    } else {
      for (const Value& pair : iterate(src)) {
        const std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has the wrong length");
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d->set(Value::string(k), v);
  return d;
}

}  // namespace

void add_globals(Scope& scope) {
  scope.set("range", builtin("range", [](Evaluator&, CallArgs& a) {
              if (!a.kwargs.empty()) fail("range() takes no keyword arguments");
              if (a.args.empty() || a.args.size() > 3) fail("range expected 1 to 3 arguments");
              int64_t start = 0, stop = 0, step = 1;
              if (a.args.size() == 1) {
                stop = as_index(a.args[0], "range() argument");
              } else {
                start = as_index(a.args[0], "range() argument");
                stop = as_index(a.args[1], "range() argument");
                if (a.args.size() == 3) step = as_index(a.args[2], "range() argument");
              }
              if (step == 0) fail("range() arg 3 must not be zero");
              const double n = std::ceil((double(stop) - double(start)) / double(step));
              if (n > 100000) {
                fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
              }
              return Value::range(start, stop, step);
            }));
  scope.set("dict", builtin("dict", [](Evaluator&, CallArgs& a) {
              return Value::dict(dict_from(a, "dict"));
            }));
  scope.set("namespace", builtin("namespace", [](Evaluator&, CallArgs& a) {
              auto ns = std::make_shared<Namespace>();
              ns->attrs = *dict_from(a, "namespace");
              return Value::object(ns);
            }));
  scope.set("joiner", builtin("joiner", [](Evaluator&, CallArgs& a) {
              ArgReader r("joiner", a);
              const std::string sep = to_str(r.next_or("sep", Value::string(", ")));
              r.done();
              auto used = std::make_shared<bool>(false);
              return builtin("joiner", [sep, used](Evaluator&, CallArgs&) {
                return Value::string(std::exchange(*used, true) ? sep : "");
              });
            }));
  scope.set("raise_exception", builtin("raise_exception", [](Evaluator&, CallArgs& a) -> Value {
              ArgReader r("raise_exception", a);
              const Value message = r.next("message");
              r.done();
              throw TemplateError{to_str(message), true};
            }));
  scope.set("strftime_now", builtin("strftime_now", [](Evaluator&, CallArgs& a) {
              ArgReader r("strftime_now", a);
              const std::string format = as_string(r.next("format"), "strftime_now() argument");
              r.done();
              const std::time_t now = std::time(nullptr);
              std::tm local{};
              localtime_r(&now, &local);
              std::string out(256 + format.size() * 8, '\0');
              const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
              out.resize(n);
              return Value::string(out);
            }));
}

std::string percent_format(const std::string& format, const Value& args) {
  // CPython's PyUnicode_Format: a tuple gives the arguments; anything else is the one argument,
  // and also the mapping of %(key)s when it has __getitem__ (then it may go unused).
  const bool tuple = args.kind() == Kind::kSeq && args.seq().kind == SeqKind::kTuple;
  const bool mapping =
      !tuple && (args.kind() == Kind::kDict || args.kind() == Kind::kSeq || args.is_undefined());
  const std::vector<Value> positional = tuple ? args.seq().items : std::vector<Value>{args};
  size_t next = 0;
  auto take = [&]() -> Value {
    if (next >= positional.size()) fail("not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) fail("incomplete format");
    Value arg;
    bool have_arg = false;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos || !mapping) fail("format requires a mapping");
      if (args.is_undefined()) fail(args.str());
      if (args.kind() != Kind::kDict)
        fail(type_name(args) + " indices must be integers or slices, not str");
      const Value* v = args.dict().find(std::string_view(format).substr(i + 1, close - i - 1));
      if (v == nullptr) fail("KeyError: '" + format.substr(i + 1, close - i - 1) + "'");
      arg = *v;
      have_arg = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos) {
      flags.push_back(format[i++]);
    }
    std::string width, precision;
    bool has_precision = false;
    if (i < format.size() && format[i] == '*') {
      width = std::to_string(as_index(take(), "* width"));
      ++i;
    }
    while (i < format.size() && ::isdigit(format[i])) width.push_back(format[i++]);
    if (i < format.size() && format[i] == '.') {
      has_precision = true;
      ++i;
      if (i < format.size() && format[i] == '*') {
        precision = std::to_string(as_index(take(), "* precision"));
        ++i;
      }
      while (i < format.size() && ::isdigit(format[i])) precision.push_back(format[i++]);
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) fail("incomplete format");
    const char conv = format[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    std::string text;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      text = conv == 's' ? to_str(arg) : repr(arg);
      if (has_precision) {
        const std::vector<char32_t> cps = decode_utf8(text);
        text = encode_utf8(cps, 0, std::min(cps.size(), size_t(std::stoll("0" + precision))));
      }
      const int64_t w = width.empty() ? 0 : std::stoll(width);
      text = pad(text, w, " ", flags.find('-') != std::string::npos ? '<' : '>');
      out += text;
      continue;
    }
    const std::string spec = "%" + flags + width + (has_precision ? "." + precision : "");
    char buf[512];
    if (std::string("diuxXoc").find(conv) != std::string::npos) {
      if (!arg.is_number()) {
        fail(std::string("%") + conv + " format: a real number is required, not " + type_name(arg));
      }
      const long long n =
          arg.is_integral() ? arg.as_int() : static_cast<long long>(std::trunc(arg.as_double()));
      if (conv == 'c') {
        std::string c;
        append_utf8(c, char32_t(n));
        out += c;
        continue;
      }
      const char c = conv == 'u' || conv == 'i' ? 'd' : conv;
      std::string s = spec + "ll" + c;
      if (conv == 'o' && flags.find('#') != std::string::npos) {
        // Python writes 0o17 where C writes 017.
        std::string f = flags;
        f.erase(std::remove(f.begin(), f.end(), '#'), f.end());
        std::snprintf(buf, sizeof(buf),
                      ("%" + f + width + (has_precision ? "." + precision : "") + "llo").c_str(),
                      n);
        std::string t = buf;
        const size_t digit = t.find_first_of("0123456789");
        out += t.substr(0, digit) + "0o" + t.substr(digit);
        continue;
      }
      std::snprintf(buf, sizeof(buf), s.c_str(), n);
      out += buf;
      continue;
    }
    if (std::string("eEfFgG").find(conv) != std::string::npos) {
      if (!arg.is_number()) fail("must be real number, not " + type_name(arg));
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), arg.as_double());
      out += buf;
      continue;
    }
    fail(std::string("unsupported format character '") + conv + "'");
  }
  if (!mapping && next < positional.size()) {
    fail("not all arguments converted during string formatting");
  }
  return out;
}

namespace {

// str.format: {}, {0}, {name}, with !s / !r conversions; format specs are refused.
std::string str_format(const std::string& format, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}')
        ++i;
      else
        fail("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos) {
      fail("str.format: format specs and attribute lookups are not supported");
    }
    Value v;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const size_t index = field.empty() ? auto_index++ : size_t(std::stoul(field));
      if (index >= a.args.size())
        fail("Replacement index " + std::to_string(index) + " out of range");
      v = a.args[index];
    } else {
      const auto it = std::find_if(a.kwargs.begin(), a.kwargs.end(),
                                   [&](const auto& kw) { return kw.first == field; });
      if (it == a.kwargs.end()) fail("KeyError: '" + field + "'");
      v = it->second;
    }
    out += conversion == 's' ? to_str(v) : repr(v);
  }
  return out;
}

}  // namespace

}  // namespace strata::data::jinja
