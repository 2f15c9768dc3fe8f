// The chat-template engine's (jinja.h) evaluator: scopes as jinja2 makes them (a for loop's
// iteration, a macro call and a block's capture each get their own; if does not), statements and
// expressions, and the builtins (filters, tests, globals, Python methods) it calls.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/data/jinja_syntax.h"
#include "strata/data/jinja_value.h"

namespace strata::data::jinja {

// Variables of one scope; lookups go outwards to the parent, then the render's globals.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);
};
using ScopePtr = std::shared_ptr<Scope>;

// Where rendered text goes: the template's output, or a capture (macro call, set block, filter
// block, caller) that becomes a value.
struct Output {
  std::string text;
  bool root = false;
};

enum class Flow { kNormal, kBreak, kContinue };

class Evaluator {
 public:
  // `globals` are the render's context variables over jinja2's and transformers' globals.
  Evaluator(const Program& program, ScopePtr globals);
  // Breaks the cycles of macros and the scopes they close over and are kept in.
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Renders the program; `spans` gets the generation blocks' byte ranges.
  std::string run(std::vector<std::pair<size_t, size_t>>* spans);

  Flow exec(const Body& body, const ScopePtr& scope, Output& out);
  Value eval(const Expr& e, const ScopePtr& scope);
  // Renders `body` into a string in a new scope under `scope`.
  std::string capture(const Body& body, const ScopePtr& scope);

  Value call(const Value& callee, CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  // A filter or test by builtin index (builtins below) on `input`.
  Value apply_filter(int index, const Value& input, CallArgs& args);
  bool apply_test(int index, const Value& input, CallArgs& args);
  // Filters and tests by name, as map() and select() take them.
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);

  // a op b for op in + - * / // % ** (Python's semantics on these values).
  Value binary(const std::string& op, const Value& a, const Value& b);

  Pos pos() const { return pos_; }
  int depth = 0;  // macro calls in progress (recursion limit)

 private:
  void assign(const Expr& target, const Value& value, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, Output& out);
  // A block's filter chain (innermost argument null) on `input`.
  Value apply_filters(const Expr& chain, Value input, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope);
  Value eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope);

  const Program& program_;
  ScopePtr globals_;
  Pos pos_;
  // transformers' AssistantTracker: spans are kept once anything was output.
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;
  Output* root_ = nullptr;
  bool root_written_ = false;
  std::vector<ScopePtr> macro_scopes_;  // scopes a macro was defined in
};

// A function or bound method implemented here (range, "a".upper, loop.cycle, ...).
struct Builtin : Object {
  using Fn = std::function<Value(Evaluator&, CallArgs&)>;
  Builtin(std::string name, Fn fn) : name(std::move(name)), fn(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  bool callable() const override { return true; }
  Value call(Evaluator& ev, CallArgs& args) override { return fn(ev, args); }
  std::string name;
  Fn fn;
};
Value builtin(std::string name, Builtin::Fn fn);

// Reads a builtin's arguments as Python binds them: positionally, then by keyword.
class ArgReader {
 public:
  ArgReader(const std::string& function, CallArgs& args) : function_(function), args_(args) {}
  // The next parameter: positional argument, else keyword `name`, else `fallback` (required
  // when fallback is null).
  Value next(const char* name, const Value* fallback = nullptr);
  Value next_or(const char* name, Value fallback) { return next(name, &fallback); }
  std::vector<Value> rest();  // *args
  // Fails for anything left over.
  void done();

 private:
  const std::string& function_;
  CallArgs& args_;
  size_t used_ = 0;
};

// The builtin tables. A filter or test is looked up by name once, when parsed: a negative index
// means jinja2 does not know the name; `supported` says whether strata implements it.
int filter_index(const std::string& name);
int test_index(const std::string& name);
bool filter_supported(int index);
Value run_filter(Evaluator& ev, int index, const Value& input, CallArgs& args);
bool run_test(Evaluator& ev, int index, const Value& input, CallArgs& args);

// A Python method of a str, list or dict (`"a".upper`), or nullopt when there is none.
std::optional<Value> method(const Value& receiver, const std::string& name);
// jinja2's and transformers' globals: range, dict, namespace, cycler, joiner, raise_exception,
// strftime_now.
void add_globals(Scope& scope);
// Python's `%` string formatting (the format filter and `"..." % x`).
std::string percent_format(const std::string& format, const Value& args);

// Python's `item in container`.
bool contains(const Value& container, const Value& item);

// int64 arithmetic that fails on overflow instead of wrapping.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);

}  // namespace strata::data::jinja
