// The chat-template engine's (jinja.h) tokens and syntax tree, and the lexer and parser that make
// them: jinja2's lexer with trim_blocks, lstrip_blocks and keep_trailing_newline=False, and its
// parser's grammar and precedence.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/data/jinja_value.h"

namespace strata::data::jinja {

// Where a token or node starts: 1-based line, and column in code points.
struct Pos {
  int line = 0;
  int col = 0;
};

enum class Tok {
  kData,        // template text (value)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // value
  kString,      // literal (decoded)
  kInt,         // literal
  kFloat,       // literal
  kOp,          // value: + - * / // % ** ~ [ ] ( ) { } == != > >= < <= = . : | , ;
  kEof,
};

struct Token {
  Tok type = Tok::kEof;
  std::string value;
  Value literal;
  Pos pos;
};

// Tokenizes `source`; throws TemplateSyntax (below) on a lexical error.
std::vector<Token> tokenize(const std::string& source);

// A syntax error at a position (ChatTemplate's constructor names the template).
struct TemplateSyntax {
  std::string message;
  Pos pos;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kNSRef,     // name.attr: an assignment target only
  kGetattr,   // args[0].name
  kGetitem,   // args[0][args[1]]
  kSlice,     // args: start, stop, step (null where absent)
  kCall,      // args[0](args[1:], kwargs, dyn_args, dyn_kwargs)
  kFilter,    // args[0] | name(args[1:], kwargs...); args[0] null in filter blocks
  kTest,      // args[0] is name(args[1:], kwargs...)
  kNot,       // not args[0]
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kBinary,    // args[0] op args[1]: + - * / // % **
  kConcat,    // args[0] ~ args[1] ~ ...
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: eq ne lt lteq gt gteq in notin
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] null without else)
  kList,      // [args...]
  kTuple,     // (args...)
  kDict,      // {args[0]: args[1], args[2]: args[3], ...}
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  Pos pos;
  Value value;
  std::string name;  // kName, kNSRef, kGetattr, kFilter, kTest; kNSRef's attribute in op
  std::string op;    // kBinary
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;  // kCompare
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
  // kFilter / kTest: the builtin, resolved when parsed.
  int builtin = -1;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind {
  kData,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches: (test, body)...; else_body
  kFor,          // for target in expr [if cond]: body else else_body
  kSet,          // set target = expr
  kSetBlock,     // set target [| filter]: body (filter: a kFilter chain, innermost arg null)
  kMacro,        // macro name(params = defaults): body
  kCallBlock,    // call(params) expr: body (the caller)
  kFilterBlock,  // filter expr: body
  kWith,         // with targets = values: body
  kGeneration,   // generation: body (transformers' AssistantTracker)
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind = StmtKind::kData;
  Pos pos;
  std::string text;
  ExprPtr expr, target, cond, filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  // kMacro / kCallBlock: the signature; whether the body reads varargs, kwargs or caller.
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
  // kWith: targets and values.
  std::vector<std::pair<std::string, ExprPtr>> assigns;
};

struct Program {
  std::string name;
  Body body;
  bool has_generation = false;
};

// Parses `source` (jinja.h's syntax); throws TemplateSyntax.
void parse(const std::string& source, Program& program);

}  // namespace strata::data::jinja
