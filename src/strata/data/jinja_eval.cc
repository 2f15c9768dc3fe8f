// The evaluator's statements (jinja_eval.h): scopes, output and captures, for loops and their
// LoopContext, assignments, macros and call blocks, generation spans; and the builtins' argument
// reader.
#include "strata/data/jinja_eval.h"

#include <cmath>

#include "strata/data/jinja_text.h"

namespace strata::data::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

Value builtin(std::string name, Builtin::Fn fn) {
  return Value::object(std::make_shared<Builtin>(std::move(name), std::move(fn)));
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail("integer overflow: strata's integers are 64-bit");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow: strata's integers are 64-bit");
  return r;
}

namespace {

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

// jinja2's LoopContext over the (filtered) items of a for loop.
struct LoopContext : Object {
  std::vector<Value> items;
  size_t index0 = 0;
  std::optional<Value> last_changed;

  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items.size()) + ">";
  }
  std::optional<Value> attribute(const std::string& name) const override {
    const auto n = int64_t(items.size());
    const auto i = int64_t(index0);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i + 1 == n);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(1);
    if (name == "depth0") return Value::integer(0);
    if (name == "previtem") {
      return i == 0 ? Value::undefined("there is no previous item") : items[index0 - 1];
    }
    if (name == "nextitem") {
      return i + 1 == n ? Value::undefined("there is no next item") : items[index0 + 1];
    }
    std::shared_ptr<LoopContext> self = weak_self.lock();
    if (name == "cycle") {
      return builtin("cycle", [self](Evaluator&, CallArgs& a) {
        if (a.args.empty()) fail("no items for cycling given");
        return a.args[self->index0 % a.args.size()];
      });
    }
    if (name == "changed") {
      return builtin("changed", [self](Evaluator&, CallArgs& a) {
        Value now = Value::tuple(a.args);
        if (self->last_changed && equal(*self->last_changed, now)) return Value::boolean(false);
        self->last_changed = now;
        return Value::boolean(true);
      });
    }
    return std::nullopt;
  }
  // The loop's own pointer, for the cycle and changed methods it hands out.
  std::weak_ptr<LoopContext> weak_self;
};

// A {% macro %} or a {% call %} block's caller, closed over the scope it was defined in.
struct Macro : Object {
  const Stmt* def = nullptr;
  ScopePtr closure;
  std::string name;

  std::string type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro " + quote(name) + ">"; }
  bool callable() const override { return true; }

  Value call(Evaluator& ev, CallArgs& a) override {
    if (ev.depth >= 100) fail("macro calls nested deeper than 100: a recursive macro?");
    const size_t n = def->params.size();
    ScopePtr scope = child(closure);
    std::vector<std::optional<Value>> bound(n);
    for (size_t i = 0; i < n && i < a.args.size(); ++i) bound[i] = a.args[i];
    auto d = std::make_shared<Dict>();
    std::optional<Value> caller;
    for (auto& [key, value] : a.kwargs) {
      auto it = std::find(def->params.begin(), def->params.end(), key);
      const size_t at = size_t(it - def->params.begin());
      if (it != def->params.end() && at >= a.args.size()) {
        bound[at] = value;
      } else if (key == "caller" && def->uses_caller) {
        caller = value;
      } else if (def->uses_kwargs) {
        d->set(Value::string(key), value);
      } else {
        fail("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
    }
    if (a.args.size() > n && !def->uses_varargs) {
      fail("macro '" + name + "' takes not more than " + std::to_string(n) + " argument(s)");
    }
    const size_t first_default = n - def->defaults.size();
    for (size_t i = 0; i < n; ++i) {
      Value v;
      if (bound[i]) {
        v = *bound[i];
      } else if (i >= first_default) {
        v = ev.eval(*def->defaults[i - first_default], scope);
      } else {
        v = Value::undefined("parameter '" + def->params[i] + "' was not provided");
      }
      scope->set(def->params[i], std::move(v));
    }
    if (def->uses_varargs) {
      std::vector<Value> rest;
      for (size_t i = n; i < a.args.size(); ++i) rest.push_back(a.args[i]);
      scope->set("varargs", Value::tuple(std::move(rest)));
    }
    if (def->uses_kwargs) scope->set("kwargs", Value::dict(d));
    if (def->uses_caller)
      scope->set("caller", caller ? *caller : Value::undefined("No caller defined"));
    ++ev.depth;
    Output out;
    ev.exec(def->body, scope, out);
    --ev.depth;
    return Value::string(std::move(out.text));
  }
};

}  // namespace

Evaluator::Evaluator(const Program& program, ScopePtr globals)
    : program_(program), globals_(std::move(globals)) {}

Evaluator::~Evaluator() {
  for (const ScopePtr& scope : macro_scopes_) scope->vars.clear();
}

std::string Evaluator::run(std::vector<std::pair<size_t, size_t>>* spans) {
  Output out;
  out.root = true;
  root_ = &out;
  spans_ = spans;
  exec(program_.body, child(globals_), out);
  return std::move(out.text);
}

std::string Evaluator::capture(const Body& body, const ScopePtr& scope) {
  Output out;
  exec(body, child(scope), out);
  return std::move(out.text);
}

namespace {
void write(Output& out, const std::string& text, bool& root_written) {
  out.text += text;
  if (out.root) root_written = true;
}
}  // namespace

Flow Evaluator::exec(const Body& body, const ScopePtr& scope, Output& out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    pos_ = s.pos;
    switch (s.kind) {
      case StmtKind::kData:
        write(out, s.text, root_written_);
        break;
      case StmtKind::kOutput:
        write(out, to_str(eval(*s.expr, scope)), root_written_);
        break;
      case StmtKind::kIf: {
        const Body* taken = &s.else_body;
        for (const auto& [test, branch] : s.branches) {
          if (truthy(eval(*test, scope))) {
            taken = &branch;
            break;
          }
        }
        const Flow flow = exec(*taken, scope, out);
        if (flow != Flow::kNormal) return flow;
        break;
      }
      case StmtKind::kFor:
        exec_for(s, scope, out);
        break;
      case StmtKind::kSet:
        assign(*s.target, eval(*s.expr, scope), scope);
        break;
      case StmtKind::kSetBlock: {
        Value v = Value::string(capture(s.body, scope));
        if (s.filter) v = apply_filters(*s.filter, v, scope);
        assign(*s.target, v, scope);
        break;
      }
      case StmtKind::kMacro: {
        auto m = std::make_shared<Macro>();
        m->def = &s;
        m->closure = scope;
        m->name = s.name;
        scope->set(s.name, Value::object(m));
        macro_scopes_.push_back(scope);
        break;
      }
      case StmtKind::kCallBlock: {
        auto caller = std::make_shared<Macro>();
        caller->def = &s;
        caller->closure = scope;
        caller->name = "caller";
        const Expr& call_expr = *s.expr;
        const Value callee = eval(*call_expr.args[0], scope);
        CallArgs args = eval_args(call_expr, 1, scope);
        args.kwargs.emplace_back("caller", Value::object(caller));
        write(out, to_str(call(callee, args)), root_written_);
        break;
      }
      case StmtKind::kFilterBlock: {
        const Value v = apply_filters(*s.filter, Value::string(capture(s.body, scope)), scope);
        write(out, to_str(v), root_written_);
        break;
      }
      case StmtKind::kWith: {
        ScopePtr inner = child(scope);
        for (const auto& [name, value] : s.assigns) inner->set(name, eval(*value, scope));
        const Flow flow = exec(s.body, inner, out);
        if (flow != Flow::kNormal) return flow;
        break;
      }
      case StmtKind::kGeneration: {
        const std::string text = capture(s.body, scope);
        const size_t start = root_->text.size();
        if (spans_ != nullptr && (root_written_ || !spans_->empty())) {
          spans_->emplace_back(start, start + text.size());
        }
        write(out, text, root_written_);
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

Value Evaluator::apply_filters(const Expr& chain, Value input, const ScopePtr& scope) {
  if (chain.args[0]) input = apply_filters(*chain.args[0], std::move(input), scope);
  CallArgs args = eval_args(chain, 1, scope);
  pos_ = chain.pos;
  return apply_filter(chain.builtin, input, args);
}

Flow Evaluator::exec_for(const Stmt& s, const ScopePtr& scope, Output& out) {
  std::vector<Value> items = iterate(eval(*s.expr, scope));
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      ScopePtr test_scope = child(scope);
      assign(*s.target, item, test_scope);
      if (truthy(eval(*s.cond, test_scope))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, child(scope), out);
    return Flow::kNormal;
  }
  auto loop = std::make_shared<LoopContext>();
  loop->weak_self = loop;
  loop->items = items;
  const Value loop_value = Value::object(loop);
  for (size_t i = 0; i < items.size(); ++i) {
    loop->index0 = i;
    ScopePtr iteration = child(scope);
    assign(*s.target, items[i], iteration);
    iteration->set("loop", loop_value);
    if (exec(s.body, iteration, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Evaluator::assign(const Expr& target, const Value& value, const ScopePtr& scope) {
  if (target.kind == ExprKind::kName) {
    scope->set(target.name, value);
    return;
  }
  if (target.kind == ExprKind::kNSRef) {
    const Value* ns = scope->find(target.name);
    auto* n = ns != nullptr && ns->kind() == Kind::kObject ? dynamic_cast<Namespace*>(&ns->obj())
                                                           : nullptr;
    if (n == nullptr) fail("cannot assign attribute on non-namespace object");
    n->attrs.set(Value::string(target.op), value);
    return;
  }
  const std::vector<Value> items = iterate(value);
  if (items.size() != target.args.size()) {
    fail(items.size() > target.args.size()
             ? "too many values to unpack (expected " + std::to_string(target.args.size()) + ")"
             : "not enough values to unpack (expected " + std::to_string(target.args.size()) +
                   ", got " + std::to_string(items.size()) + ")");
  }
  for (size_t i = 0; i < items.size(); ++i) assign(*target.args[i], items[i], scope);
}

Value Evaluator::apply_filter(int index, const Value& input, CallArgs& args) {
  return run_filter(*this, index, input, args);
}

bool Evaluator::apply_test(int index, const Value& input, CallArgs& args) {
  return run_test(*this, index, input, args);
}

Value Evaluator::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  const int index = filter_index(name);
  if (!filter_supported(index)) {
    fail(index < 0 ? "No filter named '" + name + "'."
                   : "the filter '" + name + "' is not supported");
  }
  return run_filter(*this, index, input, args);
}

bool Evaluator::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  const int index = test_index(name);
  if (index < 0) fail("No test named '" + name + "'.");
  return run_test(*this, index, input, args);
}

Value ArgReader::next(const char* name, const Value* fallback) {
  if (used_ < args_.args.size()) return args_.args[used_++];
  ++used_;
  for (auto it = args_.kwargs.begin(); it != args_.kwargs.end(); ++it) {
    if (it->first == name) {
      Value v = std::move(it->second);
      args_.kwargs.erase(it);
      return v;
    }
  }
  if (fallback == nullptr) fail(function_ + "() missing required argument '" + name + "'");
  return *fallback;
}

std::vector<Value> ArgReader::rest() {
  std::vector<Value> out;
  for (size_t i = used_; i < args_.args.size(); ++i) out.push_back(args_.args[i]);
  used_ = std::max(used_, args_.args.size());
  return out;
}

void ArgReader::done() {
  if (used_ < args_.args.size()) {
    fail(function_ + "() takes at most " + std::to_string(used_) + " argument(s) (" +
         std::to_string(args_.args.size()) + " given)");
  }
  if (!args_.kwargs.empty()) {
    fail(function_ + "() got an unexpected keyword argument '" + args_.kwargs.front().first + "'");
  }
}

}  // namespace strata::data::jinja
