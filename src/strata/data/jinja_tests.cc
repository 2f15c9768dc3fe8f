// jinja2's builtin tests (jinja2/tests.py), with Python's semantics on strata's values.
#include <algorithm>

#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_text.h"

namespace strata::data::jinja {
namespace {

const std::vector<std::string>& test_table() {
  static const std::vector<std::string> table = {
      "odd",    "even",     "divisibleby", "defined",     "undefined", "filter",   "test",
      "none",   "boolean",  "false",       "true",        "integer",   "float",    "lower",
      "upper",  "string",   "mapping",     "number",      "sequence",  "iterable", "callable",
      "sameas", "escaped",  "in",          "==",          "eq",        "equalto",  "!=",
      "ne",     ">",        "gt",          "greaterthan", "ge",        ">=",       "<",
      "lt",     "lessthan", "<=",          "le"};
  return table;
}

}  // namespace

int test_index(const std::string& name) {
  const auto& t = test_table();
  const auto it = std::find(t.begin(), t.end(), name);
  return it == t.end() ? -1 : int(it - t.begin());
}

bool run_test(Evaluator& ev, int index, const Value& v, CallArgs& a) {
  const std::string& name = test_table()[size_t(index)];
  ArgReader r(name, a);
  if (name == "defined" || name == "undefined") {
    r.done();
    return v.is_undefined() == (name == "undefined");
  }
  if (name == "divisibleby") {
    const Value num = r.next("num");
    r.done();
    return equal(ev.binary("%", v, num), Value::integer(0));
  }
  if (name == "sameas") {
    const Value other = r.next("other");
    r.done();
    if (v.kind() != other.kind()) return false;
    switch (v.kind()) {
      case Kind::kNone:
        return true;
      case Kind::kBool:
        return v.as_bool() == other.as_bool();
      case Kind::kInt:
        return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
      case Kind::kFloat:
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        return v.str() == other.str() && v.str().size() <= 1;
      default:
        return v.identity() == other.identity();
    }
  }
  if (name == "in") {
    const Value seq = r.next("seq");
    r.done();
    return contains(seq, v);
  }
  static const std::vector<std::pair<std::vector<std::string>, std::string>> comparisons = {
      {{"==", "eq", "equalto"}, "eq"},    {{"!=", "ne"}, "ne"},
      {{">", "gt", "greaterthan"}, "gt"}, {{">=", "ge"}, "ge"},
      {{"<", "lt", "lessthan"}, "lt"},    {{"<=", "le"}, "le"}};
  for (const auto& [names, op] : comparisons) {
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    const Value other = r.next("other");
    r.done();
    if (op == "eq") return equal(v, other);
    if (op == "ne") return !equal(v, other);
    if (v.is_undefined()) fail(v.str());
    if (other.is_undefined()) fail(other.str());
    const int c = compare(v, other);
    return op == "gt" ? c > 0 : op == "ge" ? c >= 0 : op == "lt" ? c < 0 : c <= 0;
  }
  r.done();
  if (name == "odd" || name == "even") {
    const Value rem = ev.binary("%", v, Value::integer(2));
    return equal(rem, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "filter") return v.is_string() && filter_index(v.str()) >= 0;
  if (name == "test") return v.is_string() && test_index(v.str()) >= 0;
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "false") return v.kind() == Kind::kBool && !v.as_bool();
  if (name == "true") return v.kind() == Kind::kBool && v.as_bool();
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "lower") return is_lower(to_str(v));
  if (name == "upper") return is_upper(to_str(v));
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Kind::kDict;
  if (name == "number") return v.is_number();
  if (name == "escaped") return v.is_string() && v.markup();
  if (name == "callable") {
    return v.is_undefined() || (v.kind() == Kind::kObject && v.obj().callable());
  }
  if (name == "sequence") {
    if (v.kind() == Kind::kSeq) {
      return v.seq().kind != SeqKind::kDictItems && v.seq().kind != SeqKind::kDictKeys &&
             v.seq().kind != SeqKind::kDictValues;
    }
    return v.is_undefined() || v.is_string() || v.kind() == Kind::kDict;
  }
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.kind() == Kind::kSeq || v.kind() == Kind::kDict ||
           v.kind() == Kind::kIter ||
           (v.kind() == Kind::kObject && v.obj().type_name() == "LoopContext");
  }
  fail("unsupported test '" + name + "'");
}

}  // namespace strata::data::jinja
