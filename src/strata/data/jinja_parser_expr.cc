// jinja2's parser, expressions: precedence from conditional expressions down to literals, filters,
// tests, calls and subscripts (jinja_parser.h).
#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_parser.h"

namespace strata::data::jinja {

ExprPtr Parser::parse_assign_target(bool with_tuple, bool name_only, const Rules* extra,
                                    bool with_namespace) {
  ExprPtr target;
  if (name_only) {
    const Token& t = expect("name");
    target = node(ExprKind::kName, t.pos);
    target->name = t.value;
  } else if (with_tuple) {
    target = parse_tuple(true, true, extra, false, with_namespace);
  } else {
    target = parse_primary(with_namespace);
  }
  check_assignable(*target);
  return target;
}

void Parser::check_assignable(const Expr& e) {
  if (e.kind == ExprKind::kName || e.kind == ExprKind::kNSRef) return;
  if (e.kind == ExprKind::kTuple) {
    for (const auto& a : e.args) check_assignable(*a);
    return;
  }
  fail_at(e.kind == ExprKind::kConst ? "can't assign to 'const'" : "can't assign to this", e.pos);
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  Nesting guard(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr1 = parse_or();
  while (at("name:if")) {
    const Pos pos = next().pos;
    auto e = node(ExprKind::kCondExpr, pos);
    e->args.push_back(parse_or());
    e->args.push_back(std::move(expr1));
    e->args.push_back(skip_if("name:else") ? parse_condexpr() : nullptr);
    expr1 = std::move(e);
  }
  return expr1;
}

ExprPtr Parser::binary(ExprKind kind, ExprPtr left, ExprPtr right, Pos pos) {
  auto e = node(kind, pos);
  e->args.push_back(std::move(left));
  e->args.push_back(std::move(right));
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (at("name:or")) {
    const Pos pos = next().pos;
    left = binary(ExprKind::kOr, std::move(left), parse_and(), pos);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (at("name:and")) {
    const Pos pos = next().pos;
    left = binary(ExprKind::kAnd, std::move(left), parse_not(), pos);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  Nesting guard(*this);
  if (at("name:not")) {
    auto e = node(ExprKind::kNot, next().pos);
    e->args.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Pos pos = cur().pos;
  ExprPtr expr = parse_math1();
  ExprPtr cmp;
  while (true) {
    static const std::vector<std::pair<std::string, std::string>> ops = {
        {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"<=", "lteq"}, {">", "gt"}, {">=", "gteq"}};
    std::string op;
    for (const auto& [symbol, name] : ops) {
      if (at(symbol)) op = name;
    }
    if (!op.empty()) {
      next();
    } else if (skip_if("name:in")) {
      op = "in";
    } else if (at("name:not") && test(look(), "name:in")) {
      next();
      next();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(ExprKind::kCompare, pos);
      cmp->args.push_back(std::move(expr));
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(expr);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (at("+") || at("-")) {
    const Token& t = next();
    auto e = binary(ExprKind::kBinary, std::move(left), nullptr, t.pos);
    e->op = t.value;
    e->args[1] = parse_concat();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  const Pos pos = cur().pos;
  ExprPtr first = parse_math2();
  if (!at("~")) return first;
  auto e = node(ExprKind::kConcat, pos);
  e->args.push_back(std::move(first));
  while (skip_if("~")) e->args.push_back(parse_math2());
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (at("*") || at("/") || at("//") || at("%")) {
    const Token& t = next();
    auto e = binary(ExprKind::kBinary, std::move(left), nullptr, t.pos);
    e->op = t.value;
    e->args[1] = parse_pow();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (at("**")) {
    const Pos pos = next().pos;
    auto e = binary(ExprKind::kBinary, std::move(left), parse_unary(true), pos);
    e->op = "**";
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  Nesting guard(*this);
  ExprPtr e;
  if (at("-") || at("+")) {
    const Token& t = next();
    e = node(t.value == "-" ? ExprKind::kNeg : ExprKind::kPos, t.pos);
    e->args.push_back(parse_unary(false));
  } else {
    e = parse_primary(false);
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary(bool with_namespace) {
  const Token& t = cur();
  if (t.type == Tok::kName) {
    next();
    if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
      auto e = node(ExprKind::kConst, t.pos);
      e->value = Value::boolean(t.value == "true" || t.value == "True");
      return e;
    }
    if (t.value == "none" || t.value == "None") {
      auto e = node(ExprKind::kConst, t.pos);
      e->value = Value::none();
      return e;
    }
    if (with_namespace && at(".")) {
      next();
      auto e = node(ExprKind::kNSRef, t.pos);
      e->name = t.value;
      e->op = expect("name").value;
      return e;
    }
    auto e = node(ExprKind::kName, t.pos);
    e->name = t.value;
    return e;
  }
  if (t.type == Tok::kString) {
    auto e = node(ExprKind::kConst, t.pos);
    std::string s;
    while (cur().type == Tok::kString) s += next().literal.str();
    e->value = Value::string(std::move(s));
    return e;
  }
  if (t.type == Tok::kInt || t.type == Tok::kFloat) {
    auto e = node(ExprKind::kConst, t.pos);
    e->value = next().literal;
    return e;
  }
  if (at("(")) {
    next();
    ExprPtr e = parse_tuple(false, true, nullptr, true, false);
    expect(")");
    return e;
  }
  if (at("[")) {
    auto e = node(ExprKind::kList, next().pos);
    while (!at("]")) {
      if (!e->args.empty()) expect(",");
      if (at("]")) break;
      e->args.push_back(parse_expression(true));
    }
    expect("]");
    return e;
  }
  if (at("{")) {
    auto e = node(ExprKind::kDict, next().pos);
    while (!at("}")) {
      if (!e->args.empty()) expect(",");
      if (at("}")) break;
      e->args.push_back(parse_expression(true));
      expect(":");
      e->args.push_back(parse_expression(true));
    }
    expect("}");
    return e;
  }
  if (t.type == Tok::kEof) fail_eof(nullptr);
  fail("unexpected '" + describe(t) + "'");
}

bool Parser::tuple_end(const Rules* extra) const {
  if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || at(")")) return true;
  return extra != nullptr && at_any(*extra);
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, const Rules* extra,
                            bool explicit_parentheses, bool with_namespace) {
  const Pos pos = cur().pos;
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect(",");
    if (tuple_end(extra)) break;
    args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
    if (at(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parentheses) {
      if (cur().type == Tok::kEof) fail_eof(nullptr);
      fail("Expected an expression, got '" + describe(cur()) + "'");
    }
  }
  auto e = node(ExprKind::kTuple, pos);
  e->args = std::move(args);
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (at(".") || at("[")) {
      e = parse_subscript(std::move(e));
    } else if (at("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  while (true) {
    if (at("|")) {
      e = parse_filter(std::move(e), false);
    } else if (at("name:is")) {
      e = parse_test(std::move(e));
    } else if (at("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr obj) {
  const Token& t = next();
  if (t.value == ".") {
    const Token& attr = next();
    if (attr.type == Tok::kName) {
      auto e = node(ExprKind::kGetattr, t.pos);
      e->args.push_back(std::move(obj));
      e->name = attr.value;
      return e;
    }
    if (attr.type != Tok::kInt) fail_at("expected name or number", attr.pos);
    auto e = node(ExprKind::kGetitem, t.pos);
    e->args.push_back(std::move(obj));
    auto index = node(ExprKind::kConst, attr.pos);
    index->value = attr.literal;
    e->args.push_back(std::move(index));
    return e;
  }
  std::vector<ExprPtr> args;
  while (!at("]")) {
    if (!args.empty()) expect(",");
    args.push_back(parse_subscribed());
  }
  expect("]");
  auto e = node(ExprKind::kGetitem, t.pos);
  e->args.push_back(std::move(obj));
  if (args.size() == 1) {
    e->args.push_back(std::move(args[0]));
  } else {
    auto tuple = node(ExprKind::kTuple, t.pos);
    tuple->args = std::move(args);
    e->args.push_back(std::move(tuple));
  }
  return e;
}

ExprPtr Parser::parse_subscribed() {
  const Pos pos = cur().pos;
  auto slice = node(ExprKind::kSlice, pos);
  if (at(":")) {
    next();
    slice->args.push_back(nullptr);
  } else {
    ExprPtr e = parse_expression(true);
    if (!at(":")) return e;
    next();
    slice->args.push_back(std::move(e));
  }
  if (at(":") || at("]") || at(",")) {
    slice->args.push_back(nullptr);
  } else {
    slice->args.push_back(parse_expression(true));
  }
  if (skip_if(":")) {
    slice->args.push_back(at("]") || at(",") ? nullptr : parse_expression(true));
  } else {
    slice->args.push_back(nullptr);
  }
  return slice;
}

void Parser::parse_call_args(Expr& e) {
  const Pos pos = expect("(").pos;
  bool require_comma = false;
  auto ensure = [&](bool ok) {
    if (!ok) fail_at("invalid syntax for function call expression", pos);
  };
  while (!at(")")) {
    if (require_comma) {
      expect(",");
      if (at(")")) break;
    }
    if (at("*")) {
      ensure(!e.dyn_args && !e.dyn_kwargs);
      next();
      e.dyn_args = parse_expression(true);
    } else if (at("**")) {
      ensure(!e.dyn_kwargs);
      next();
      e.dyn_kwargs = parse_expression(true);
    } else if (cur().type == Tok::kName && test(look(), "=")) {
      ensure(!e.dyn_kwargs);
      const std::string key = next().value;
      next();
      e.kwargs.emplace_back(key, parse_expression(true));
    } else {
      ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
      e.args.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect(")");
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto e = node(ExprKind::kCall, cur().pos);
  e->args.push_back(std::move(callee));
  parse_call_args(*e);
  return e;
}

std::string Parser::dotted_name() {
  std::string name = expect("name").value;
  while (skip_if(".")) name += "." + expect("name").value;
  return name;
}

ExprPtr Parser::parse_filter(ExprPtr input, bool start_inline) {
  while (at("|") || start_inline) {
    if (!start_inline) next();
    const Pos pos = cur().pos;
    auto e = node(ExprKind::kFilter, pos);
    e->name = dotted_name();
    e->builtin = filter_index(e->name);
    e->args.push_back(std::move(input));
    if (at("(")) parse_call_args(*e);
    input = std::move(e);
    start_inline = false;
  }
  return input;
}

ExprPtr Parser::parse_test(ExprPtr input) {
  next();
  const bool negated = skip_if("name:not");
  const Pos pos = cur().pos;
  auto e = node(ExprKind::kTest, pos);
  e->name = dotted_name();
  e->builtin = test_index(e->name);
  e->args.push_back(std::move(input));
  const Tok type = cur().type;
  if (at("(")) {
    parse_call_args(*e);
  } else if ((type == Tok::kName || type == Tok::kString || type == Tok::kInt ||
              type == Tok::kFloat || at("(") || at("[") || at("{")) &&
             !at("name:else") && !at("name:or") && !at("name:and")) {
    if (at("name:is")) fail("You cannot chain multiple tests with is");
    e->args.push_back(parse_postfix(parse_primary(false)));
  }
  if (!negated) return e;
  auto n = node(ExprKind::kNot, pos);
  n->args.push_back(std::move(e));
  return n;
}

}  // namespace strata::data::jinja
