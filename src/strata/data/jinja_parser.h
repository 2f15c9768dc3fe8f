// The chat-template engine's (jinja.h) parser, jinja2's (jinja2/parser.py) with the same grammar,
// precedence and error messages, and transformers' extensions (generation, and loopcontrols'
// break and continue): statements in jinja_parser.cc, expressions in jinja_parser_expr.cc.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/data/jinja_syntax.h"

namespace strata::data::jinja {

// jinja2's describe_token: what a token is called in messages.
std::string describe(const Token& t);
// "name:endfor" or an operator, as jinja2's describe_token_expr.
std::string describe_rule(const std::string& rule);

inline ExprPtr node(ExprKind kind, Pos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}
  Body parse_template();
  bool has_generation = false;

 private:
  // A token rule: "name:endfor" (that name), "name" (any name), "block_end", "variable_end", or
  // an operator.
  using Rules = std::vector<std::string>;

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  static bool test(const Token& t, const std::string& rule) {
    if (rule.rfind("name:", 0) == 0) return t.type == Tok::kName && t.value == rule.substr(5);
    if (rule == "block_end") return t.type == Tok::kBlockEnd;
    if (rule == "variable_end") return t.type == Tok::kVarEnd;
    if (rule == "name") return t.type == Tok::kName;
    return t.type == Tok::kOp && t.value == rule;
  }
  bool at(const std::string& rule) const { return test(cur(), rule); }
  bool at_any(const Rules& rules) const {
    return std::any_of(rules.begin(), rules.end(), [&](const auto& r) { return at(r); });
  }
  bool skip_if(const std::string& rule) {
    if (!at(rule)) return false;
    next();
    return true;
  }
  const Token& expect(const std::string& rule);
  [[noreturn]] void fail(const std::string& message) const { fail_at(message, cur().pos); }
  [[noreturn]] static void fail_at(const std::string& message, Pos pos) {
    throw TemplateSyntax{message, pos};
  }
  // jinja2's _fail_ut_eof: an unknown tag (name) or the end of the template (null).
  [[noreturn]] void fail_unknown(const std::string* name, const Rules* extra);
  [[noreturn]] void fail_eof(const Rules* end_tokens) { fail_unknown(nullptr, end_tokens); }

  // Bounds the parser's recursion (and so the evaluator's) on pathological nesting.
  struct Nesting {
    explicit Nesting(Parser& p) : p(p) {
      if (++p.nesting_ > 200) p.fail("expressions or blocks nested more than 200 deep");
    }
    ~Nesting() { --p.nesting_; }
    Parser& p;
  };

  // Statements (jinja_parser.cc).
  Body subparse(const Rules* end_tokens);
  Body parse_statements(const Rules& end_tokens, bool drop_needle);
  std::unique_ptr<Stmt> parse_statement();
  void parse_for(Stmt& s);
  void parse_if(Stmt& s);
  void parse_set(Stmt& s);
  void parse_signature(Stmt& s);
  void parse_macro(Stmt& s, bool call_block);
  void parse_with(Stmt& s);
  // Whether a Name `name` is read anywhere in `body` (jinja2's find_undeclared for macros).
  static bool reads(const Expr* e, const std::string& name);
  static bool reads(const Body& body, const std::string& name);

  // Expressions (jinja_parser_expr.cc), one function per precedence level as in jinja2.
  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const Rules* extra,
                              bool with_namespace);
  static void check_assignable(const Expr& e);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr binary(ExprKind kind, ExprPtr left, ExprPtr right, Pos pos);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary(bool with_namespace);
  bool tuple_end(const Rules* extra) const;
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const Rules* extra,
                      bool explicit_parentheses, bool with_namespace);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr obj);
  ExprPtr parse_subscribed();
  // Fills e's args (after those it has), kwargs, dyn_args and dyn_kwargs from ( ... ).
  void parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr callee);
  std::string dotted_name();
  ExprPtr parse_filter(ExprPtr input, bool start_inline);
  ExprPtr parse_test(ExprPtr input);

  std::vector<Token> t_;
  size_t i_ = 0;
  std::vector<Rules> end_stack_;        // the end tags each open block waits for
  std::vector<std::string> tag_stack_;  // the open tags, innermost last
  int loops_ = 0;                       // for loops open where break/continue may stand
  int nesting_ = 0;
};

}  // namespace strata::data::jinja
