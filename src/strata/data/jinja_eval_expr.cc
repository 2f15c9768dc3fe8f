// The evaluator's expressions (jinja_eval.h): names, attribute and item access as jinja2's
// sandboxed environment does them, operators with Python's semantics, calls, filters and tests.
#include <cmath>

#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_text.h"

namespace strata::data::jinja {
namespace {

Value undefined_attribute(const Value& obj, const std::string& name) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict) on the chain of + here.
  std::string message = "'";
  message += object_type_repr(obj);
  message += "' has no attribute '";
  message += name;
  message += "'";
  return Value::undefined(std::move(message));
}

Value undefined_element(const Value& obj, const Value& key) {
  if (key.is_string()) return undefined_attribute(obj, key.str());
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.str());
}

// Python's floor division and modulo of floats (float_divmod in CPython).
std::pair<double, double> float_divmod(double x, double y, const char* what) {
  if (y == 0.0) fail(std::string("float ") + what + " by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0.0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv = 0.0;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  return {floordiv, mod};
}

Value repeat(const std::vector<Value>& items, SeqKind kind, int64_t times) {
  std::vector<Value> out;
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), items.begin(), items.end());
  return Value::sequence(kind == SeqKind::kTuple ? SeqKind::kTuple : SeqKind::kList,
                         std::move(out));
}

bool is_plain_seq(const Value& v) {
  return v.kind() == Kind::kSeq &&
         (v.seq().kind == SeqKind::kList || v.seq().kind == SeqKind::kTuple);
}

}  // namespace

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        fail("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kDict:
      if (item.kind() == Kind::kDict ||
          (item.kind() == Kind::kSeq && item.seq().kind != SeqKind::kTuple)) {
        fail("unhashable type: '" + type_name(item) + "'");
      }
      return container.dict().find(item) != nullptr;
    case Kind::kSeq:
    case Kind::kIter:
      for (const Value& v : iterate(container)) {
        if (equal(v, item)) return true;
      }
      return false;
    default:
      break;
  }
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

CallArgs Evaluator::eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v, scope));
  if (e.dyn_args) {
    for (Value& v : iterate(eval(*e.dyn_args, scope))) a.args.push_back(std::move(v));
  }
  if (e.dyn_kwargs) {
    const Value d = eval(*e.dyn_kwargs, scope);
    if (d.kind() != Kind::kDict) fail("argument after ** must be a mapping, not " + type_name(d));
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_string()) fail("keywords must be strings");
      a.kwargs.emplace_back(k.str(), v);
    }
  }
  return a;
}

Value Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  pos_ = e.pos;
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName: {
      if (const Value* v = scope->find(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::kNSRef:
      fail("a namespace attribute can only be assigned");
    case ExprKind::kGetattr: {
      const Value obj = eval(*e.args[0], scope);
      pos_ = e.pos;
      return getattr(obj, e.name);
    }
    case ExprKind::kGetitem: {
      const Value obj = eval(*e.args[0], scope);
      if (e.args[1]->kind == ExprKind::kSlice) return eval_slice(obj, *e.args[1], scope);
      const Value key = eval(*e.args[1], scope);
      pos_ = e.pos;
      return getitem(obj, key);
    }
    case ExprKind::kSlice:
      fail("a slice outside of []");
    case ExprKind::kCall: {
      const Value callee = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, 1, scope);
      pos_ = e.pos;
      return call(callee, args);
    }
    case ExprKind::kFilter: {
      const Value input = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, 1, scope);
      pos_ = e.pos;
      if (!filter_supported(e.builtin)) {
        fail(e.builtin < 0 ? "No filter named '" + e.name + "' found."
                           : "the filter '" + e.name + "' is not supported");
      }
      return apply_filter(e.builtin, input, args);
    }
    case ExprKind::kTest: {
      const Value input = eval(*e.args[0], scope);
      CallArgs args = eval_args(e, 1, scope);
      pos_ = e.pos;
      if (e.builtin < 0) fail("No test named '" + e.name + "' found.");
      return Value::boolean(apply_test(e.builtin, input, args));
    }
    case ExprKind::kNot:
      return Value::boolean(!truthy(eval(*e.args[0], scope)));
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      const Value v = eval(*e.args[0], scope);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) {
        fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") +
             ": '" + type_name(v) + "'");
      }
      if (e.kind == ExprKind::kPos) return v.is_integral() ? Value::integer(v.as_int()) : v;
      if (v.kind() == Kind::kFloat) return Value::floating(-v.as_double());
      return Value::integer(checked_mul(v.as_int(), -1));
    }
    case ExprKind::kBinary: {
      const Value a = eval(*e.args[0], scope);
      const Value b = eval(*e.args[1], scope);
      pos_ = e.pos;
      return binary(e.op, a, b);
    }
    case ExprKind::kConcat: {
      std::string s;
      for (const auto& a : e.args) append_str(s, eval(*a, scope));
      return Value::string(std::move(s));
    }
    case ExprKind::kCompare:
      return eval_compare(e, scope);
    case ExprKind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return truthy(a) ? eval(*e.args[1], scope) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.args[0], scope);
      return truthy(a) ? a : eval(*e.args[1], scope);
    }
    case ExprKind::kCondExpr: {
      if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) items.push_back(eval(*a, scope));
      return e.kind == ExprKind::kList ? Value::list(std::move(items))
                                       : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope);
        if (k.kind() == Kind::kSeq && k.seq().kind == SeqKind::kList)
          fail("unhashable type: 'list'");
        if (k.kind() == Kind::kDict) fail("unhashable type: 'dict'");
        d->set(std::move(k), eval(*e.args[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
  }
  fail("unknown expression");
}

Value Evaluator::binary(const std::string& op, const Value& a, const Value& b) {
  // str % x formats before anything else looks at x (an Undefined x included, as in Python).
  if (op == "%" && a.is_string()) return Value::string(percent_format(a.str(), b));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(checked_add(a.as_int(), b.as_int()));
    if (nums) return Value::floating(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.markup() || b.markup()) {
        return Value::string((a.markup() ? a.str() : html_escape(a.str())) +
                                 (b.markup() ? b.str() : html_escape(b.str())),
                             true);
      }
      return Value::string(a.str() + b.str());
    }
    if (is_plain_seq(a) && is_plain_seq(b) && a.seq().kind == b.seq().kind) {
      std::vector<Value> items = a.seq().items;
      items.insert(items.end(), b.seq().items.begin(), b.seq().items.end());
      return Value::sequence(a.seq().kind, std::move(items));
    }
    if (a.is_string() || is_plain_seq(a)) {
      fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
           type_name(a));
    }
  } else if (op == "-") {
    if (ints) return Value::integer(checked_add(a.as_int(), checked_mul(b.as_int(), -1)));
    if (nums) return Value::floating(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) return Value::integer(checked_mul(a.as_int(), b.as_int()));
    if (nums) return Value::floating(a.as_double() * b.as_double());
    const Value& s = a.is_integral() ? b : a;
    const Value& n = a.is_integral() ? a : b;
    if (n.is_integral() && s.is_string()) {
      std::string out;
      for (int64_t k = 0; k < n.as_int(); ++k) out += s.str();
      return Value::string(std::move(out), s.markup());
    }
    if (n.is_integral() && is_plain_seq(s)) return repeat(s.seq().items, s.seq().kind, n.as_int());
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0.0) fail("division by zero");
      return Value::floating(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) fail("integer overflow: strata's integers are 64-bit");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (nums) {
      const auto [q, r] =
          float_divmod(a.as_double(), b.as_double(), op == "//" ? "floor division" : "modulo");
      return Value::floating(op == "//" ? q : r);
    }
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1, base = a.as_int();
      for (int64_t k = b.as_int(); k > 0; k >>= 1) {
        if (k & 1) r = checked_mul(r, base);
        if (k > 1) base = checked_mul(base, base);
      }
      return Value::integer(r);
    }
    if (nums) {
      const double x = a.as_double(), y = b.as_double();
      if (x == 0.0 && y < 0) fail("0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) fail("a negative number to a fractional power is complex");
      return Value::floating(std::pow(x, y));
    }
  }
  fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

Value Evaluator::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.args[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1], scope);
    pos_ = e.pos;
    const std::string& op = e.ops[i];
    bool ok = false;
    if (op == "eq") {
      ok = equal(left, right);
    } else if (op == "ne") {
      ok = !equal(left, right);
    } else if (op == "in" || op == "notin") {
      ok = contains(right, left) == (op == "in");
    } else {
      if (left.is_undefined()) fail_undefined(left);
      if (right.is_undefined()) fail_undefined(right);
      const int c = compare(left, right);
      ok = op == "lt" ? c < 0 : op == "lteq" ? c <= 0 : op == "gt" ? c > 0 : c >= 0;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Evaluator::eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope) {
  std::optional<int64_t> bound[3];
  bool valid = true;
  for (int k = 0; k < 3; ++k) {
    if (!slice.args[size_t(k)]) continue;
    const Value v = eval(*slice.args[size_t(k)], scope);
    if (v.is_integral()) {
      bound[k] = v.as_int();
    } else if (!v.is_none()) {
      valid = false;
    }
  }
  pos_ = slice.pos;
  if (obj.is_undefined()) fail_undefined(obj);
  const bool sliceable = obj.is_string() || is_plain_seq(obj) ||
                         (obj.kind() == Kind::kSeq && obj.seq().kind == SeqKind::kRange);
  if (!valid || !sliceable)
    return Value::undefined(object_type_repr(obj) + " has no element slice");
  const int64_t step = bound[2].value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  const std::vector<char32_t> cps =
      obj.is_string() ? decode_utf8(obj.str()) : std::vector<char32_t>{};
  const int64_t n = obj.is_string() ? int64_t(cps.size()) : int64_t(obj.seq().items.size());
  auto adjust = [&](std::optional<int64_t> b, int64_t fallback) {
    if (!b) return fallback;
    int64_t i = *b;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t start = adjust(bound[0], step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(bound[1], step < 0 ? -1 : n);
  std::vector<size_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(size_t(i));
  if (obj.is_string()) {
    std::string s;
    for (size_t i : picked) append_utf8(s, cps[i]);
    return Value::string(std::move(s));
  }
  std::vector<Value> items;
  for (size_t i : picked) items.push_back(obj.seq().items[i]);
  return Value::sequence(obj.seq().kind == SeqKind::kTuple ? SeqKind::kTuple : SeqKind::kList,
                         std::move(items));
}

Value Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.kind() != Kind::kObject || !callee.obj().callable()) {
    fail("'" + type_name(callee) + "' object is not callable");
  }
  return callee.obj().call(*this, args);
}

Value Evaluator::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind() == Kind::kObject) {
    if (std::optional<Value> v = obj.obj().attribute(name)) return *v;
    return undefined_attribute(obj, name);
  }
  if (std::optional<Value> m = method(obj, name)) return *m;
  if (obj.kind() == Kind::kDict) {
    if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
  }
  return undefined_attribute(obj, name);
}

Value Evaluator::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind() == Kind::kDict) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if ((is_plain_seq(obj) ||
              (obj.kind() == Kind::kSeq && obj.seq().kind == SeqKind::kRange) || obj.is_string()) &&
             key.is_integral()) {
    std::vector<char32_t> cps;
    if (obj.is_string()) cps = decode_utf8(obj.str());
    const int64_t n = obj.is_string() ? int64_t(cps.size()) : int64_t(obj.seq().items.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (!obj.is_string()) return obj.seq().items[size_t(i)];
      std::string s;
      append_utf8(s, cps[size_t(i)]);
      return Value::string(std::move(s));
    }
    return undefined_element(obj, key);
  }
  if (key.is_string()) {
    if (obj.kind() == Kind::kObject) {
      if (std::optional<Value> v = obj.obj().attribute(key.str())) return *v;
    } else if (std::optional<Value> m = method(obj, key.str())) {
      return *m;
    }
  }
  return undefined_element(obj, key);
}

}  // namespace strata::data::jinja
