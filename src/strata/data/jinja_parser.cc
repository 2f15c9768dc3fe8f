// jinja2's parser, statements: the template's body, tags and their blocks (jinja_parser.h).
#include "strata/data/jinja_parser.h"

#include <algorithm>
#include <utility>

#include "strata/data/jinja_eval.h"

namespace strata::data::jinja {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::kName:
    case Tok::kOp:
      return t.value;
    case Tok::kData:
      return "template data / text";
    case Tok::kVarBegin:
      return "begin of print statement";
    case Tok::kVarEnd:
      return "end of print statement";
    case Tok::kBlockBegin:
      return "begin of statement block";
    case Tok::kBlockEnd:
      return "end of statement block";
    case Tok::kString:
      return "string";
    case Tok::kInt:
      return "integer";
    case Tok::kFloat:
      return "float";
    case Tok::kEof:
      return "end of template";
  }
  return "token";
}

std::string describe_rule(const std::string& rule) {
  if (rule.rfind("name:", 0) == 0) return rule.substr(5);
  return rule;
}

Body Parser::parse_template() {
  Body body = subparse(nullptr);
  if (cur().type != Tok::kEof) fail("unexpected '" + describe(cur()) + "'");
  return body;
}

const Token& Parser::expect(const std::string& rule) {
  if (!at(rule)) {
    if (cur().type == Tok::kEof) fail_eof(nullptr);
    fail("expected token '" + describe_rule(rule) + "', got '" + describe(cur()) + "'");
  }
  return next();
}

void Parser::fail_unknown(const std::string* name, const Rules* extra) {
  std::vector<Rules> stack = end_stack_;
  if (extra != nullptr) stack.push_back(*extra);
  std::string msg =
      name == nullptr ? "Unexpected end of template." : "Encountered unknown tag '" + *name + "'.";
  if (!stack.empty()) {
    std::string looking;
    for (const auto& r : stack.back()) {
      looking += (looking.empty() ? "'" : " or '") + describe_rule(r) + "'";
    }
    bool expected = false;
    for (const auto& rules : stack) {
      for (const auto& r : rules) expected |= name != nullptr && describe_rule(r) == *name;
    }
    msg += expected ? " You probably made a nesting mistake. Jinja is expecting this tag, but "
                      "currently looking for " +
                          looking + "."
                    : " Jinja was looking for the following tags: " + looking + ".";
  }
  if (!tag_stack_.empty()) {
    msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
  }
  fail(msg);
}

Body Parser::subparse(const Rules* end_tokens) {
  Body body;
  if (end_tokens != nullptr) end_stack_.push_back(*end_tokens);
  while (cur().type != Tok::kEof) {
    const Token& t = cur();
    if (t.type == Tok::kData) {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kData;
      s->pos = t.pos;
      s->text = t.value;
      body.push_back(std::move(s));
      next();
    } else if (t.type == Tok::kVarBegin) {
      next();
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kOutput;
      s->pos = cur().pos;
      s->expr = parse_tuple(false, true, nullptr, false, false);
      body.push_back(std::move(s));
      expect("variable_end");
    } else if (t.type == Tok::kBlockBegin) {
      next();
      if (end_tokens != nullptr && at_any(*end_tokens)) break;
      body.push_back(parse_statement());
      expect("block_end");
    } else {
      fail("unexpected '" + describe(t) + "'");
    }
  }
  if (end_tokens != nullptr) end_stack_.pop_back();
  return body;
}

Body Parser::parse_statements(const Rules& end_tokens, bool drop_needle) {
  skip_if(":");
  expect("block_end");
  Body body = subparse(&end_tokens);
  if (cur().type == Tok::kEof) fail_eof(&end_tokens);
  if (drop_needle) next();
  return body;
}

std::unique_ptr<Stmt> Parser::parse_statement() {
  Nesting guard(*this);
  const Token& t = cur();
  if (t.type != Tok::kName) fail("tag name expected");
  const std::string tag = t.value;
  static const Rules unsupported = {"block", "extends", "include", "import", "from", "autoescape"};
  if (std::find(unsupported.begin(), unsupported.end(), tag) != unsupported.end()) {
    fail("'" + tag + "' is not supported: a chat template renders alone");
  }
  static const Rules known = {"for",  "if",    "set",        "macro", "call",    "filter",
                              "with", "print", "generation", "break", "continue"};
  if (std::find(known.begin(), known.end(), tag) == known.end()) fail_unknown(&tag, nullptr);
  tag_stack_.push_back(tag);
  auto s = std::make_unique<Stmt>();
  s->pos = t.pos;
  if (tag == "for") parse_for(*s);
  if (tag == "if") parse_if(*s);
  if (tag == "set") parse_set(*s);
  if (tag == "macro" || tag == "call") parse_macro(*s, tag == "call");
  if (tag == "filter") {
    next();
    s->kind = StmtKind::kFilterBlock;
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"name:endfilter"}, true);
  }
  if (tag == "with") parse_with(*s);
  if (tag == "print") {
    next();
    s->kind = StmtKind::kOutput;
    std::vector<ExprPtr> items;
    while (!at("block_end")) {
      if (!items.empty()) expect(",");
      items.push_back(parse_expression(true));
    }
    s->expr = node(ExprKind::kConcat, s->pos);
    s->expr->args = std::move(items);
  }
  if (tag == "generation") {
    next();
    s->kind = StmtKind::kGeneration;
    has_generation = true;
    const int outer_loops = std::exchange(loops_, 0);  // the body is a caller() macro
    s->body = parse_statements({"name:endgeneration"}, true);
    loops_ = outer_loops;
  }
  if (tag == "break" || tag == "continue") {
    next();
    if (loops_ == 0) fail_at("'" + tag + "' outside of a for loop", s->pos);
    s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
  }
  tag_stack_.pop_back();
  return s;
}

void Parser::parse_for(Stmt& s) {
  next();
  s.kind = StmtKind::kFor;
  const Rules in_rule = {"name:in"};
  s.target = parse_assign_target(true, false, &in_rule, false);
  expect("name:in");
  const Rules recursive_rule = {"name:recursive"};
  s.expr = parse_tuple(false, false, &recursive_rule, false, false);
  if (skip_if("name:if")) s.cond = parse_expression(true);
  if (at("name:recursive")) fail("recursive for loops are not supported");
  ++loops_;
  s.body = parse_statements({"name:endfor", "name:else"}, false);
  --loops_;
  if (next().value == "else") s.else_body = parse_statements({"name:endfor"}, true);
}

void Parser::parse_if(Stmt& s) {
  next();
  s.kind = StmtKind::kIf;
  while (true) {
    ExprPtr test = parse_tuple(false, false, nullptr, false, false);
    Body body = parse_statements({"name:elif", "name:else", "name:endif"}, false);
    s.branches.emplace_back(std::move(test), std::move(body));
    const Token& t = next();
    if (t.value == "elif") continue;
    if (t.value == "else") s.else_body = parse_statements({"name:endif"}, true);
    break;
  }
}

void Parser::parse_set(Stmt& s) {
  next();
  s.target = parse_assign_target(true, false, nullptr, true);
  if (skip_if("=")) {
    s.kind = StmtKind::kSet;
    s.expr = parse_tuple(false, true, nullptr, false, false);
    return;
  }
  s.kind = StmtKind::kSetBlock;
  if (at("|")) s.filter = parse_filter(nullptr, false);
  s.body = parse_statements({"name:endset"}, true);
}

void Parser::parse_signature(Stmt& s) {
  expect("(");
  while (!at(")")) {
    if (!s.params.empty()) expect(",");
    s.params.push_back(expect("name").value);
    if (skip_if("=")) {
      s.defaults.push_back(parse_expression(true));
    } else if (!s.defaults.empty()) {
      fail("non-default argument follows default argument");
    }
  }
  expect(")");
}

void Parser::parse_macro(Stmt& s, bool call_block) {
  next();
  s.kind = call_block ? StmtKind::kCallBlock : StmtKind::kMacro;
  const int outer_loops = loops_;
  loops_ = 0;
  if (call_block) {
    if (at("(")) parse_signature(s);
    s.expr = parse_expression(true);
    if (s.expr->kind != ExprKind::kCall) fail_at("expected call", s.pos);
    s.body = parse_statements({"name:endcall"}, true);
  } else {
    s.name = expect("name").value;
    parse_signature(s);
    s.body = parse_statements({"name:endmacro"}, true);
  }
  loops_ = outer_loops;
  s.uses_varargs = reads(s.body, "varargs");
  s.uses_kwargs = reads(s.body, "kwargs");
  s.uses_caller = reads(s.body, "caller");
}

void Parser::parse_with(Stmt& s) {
  next();
  s.kind = StmtKind::kWith;
  while (!at("block_end")) {
    if (!s.assigns.empty()) expect(",");
    const std::string name = expect("name").value;
    expect("=");
    s.assigns.emplace_back(name, parse_expression(true));
  }
  s.body = parse_statements({"name:endwith"}, true);
}

bool Parser::reads(const Expr* e, const std::string& name) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kName && e->name == name) return true;
  for (const auto& a : e->args) {
    if (reads(a.get(), name)) return true;
  }
  for (const auto& kw : e->kwargs) {
    if (reads(kw.second.get(), name)) return true;
  }
  return reads(e->dyn_args.get(), name) || reads(e->dyn_kwargs.get(), name);
}

bool Parser::reads(const Body& body, const std::string& name) {
  for (const auto& s : body) {
    if (reads(s->expr.get(), name) || reads(s->cond.get(), name) || reads(s->filter.get(), name) ||
        reads(s->body, name) || reads(s->else_body, name)) {
      return true;
    }
    for (const auto& [test, branch] : s->branches) {
      if (reads(test.get(), name) || reads(branch, name)) return true;
    }
    for (const auto& d : s->defaults) {
      if (reads(d.get(), name)) return true;
    }
    for (const auto& a : s->assigns) {
      if (reads(a.second.get(), name)) return true;
    }
  }
  return false;
}

namespace {

// jinja2 refuses an unknown filter or test when it compiles the template, except inside an if
// statement or an inline if (a "soft" frame), where it fails only if evaluated. strata does the
// same, and treats a filter it does not implement as unknown.
void check_builtins(const Expr* e, bool soft) {
  if (e == nullptr) return;
  if (e->kind == ExprKind::kCondExpr) soft = true;
  if (!soft && e->kind == ExprKind::kFilter && !filter_supported(e->builtin)) {
    throw TemplateSyntax{e->builtin < 0 ? "No filter named '" + e->name + "'."
                                        : "the filter '" + e->name + "' is not supported",
                         e->pos};
  }
  if (!soft && e->kind == ExprKind::kTest && e->builtin < 0) {
    throw TemplateSyntax{"No test named '" + e->name + "'.", e->pos};
  }
  for (const auto& a : e->args) check_builtins(a.get(), soft);
  for (const auto& kw : e->kwargs) check_builtins(kw.second.get(), soft);
  check_builtins(e->dyn_args.get(), soft);
  check_builtins(e->dyn_kwargs.get(), soft);
}

void check_builtins(const Body& body, bool soft) {
  for (const auto& s : body) {
    if (s->kind == StmtKind::kIf) {
      for (const auto& [test, branch] : s->branches) {
        check_builtins(test.get(), true);
        check_builtins(branch, true);
      }
      check_builtins(s->else_body, true);
      continue;
    }
    // What a statement evaluates in the frame around it keeps that frame's softness; its body,
    // loop filter and macro defaults are evaluated in an inner frame.
    check_builtins(s->expr.get(), soft);
    for (const auto& a : s->assigns) check_builtins(a.second.get(), soft);
    check_builtins(s->cond.get(), false);
    check_builtins(s->filter.get(), false);
    for (const auto& d : s->defaults) check_builtins(d.get(), false);
    check_builtins(s->body, false);
    check_builtins(s->else_body, false);
  }
}

}  // namespace

void parse(const std::string& source, Program& program) {
  Parser parser(tokenize(source));
  program.body = parser.parse_template();
  program.has_generation = parser.has_generation;
  check_builtins(program.body, false);
}

}  // namespace strata::data::jinja
