#include "strata/data/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "strata/data/jinja_text.h"

namespace strata::data::jinja {

void fail(std::string message) {
  throw TemplateError{std::move(message)};
}

Value Value::undefined(std::string message) {
  Value v;
  v.str_ = std::make_shared<const std::string>(std::move(message));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::string(std::string s, bool markup) {
  Value v;
  v.kind_ = Kind::kString;
  v.markup_ = markup;
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::sequence(SeqKind kind, std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kSeq;
  auto seq = std::make_shared<Sequence>();
  seq->kind = kind;
  seq->items = std::move(items);
  v.ptr_ = std::move(seq);
  return v;
}

Value Value::range(int64_t start, int64_t stop, int64_t step) {
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(integer(i));
  Value v = sequence(SeqKind::kRange, std::move(items));
  auto& seq = *static_cast<Sequence*>(v.ptr_.get());
  seq.start = start;
  seq.stop = stop;
  seq.step = step;
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::move(d);
  return v;
}

Value Value::iterator(std::vector<Value> items, std::string type) {
  Value v;
  v.kind_ = Kind::kIter;
  auto it = std::make_shared<Iterator>();
  it->items = std::move(items);
  it->type = std::move(type);
  v.ptr_ = std::move(it);
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind_ = Kind::kObject;
  v.ptr_ = std::move(o);
  return v;
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

std::string Object::repr() const {
  fail("cannot print a " + type_name() + " object: Python prints its memory address");
}

std::optional<Value> Object::attribute(const std::string&) const {
  return std::nullopt;
}

Value Object::call(Evaluator&, CallArgs&) {
  fail("'" + type_name() + "' object is not callable");
}

std::string Namespace::repr() const {
  return "<Namespace " + jinja::repr(Value::dict(std::make_shared<Dict>(attrs))) + ">";
}

std::optional<Value> Namespace::attribute(const std::string& name) const {
  if (const Value* v = attrs.find(name)) return *v;
  return std::nullopt;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kDict:
      return "dict";
    case Kind::kIter:
      return v.iter().type;
    case Kind::kObject:
      return v.obj().type_name();
    case Kind::kSeq:
      break;
  }
  switch (v.seq().kind) {
    case SeqKind::kList:
      return "list";
    case SeqKind::kTuple:
      return "tuple";
    case SeqKind::kDictItems:
      return "dict_items";
    case SeqKind::kDictKeys:
      return "dict_keys";
    case SeqKind::kDictValues:
      return "dict_values";
    case SeqKind::kRange:
      return "range";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  const std::string name = type_name(v);
  if (name == "Namespace") return "jinja2.utils.Namespace object";
  if (name == "LoopContext" || name == "Macro") return "jinja2.runtime." + name + " object";
  return name + " object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_double() != 0.0;
    case Kind::kString:
      return !v.str().empty();
    case Kind::kSeq:
      return !v.seq().items.empty();
    case Kind::kDict:
      return !v.dict().items.empty();
    case Kind::kIter:
    case Kind::kObject:
      return true;
  }
  return true;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  if (sci[0] == '-') {
    out.push_back('-');
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int decpt = exp10 + 1;  // digits[0] stands before this many places
  const int n = int(digits.size());
  // Appended piece by piece: GCC 12 warns (-Wrestrict) on "literal" + std::string here.
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(size_t(decpt - n), '0');
      out += ".0";
    } else {
      out.append(digits, 0, size_t(decpt));
      out.push_back('.');
      out.append(digits, size_t(decpt));
    }
    return out;
  }
  out.push_back(digits[0]);
  if (n > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  const int e = std::abs(exp10);
  out += exp10 < 0 ? "e-" : "e+";
  if (e < 10) out.push_back('0');
  out += std::to_string(e);
  return out;
}

namespace {

void append_repr(std::string& out, const Value& v);

void append_items(std::string& out, const std::vector<Value>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    append_repr(out, items[i]);
  }
}

void append_repr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      out += "Undefined";
      return;
    case Kind::kString:
      out += v.markup() ? "Markup(" + quote(v.str()) + ")" : quote(v.str());
      return;
    case Kind::kDict:
      out.push_back('{');
      for (size_t i = 0; i < v.dict().items.size(); ++i) {
        if (i > 0) out += ", ";
        append_repr(out, v.dict().items[i].first);
        out += ": ";
        append_repr(out, v.dict().items[i].second);
      }
      out.push_back('}');
      return;
    case Kind::kSeq:
      break;
    default:
      append_str(out, v);
      return;
  }
  const Sequence& s = v.seq();
  switch (s.kind) {
    case SeqKind::kList:
      out.push_back('[');
      append_items(out, s.items);
      out.push_back(']');
      return;
    case SeqKind::kTuple:
      out.push_back('(');
      append_items(out, s.items);
      if (s.items.size() == 1) out.push_back(',');
      out.push_back(')');
      return;
    case SeqKind::kRange:
      out += "range(" + std::to_string(s.start) + ", " + std::to_string(s.stop);
      if (s.step != 1) out += ", " + std::to_string(s.step);
      out.push_back(')');
      return;
    default:
      out += type_name(v) + "([";
      append_items(out, s.items);
      out += "])";
      return;
  }
}

}  // namespace

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      out += float_repr(v.as_double());
      return;
    case Kind::kString:
      out += v.str();
      return;
    case Kind::kIter:
      fail("cannot print a " + v.iter().type +
           " object: Python prints its memory address (apply |list first)");
    case Kind::kObject:
      out += v.obj().repr();
      return;
    default:
      append_repr(out, v);
      return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

namespace {
// int64 and double both fit exactly in x86's 64-bit-mantissa long double.
long double number(const Value& v) {
  return v.is_integral() ? static_cast<long double>(v.as_int()) : v.as_double();
}
}  // namespace

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return number(a) == number(b);
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kSeq: {
      const Sequence& x = a.seq();
      const Sequence& y = b.seq();
      if ((x.kind == SeqKind::kTuple) != (y.kind == SeqKind::kTuple)) return false;
      if (x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    const long double x = number(a), y = number(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind() == Kind::kSeq && b.kind() == Kind::kSeq &&
      (a.seq().kind == SeqKind::kTuple) == (b.seq().kind == SeqKind::kTuple)) {
    const auto& x = a.seq().items;
    const auto& y = b.seq().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool less(const Value& a, const Value& b) {
  return compare(a, b) < 0;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kString: {
      std::vector<Value> out;
      for (char32_t c : decode_utf8(v.str())) {
        std::string s;
        append_utf8(s, c);
        out.push_back(Value::string(std::move(s)));
      }
      return out;
    }
    case Kind::kSeq:
      return v.seq().items;
    case Kind::kDict: {
      std::vector<Value> out;
      for (const auto& item : v.dict().items) out.push_back(item.first);
      return out;
    }
    case Kind::kIter: {
      Iterator& it = v.iter();
      if (it.consumed) return {};
      it.consumed = true;
      return it.items;
    }
    default:
      fail("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return count_code_points(v.str());
    case Kind::kSeq:
      return int64_t(v.seq().items.size());
    case Kind::kDict:
      return int64_t(v.dict().items.size());
    default:
      fail("object of type '" + type_name(v) + "' has no len()");
  }
}

}  // namespace strata::data::jinja
