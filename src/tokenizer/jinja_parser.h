// tokenizer/jinja_parser.h: the syntax tree of a Jinja template and the parser that builds it.
// Owns: expression and statement nodes (immutable once parsed, so one tree renders on many threads at
// once) and the nesting limits that keep hostile templates from overflowing the stack.
// Must not: evaluate expressions or hold render state.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace polylora::jinja {

// Deepest nesting of expressions and of blocks the parser accepts.
inline constexpr int kMaxExprDepth = 200;
inline constexpr int kMaxBlockDepth = 100;

enum class ExprKind {
  kLiteral,    // value
  kName,       // name
  kList,       // children
  kTuple,      // children
  kDict,       // children: key, value, key, value...
  kNot,        // children[0]
  kNeg,        // children[0]
  kPos,        // children[0]
  kBinary,     // name = operator (+ - * / // % ** ~ in, "not in"), children[0..1]
  kCompare,    // ops: operators; children: operands (chained comparison)
  kAnd,        // children[0..1]
  kOr,         // children[0..1]
  kCondition,  // children: then, cond, else (else may be null)
  kGetAttr,    // children[0].name
  kGetItem,    // children[0][children[1]]
  kSlice,      // children[0][c1:c2:c3] (null children are absent bounds)
  kCall,       // children[0](children[1..], kwargs)
  kFilter,     // name; children[0] is the input, children[1..] the args; kwargs
  kTest,       // name; negated; children[0] the input, children[1..] the args
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  int depth = 1;
  std::string name;
  bool negated = false;
  Value value;
  std::vector<std::string> ops;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

enum class StmtKind {
  kText,         // text
  kOutput,       // expr
  kIf,           // branches (cond, body), else_body
  kFor,          // targets, expr (iterable), cond (filter, may be null), body, else_body
  kSet,          // targets (or attr target: targets[0].name), expr
  kSetBlock,     // targets[0], body, filters (applied to the captured text)
  kMacro,        // name, params (name, default), body
  kCallBlock,    // expr (the macro call), params (caller's), body
  kFilterBlock,  // filters, body
  kBreak,
  kContinue,
  kScope,  // body (e.g. {% generation %}): renders its body
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

// An assignment target: a name, or `name.attr` (namespace attribute).
struct Target {
  std::string name;
  std::string attr;  // empty unless `ns.attr`
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // kText; the macro name for kMacro
  ExprPtr expr;
  ExprPtr cond;
  std::vector<Target> targets;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;
  std::vector<ExprPtr> filters;  // kFilter nodes whose children[0] is null (the piped value)
  StmtList body;
  StmtList else_body;
};

struct Template {
  StmtList body;
};

// Throws polylora::Error ("template syntax error at line N: ...") on invalid syntax.
std::shared_ptr<const Template> parse_template(std::string_view source);

}  // namespace polylora::jinja
