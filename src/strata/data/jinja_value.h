// The values of the chat-template engine (jinja.h): Python's None, bool, int, float, str, list,
// tuple, dict, jinja2's Undefined, one-shot iterators and objects (namespaces, macros, methods),
// with Python's str(), repr(), ==, <, truth and json.dumps.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::data::jinja {

// A template error without a position; the evaluator adds the template's name and line.
struct TemplateError {
  std::string message;
  bool raised = false;  // raise_exception(message) in the template
};
[[noreturn]] void fail(std::string message);

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kSeq, kDict, kIter, kObject };

// What a sequence is to Python: its repr() differs (list [..], tuple (..), dict_items([..]) ...).
enum class SeqKind { kList, kTuple, kDictItems, kDictKeys, kDictValues, kRange };

struct Sequence;
struct Dict;
struct Iterator;
struct Object;

class Value {
 public:
  Value() = default;  // Undefined
  static Value undefined(std::string message);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s, bool markup = false);
  static Value sequence(SeqKind kind, std::vector<Value> items);
  static Value list(std::vector<Value> items) { return sequence(SeqKind::kList, std::move(items)); }
  static Value tuple(std::vector<Value> items) {
    return sequence(SeqKind::kTuple, std::move(items));
  }
  static Value range(int64_t start, int64_t stop, int64_t step);
  static Value dict(std::shared_ptr<Dict> d);
  // A one-shot iterator (a generator or reversed()): `type` names it in errors.
  static Value iterator(std::vector<Value> items, std::string type);
  static Value object(std::shared_ptr<Object> o);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  // bool, int or float (Python's bool is an int).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? int64_t(b_) : i_; }  // bool or int
  double as_double() const { return kind_ == Kind::kFloat ? f_ : double(as_int()); }
  const std::string& str() const { return *str_; }  // kString; kUndefined: its message
  bool markup() const { return markup_; }           // jinja2's Markup (from safe and escape)
  const Sequence& seq() const { return *static_cast<const Sequence*>(ptr_.get()); }
  const Dict& dict() const { return *static_cast<const Dict*>(ptr_.get()); }
  Iterator& iter() const { return *static_cast<Iterator*>(ptr_.get()); }
  Object& obj() const { return *static_cast<Object*>(ptr_.get()); }
  const void* identity() const { return ptr_.get(); }

 private:
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<void> ptr_;
};

struct Sequence {
  SeqKind kind = SeqKind::kList;
  std::vector<Value> items;
  int64_t start = 0, stop = 0, step = 1;  // kRange: what repr() shows
};

// A Python dict: insertion order kept, looked up by ==.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces an equal key in place, else appends
};

struct Iterator {
  std::vector<Value> items;
  std::string type;  // "generator", "list_reverseiterator", ...
  bool consumed = false;
};

class Evaluator;
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Namespaces, macros, bound methods, loop contexts, builtins.
struct Object {
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // Python's type(x).__name__
  virtual std::string repr() const;           // refuses by default (Python prints an address)
  // An attribute, or nullopt when there is none.
  virtual std::optional<Value> attribute(const std::string& name) const;
  virtual bool callable() const { return false; }
  virtual Value call(Evaluator& ev, CallArgs& args);
};

// jinja2's Namespace: the one object templates may change ({% set ns.x = ... %}).
struct Namespace : Object {
  Dict attrs;
  std::string type_name() const override { return "Namespace"; }
  std::string repr() const override;
  std::optional<Value> attribute(const std::string& name) const override;
};

// Python's type name of a value: 'int', 'str', 'NoneType', 'Undefined', ...
std::string type_name(const Value& v);
// jinja2's object_type_repr: "dict object", "None", ... (for undefined-attribute messages).
std::string object_type_repr(const Value& v);

bool truthy(const Value& v);
// str(v): what {{ v }} prints (Undefined prints nothing).
std::string to_str(const Value& v);
void append_str(std::string& out, const Value& v);
// repr(v): what a value looks like inside a printed list or dict.
std::string repr(const Value& v);
// Python's repr() of a float: shortest round-trip digits, 1e+16 and 1e-05 past the fixed range.
std::string float_repr(double f);

bool equal(const Value& a, const Value& b);
// a < b, a type error as Python's for values that do not order.
bool less(const Value& a, const Value& b);
// -1, 0, 1 for numbers and strings (sort keys); a type error otherwise.
int compare(const Value& a, const Value& b);

// The elements a for loop or list() visits: characters of a str, keys of a dict; an iterator is
// consumed; Undefined has none. A type error for values that are not iterable.
std::vector<Value> iterate(const Value& v);
// len(v), a type error where Python has none (generators, numbers).
int64_t length(const Value& v);

// transformers' tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys).
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // an int indent becomes that many spaces
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

// The context's JSON as values: objects become dicts in their key order.
Value from_json(const nlohmann::ordered_json& j);

}  // namespace strata::data::jinja
