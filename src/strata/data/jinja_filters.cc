// jinja2's builtin filters (jinja2/filters.py, with transformers' tojson), with Python's semantics
// on strata's values.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_text.h"

namespace strata::data::jinja {
namespace {

// jinja2's filter names; those marked false are known to jinja2 but refused here (an InputError).
const std::vector<std::pair<std::string, bool>>& filter_table() {
  static const std::vector<std::pair<std::string, bool>> table = {
      {"abs", true},        {"attr", true},       {"batch", true},       {"capitalize", true},
      {"center", true},     {"count", true},      {"d", true},           {"default", true},
      {"dictsort", true},   {"e", true},          {"escape", true},      {"filesizeformat", false},
      {"first", true},      {"float", true},      {"forceescape", true}, {"format", true},
      {"groupby", false},   {"indent", true},     {"int", true},         {"join", true},
      {"last", true},       {"length", true},     {"list", true},        {"lower", true},
      {"items", true},      {"map", true},        {"min", true},         {"max", true},
      {"pprint", false},    {"random", false},    {"reject", true},      {"rejectattr", true},
      {"replace", true},    {"reverse", true},    {"round", true},       {"safe", true},
      {"select", true},     {"selectattr", true}, {"slice", false},      {"sort", true},
      {"string", true},     {"striptags", false}, {"sum", true},         {"title", true},
      {"trim", true},       {"truncate", true},   {"unique", true},      {"upper", true},
      {"urlencode", false}, {"urlize", false},    {"wordcount", true},   {"wordwrap", false},
      {"xmlattr", false},   {"tojson", true},
  };
  return table;
}

std::string soft_str(const Value& v) {
  return to_str(v);
}

int64_t to_int(const Value& v, const char* what) {
  if (!v.is_integral()) fail(std::string(what) + " must be an integer, not " + type_name(v));
  return v.as_int();
}

// jinja2's make_attrgetter: "a.b.0" looked up part by part as environment.getitem does.
Value get_attribute(Evaluator& ev, Value item, const Value& attribute, const Value* fallback) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    const std::string dot = ".";
    for (const std::string& p : split(attribute.str(), &dot, -1, false)) {
      const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
      parts.push_back(digits ? Value::integer(std::stoll(p)) : Value::string(p));
    }
  } else if (!attribute.is_none()) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    item = ev.getitem(item, part);
    if (fallback != nullptr && item.is_undefined()) item = *fallback;
  }
  return item;
}

Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(to_lower(v.str())) : v;
}

Value generator(std::vector<Value> items) {
  return Value::iterator(std::move(items), "generator");
}

// select / reject / selectattr / rejectattr.
Value select_or_reject(Evaluator& ev, const Value& value, CallArgs& a, bool keep, bool attr) {
  std::vector<Value> out;
  if (!truthy(value)) return generator({});
  size_t off = 0;
  Value attribute;
  if (attr) {
    if (a.args.empty()) fail("Missing parameter for attribute name");
    attribute = a.args[0];
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (a.args.size() > off) {
    test = to_str(a.args[off]);
    test_args.args.assign(a.args.begin() + long(off) + 1, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  for (const Value& item : iterate(value)) {
    const Value subject = attr ? get_attribute(ev, item, attribute, nullptr) : item;
    CallArgs args = test_args;
    const bool pass = test ? ev.apply_test(*test, subject, args) : truthy(subject);
    if (pass == keep) out.push_back(item);
  }
  return generator(std::move(out));
}

// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
std::optional<double> parse_float(std::string s) {
  s = strip(s, nullptr, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !::isdigit(s[i - 1]) || !::isdigit(s[i + 1])) return {};
      continue;
    }
    t.push_back(s[i]);
  }
  std::string lower = to_lower(t);
  const size_t sign = !lower.empty() && (lower[0] == '+' || lower[0] == '-') ? 1 : 0;
  const std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos ||
      body[0] == 'e' || body.find("0x") != std::string::npos) {
    return {};
  }
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || *end != '\0') return {};
  return v;
}

// Python's int(str, base) for bases 2 to 36 (and 0: from the prefix).
std::optional<int64_t> parse_int(std::string s, int base) {
  s = strip(s, nullptr, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  std::string lower = to_lower(s.substr(i));
  auto prefix_base = [&](char c) { return c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0; };
  if (lower.size() > 1 && lower[0] == '0' && prefix_base(lower[1]) != 0 &&
      (base == 0 || base == prefix_base(lower[1]))) {
    base = prefix_base(lower[1]);
    lower = lower.substr(2);
    if (!lower.empty() && lower[0] == '_') lower = lower.substr(1);
  } else if (base == 0) {
    base = 10;
  }
  std::string digits;
  for (size_t k = 0; k < lower.size(); ++k) {
    if (lower[k] == '_' && k > 0 && k + 1 < lower.size() && lower[k + 1] != '_') continue;
    digits.push_back(lower[k]);
  }
  if (digits.empty()) return {};
  int64_t v = 0;
  for (char c : digits) {
    const int d = ::isdigit(c) ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return {};
    v = checked_add(checked_mul(v, base), d);
  }
  return negative ? -v : v;
}

Value round_value(const Value& value, int64_t precision, const std::string& method) {
  if (method != "common" && method != "ceil" && method != "floor") {
    fail("method must be common, ceil or floor");
  }
  if (!value.is_number()) fail("type " + type_name(value) + " doesn't define __round__ method");
  if (method == "common") {
    if (value.is_integral() && precision >= 0) return Value::integer(value.as_int());
    const double x = value.as_double();
    if (!std::isfinite(x)) return value;
    if (precision >= 0 && precision < 300) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", int(precision), x);
      return Value::floating(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, double(-precision));
    const double r = std::nearbyint(x / scale) * scale;
    return value.is_integral() ? Value::integer(int64_t(r)) : Value::floating(r);
  }
  const double scale = std::pow(10.0, double(precision));
  const double x = value.as_double() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

std::string center(const std::string& s, int64_t width, const std::string& fill) {
  const int64_t n = count_code_points(s);
  if (width <= n) return s;
  const int64_t marg = width - n;
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

Value sorted(Evaluator& ev, std::vector<Value> items, bool reverse, bool case_sensitive,
             const Value& attribute) {
  std::vector<Value> attrs;
  if (attribute.is_string()) {
    const std::string comma = ",";
    for (const std::string& a : split(attribute.str(), &comma, -1, false)) {
      attrs.push_back(Value::string(a));
    }
  } else {
    attrs.push_back(attribute);
  }
  std::vector<std::pair<std::vector<Value>, Value>> keyed;
  for (Value& item : items) {
    std::vector<Value> key;
    for (const Value& a : attrs) {
      Value k = get_attribute(ev, item, a, nullptr);
      key.push_back(case_sensitive ? k : ignore_case(k));
    }
    keyed.emplace_back(std::move(key), std::move(item));
  }
  auto key_less = [](const std::vector<Value>& a, const std::vector<Value>& b) {
    return less(Value::list(a), Value::list(b));
  };
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? key_less(y.first, x.first) : key_less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& k : keyed) out.push_back(std::move(k.second));
  return Value::list(std::move(out));
}

Value min_or_max(Evaluator& ev, const Value& value, bool max, bool case_sensitive,
                 const Value& attribute) {
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& v) {
    const Value k = get_attribute(ev, v, attribute, nullptr);
    return case_sensitive ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    const Value k = key(items[i]);
    if (max ? less(best_key, k) : less(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value tojson(const Value& value, CallArgs& a) {
  ArgReader r("tojson", a);
  JsonOptions o;
  o.ensure_ascii = truthy(r.next_or("ensure_ascii", Value::boolean(false)));
  const Value indent = r.next_or("indent", Value::none());
  if (indent.is_string()) {
    o.indent = indent.str();
  } else if (indent.is_integral()) {
    o.indent = std::string(size_t(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (!indent.is_none()) {
    fail("tojson: indent must be an integer or a string, not " + type_name(indent));
  }
  const Value separators = r.next_or("separators", Value::none());
  if (!separators.is_none()) {
    const std::vector<Value> parts = iterate(separators);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      fail("tojson: separators must be two strings");
    }
    o.separators = std::make_pair(parts[0].str(), parts[1].str());
  }
  o.sort_keys = truthy(r.next_or("sort_keys", Value::boolean(false)));
  r.done();
  return Value::string(to_json(value, o));
}

Value indent(const Value& value, CallArgs& a) {
  ArgReader r("indent", a);
  const Value width = r.next_or("width", Value::integer(4));
  const bool first = truthy(r.next_or("first", Value::boolean(false)));
  const bool blank = truthy(r.next_or("blank", Value::boolean(false)));
  r.done();
  if (value.is_undefined()) fail(value.str());
  if (!value.is_string()) fail("can only concatenate " + type_name(value) + " and str");
  const std::string ind =
      width.is_string() ? width.str()
                        : std::string(size_t(std::max<int64_t>(0, to_int(width, "width"))), ' ');
  const std::vector<std::string> lines = splitlines(value.str() + "\n", false);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += blank ? "\n" + ind : "\n";
    rv += (!blank && i > 0 && !lines[i].empty()) ? ind + lines[i] : lines[i];
  }
  return Value::string(first ? ind + rv : rv, value.markup());
}

Value truncate(const Value& value, CallArgs& a) {
  ArgReader r("truncate", a);
  const int64_t length = to_int(r.next_or("length", Value::integer(255)), "length");
  const bool killwords = truthy(r.next_or("killwords", Value::boolean(false)));
  const std::string end = to_str(r.next_or("end", Value::string("...")));
  const int64_t leeway = to_int(r.next_or("leeway", Value::integer(5)), "leeway");
  r.done();
  const std::string s = to_str(value);
  const std::vector<char32_t> cps = decode_utf8(s);
  const int64_t end_len = count_code_points(end);
  if (length < end_len) fail("expected length >= " + std::to_string(end_len));
  if (int64_t(cps.size()) <= length + leeway) return value;
  const std::string head = encode_utf8(cps, 0, size_t(length - end_len));
  if (killwords) return Value::string(head + end);
  const std::string space = " ";
  return Value::string(split(head, &space, 1, true)[0] + end);
}

}  // namespace

int filter_index(const std::string& name) {
  const auto& t = filter_table();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i].first == name) return int(i);
  }
  return -1;
}

bool filter_supported(int index) {
  return index >= 0 && filter_table()[size_t(index)].second;
}

Value run_filter(Evaluator& ev, int index, const Value& v, CallArgs& a) {
  if (!filter_supported(index)) fail("unsupported filter");
  const std::string& name = filter_table()[size_t(index)].first;
  ArgReader r(name, a);
  if (name == "tojson") return tojson(v, a);
  if (name == "indent") return indent(v, a);
  if (name == "truncate") return truncate(v, a);
  if (name == "map") {
    if (!truthy(v)) return generator({});
    std::vector<Value> out;
    const auto attr_kw = std::find_if(a.kwargs.begin(), a.kwargs.end(),
                                      [](const auto& kw) { return kw.first == "attribute"; });
    if (a.args.empty() && attr_kw != a.kwargs.end()) {
      const Value attribute = attr_kw->second;
      a.kwargs.erase(attr_kw);
      const Value fallback = r.next_or("default", Value::none());
      r.done();
      for (const Value& item : iterate(v)) {
        out.push_back(get_attribute(ev, item, attribute, fallback.is_none() ? nullptr : &fallback));
      }
      return generator(std::move(out));
    }
    if (a.args.empty()) fail("map requires a filter argument");
    const std::string filter = to_str(a.args[0]);
    for (const Value& item : iterate(v)) {
      CallArgs args{{a.args.begin() + 1, a.args.end()}, a.kwargs};
      out.push_back(ev.apply_filter(filter, item, args));
    }
    return generator(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return select_or_reject(ev, v, a, name[0] == 's', name.size() > 6);
  }
  if (name == "join") {
    const std::string d = to_str(r.next_or("d", Value::string("")));
    const Value attribute = r.next_or("attribute", Value::none());
    r.done();
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += d;
      first = false;
      append_str(out, attribute.is_none() ? item : get_attribute(ev, item, attribute, nullptr));
    }
    return Value::string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value fallback = r.next_or("default_value", Value::string(""));
    const bool boolean = truthy(r.next_or("boolean", Value::boolean(false)));
    r.done();
    return v.is_undefined() || (boolean && !truthy(v)) ? fallback : v;
  }
  if (name == "sort") {
    const bool reverse = truthy(r.next_or("reverse", Value::boolean(false)));
    const bool case_sensitive = truthy(r.next_or("case_sensitive", Value::boolean(false)));
    const Value attribute = r.next_or("attribute", Value::none());
    r.done();
    return sorted(ev, iterate(v), reverse, case_sensitive, attribute);
  }
  if (name == "dictsort") {
    const bool case_sensitive = truthy(r.next_or("case_sensitive", Value::boolean(false)));
    const std::string by = to_str(r.next_or("by", Value::string("key")));
    const bool reverse = truthy(r.next_or("reverse", Value::boolean(false)));
    r.done();
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    if (v.kind() != Kind::kDict) fail("dictsort needs a mapping, not " + type_name(v));
    std::vector<Value> items;
    for (const auto& [k, x] : v.dict().items) items.push_back(Value::tuple({k, x}));
    return sorted(ev, std::move(items), reverse, case_sensitive,
                  Value::integer(by == "key" ? 0 : 1));
  }
  if (name == "unique") {
    const bool case_sensitive = truthy(r.next_or("case_sensitive", Value::boolean(false)));
    const Value attribute = r.next_or("attribute", Value::none());
    r.done();
    std::vector<Value> out, seen;
    for (const Value& item : iterate(v)) {
      Value key = get_attribute(ev, item, attribute, nullptr);
      if (!case_sensitive) key = ignore_case(key);
      if (key.kind() == Kind::kSeq && key.seq().kind == SeqKind::kList)
        fail("unhashable type: 'list'");
      if (key.kind() == Kind::kDict) fail("unhashable type: 'dict'");
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return generator(std::move(out));
  }
  if (name == "min" || name == "max") {
    const bool case_sensitive = truthy(r.next_or("case_sensitive", Value::boolean(false)));
    const Value attribute = r.next_or("attribute", Value::none());
    r.done();
    return min_or_max(ev, v, name == "max", case_sensitive, attribute);
  }
  if (name == "sum") {
    const Value attribute = r.next_or("attribute", Value::none());
    Value total = r.next_or("start", Value::integer(0));
    r.done();
    for (const Value& item : iterate(v)) {
      total = ev.binary("+", total, get_attribute(ev, item, attribute, nullptr));
    }
    return total;
  }
  if (name == "batch") {
    const int64_t n = to_int(r.next("linecount"), "linecount");
    const Value fill = r.next_or("fill_with", Value::none());
    r.done();
    if (n <= 0) fail("batch: linecount must be positive");
    std::vector<Value> out, row;
    for (const Value& item : iterate(v)) {
      if (int64_t(row.size()) == n) out.push_back(Value::list(std::exchange(row, {})));
      row.push_back(item);
    }
    if (!row.empty()) {
      while (!fill.is_none() && int64_t(row.size()) < n) row.push_back(fill);
      out.push_back(Value::list(std::move(row)));
    }
    return generator(std::move(out));
  }
  if (name == "attr") {
    const std::string attr = to_str(r.next("name"));
    r.done();
    if (v.is_undefined()) fail(v.str());
    if (v.kind() == Kind::kObject) {
      if (auto x = v.obj().attribute(attr)) return *x;
    } else if (auto m = method(v, attr)) {
      return *m;
    }
    return Value::undefined("'" + object_type_repr(v) + "' has no attribute '" + attr + "'");
  }
  if (name == "replace") {
    const std::string old = to_str(r.next("old"));
    const std::string with = to_str(r.next("new"));
    const Value n = r.next_or("count", Value::none());
    r.done();
    return Value::string(replace(to_str(v), old, with, n.is_none() ? -1 : to_int(n, "count")));
  }
  if (name == "trim") {
    const Value chars = r.next_or("chars", Value::none());
    r.done();
    const std::string c = chars.is_none() ? "" : to_str(chars);
    return Value::string(strip(to_str(v), chars.is_none() ? nullptr : &c, true, true), v.markup());
  }
  if (name == "round") {
    const int64_t precision = to_int(r.next_or("precision", Value::integer(0)), "precision");
    const std::string method = to_str(r.next_or("method", Value::string("common")));
    r.done();
    return round_value(v, precision, method);
  }
  if (name == "int") {
    const Value fallback = r.next_or("default", Value::integer(0));
    const int64_t base = to_int(r.next_or("base", Value::integer(10)), "base");
    r.done();
    if (v.is_undefined()) fail(v.str());
    if (v.is_integral()) return Value::integer(v.as_int());
    if (v.kind() == Kind::kFloat) {
      const double x = std::trunc(v.as_double());
      if (std::isfinite(x) && std::fabs(x) < 9.2e18) return Value::integer(int64_t(x));
      return fallback;
    }
    if (v.is_string()) {
      if (auto i = parse_int(v.str(), int(base))) return Value::integer(*i);
      if (auto f = parse_float(v.str()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
        return Value::integer(int64_t(std::trunc(*f)));
      }
    }
    return fallback;
  }
  if (name == "float") {
    const Value fallback = r.next_or("default", Value::floating(0.0));
    r.done();
    if (v.is_undefined()) fail(v.str());
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_string()) {
      if (auto f = parse_float(v.str())) return Value::floating(*f);
    }
    return fallback;
  }
  if (name == "format") {
    std::vector<Value> args = r.rest();
    if (!args.empty() && !a.kwargs.empty()) {
      fail("can't handle positional and keyword arguments at the same time");
    }
    if (!a.kwargs.empty()) {
      auto d = std::make_shared<Dict>();
      for (auto& [k, x] : a.kwargs) d->set(Value::string(k), x);
      return Value::string(percent_format(soft_str(v), Value::dict(d)));
    }
    return Value::string(percent_format(soft_str(v), Value::tuple(std::move(args))));
  }
  if (name == "center") {
    const int64_t width = to_int(r.next_or("width", Value::integer(80)), "width");
    r.done();
    return Value::string(center(soft_str(v), width, " "));
  }
  r.done();
  if (name == "abs") {
    if (v.kind() == Kind::kFloat) return Value::floating(std::fabs(v.as_double()));
    if (v.is_integral())
      return Value::integer(v.as_int() < 0 ? checked_mul(v.as_int(), -1) : v.as_int());
    fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "capitalize") return Value::string(capitalize(soft_str(v)));
  if (name == "title") return Value::string(jinja_title(soft_str(v)));
  if (name == "upper") return Value::string(to_upper(soft_str(v)));
  if (name == "lower") return Value::string(to_lower(soft_str(v)));
  if (name == "count" || name == "length") return Value::integer(length(v));
  if (name == "string") return v.is_string() ? v : Value::string(to_str(v));
  if (name == "safe") return v.is_string() && v.markup() ? v : Value::string(to_str(v), true);
  if (name == "escape" || name == "e") {
    return v.is_string() && v.markup() ? v : Value::string(html_escape(to_str(v)), true);
  }
  if (name == "forceescape") return Value::string(html_escape(to_str(v)), true);
  if (name == "list") return Value::list(iterate(v));
  if (name == "wordcount") {
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : decode_utf8(soft_str(v))) {
      std::string one;
      append_utf8(one, c);
      const bool w = c == '_' || is_class(one, "isalnum");
      words += w && !in_word;
      in_word = w;
    }
    return Value::integer(words);
  }
  if (name == "items") {
    if (v.is_undefined()) return generator({});
    if (v.kind() != Kind::kDict) fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({k, x}));
    return generator(std::move(out));
  }
  if (name == "first") {
    if (v.kind() == Kind::kIter) {
      Iterator& it = v.iter();
      if (it.consumed || it.items.empty())
        return Value::undefined("No first item, sequence was empty.");
      Value head = it.items.front();
      it.items.erase(it.items.begin());
      return head;
    }
    const std::vector<Value> items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    if (v.kind() == Kind::kIter) fail("'" + v.iter().type + "' object is not reversible");
    const std::vector<Value> items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = decode_utf8(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::string(encode_utf8(cps, 0, cps.size()));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    switch (v.kind()) {
      case Kind::kIter:
        return Value::list(std::move(items));
      case Kind::kUndefined:
        return Value::iterator({}, "reversed");
      case Kind::kDict:
        return Value::iterator(std::move(items), "dict_reversekeyiterator");
      default:
        return Value::iterator(std::move(items), type_name(v) + "_reverseiterator");
    }
  }
  fail("unsupported filter '" + name + "'");
}

}  // namespace strata::data::jinja
