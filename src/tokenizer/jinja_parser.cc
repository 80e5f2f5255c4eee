// tokenizer/jinja_parser.cc: recursive-descent parser from Jinja tokens to the syntax tree, following
// Jinja2's grammar and operator precedence. Must not: evaluate expressions.
#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "tokenizer/jinja_lexer.h"

namespace polylora::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StmtList parse_top() {
    std::string end;
    StmtList body = parse_body({}, &end);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOp && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kText:
        return "text";
      case TokenKind::kVarBegin:
        return "'{{'";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kName:
      case TokenKind::kOp:
      case TokenKind::kInt:
      case TokenKind::kFloat:
        return "'" + t.text + "'";
      case TokenKind::kString:
        return "string";
      case TokenKind::kEof:
        return "end of template";
    }
    return "token";
  }

  [[noreturn]] void error(const std::string& what) const {
    fail("template syntax error at line {}: {}", peek().line, what);
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    error("unexpected " + describe(peek()) + ", expected " + expected);
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) unexpected("'" + std::string(op) + "'");
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) unexpected("end of statement block");
    next();
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) unexpected("a name");
    return next().text;
  }

  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // Records a child and the resulting depth, refusing trees deeper than kMaxExprDepth.
  void add(Expr& parent, ExprPtr child) {
    if (child) {
      parent.depth = std::max(parent.depth, child->depth + 1);
      if (parent.depth > kMaxExprDepth) error("expression nested too deeply");
    }
    parent.children.push_back(std::move(child));
  }
  ExprPtr unary(ExprKind kind, int line, ExprPtr a) {
    auto e = node(kind, line);
    add(*e, std::move(a));
    return e;
  }
  ExprPtr binary(ExprKind kind, std::string op, int line, ExprPtr a, ExprPtr b) {
    auto e = node(kind, line);
    e->name = std::move(op);
    add(*e, std::move(a));
    add(*e, std::move(b));
    return e;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxExprDepth) parser.error("expression nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // ---- expressions ----

  // expr ("," expr)* as a tuple when a comma appears (explicit parentheses not required).
  ExprPtr parse_tuple(bool with_condexpr = true) {
    int line = peek().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto t = node(ExprKind::kTuple, line);
    add(*t, std::move(first));
    while (accept_op(",")) {
      if (at_tuple_end()) break;
      add(*t, with_condexpr ? parse_expression() : parse_or());
    }
    return t;
  }
  bool at_tuple_end() const {
    auto k = peek().kind;
    return k == TokenKind::kVarEnd || k == TokenKind::kBlockEnd || is_op(")") || is_name("if") || is_op("=");
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    int line = peek().line;
    ExprPtr expr = parse_or();
    while (accept_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr otherwise = accept_name("else") ? parse_expression() : nullptr;
      auto e = node(ExprKind::kCondition, line);
      add(*e, std::move(expr));
      add(*e, std::move(cond));
      add(*e, std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int line = next().line;
      left = binary(ExprKind::kOr, "or", line, std::move(left), parse_and());
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int line = next().line;
      left = binary(ExprKind::kAnd, "and", line, std::move(left), parse_not());
    }
    return left;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      int line = next().line;
      return unary(ExprKind::kNot, line, parse_not());
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::kCompare, line);
        add(*cmp, std::move(first));
      }
      cmp->ops.push_back(op);
      add(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      std::string op = t.text;
      left = binary(ExprKind::kBinary, op, t.line, std::move(left), parse_concat());
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      left = binary(ExprKind::kBinary, "~", line, std::move(left), parse_math2());
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      std::string op = t.text;
      left = binary(ExprKind::kBinary, op, t.line, std::move(left), parse_pow());
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      left = binary(ExprKind::kBinary, "**", line, std::move(left), parse_unary(true));
    }
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = peek().line;
    ExprPtr e;
    if (accept_op("-")) {
      e = unary(ExprKind::kNeg, line, parse_unary(false));
    } else if (accept_op("+")) {
      e = unary(ExprKind::kPos, line, parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& t = peek();
    int line = t.line;
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        auto e = node(ExprKind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        std::string s = next().text;
        while (peek().kind == TokenKind::kString) s += next().text;  // adjacent literals concatenate
        auto e = node(ExprKind::kLiteral, line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenKind::kInt: {
        auto e = node(ExprKind::kLiteral, line);
        e->value = Value::integer(next().int_value);
        return e;
      }
      case TokenKind::kFloat: {
        auto e = node(ExprKind::kLiteral, line);
        e->value = Value::number(next().float_value);
        return e;
      }
      case TokenKind::kOp:
        if (accept_op("(")) {
          if (accept_op(")")) return node(ExprKind::kTuple, line);
          ExprPtr first = parse_expression();
          if (accept_op(")")) return first;
          auto tup = node(ExprKind::kTuple, line);
          add(*tup, std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            add(*tup, parse_expression());
          }
          expect_op(")");
          return tup;
        }
        if (accept_op("[")) {
          auto list = node(ExprKind::kList, line);
          while (!is_op("]")) {
            add(*list, parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("]");
          return list;
        }
        if (accept_op("{")) {
          auto dict = node(ExprKind::kDict, line);
          while (!is_op("}")) {
            add(*dict, parse_expression());
            expect_op(":");
            add(*dict, parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("}");
          return dict;
        }
        break;
      case TokenKind::kText:
      case TokenKind::kVarBegin:
      case TokenKind::kVarEnd:
      case TokenKind::kBlockBegin:
      case TokenKind::kBlockEnd:
      case TokenKind::kEof:
        break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = peek().line;
      if (accept_op(".")) {
        if (peek().kind == TokenKind::kInt) {
          auto idx = node(ExprKind::kLiteral, line);
          idx->value = Value::integer(next().int_value);
          auto get = node(ExprKind::kGetItem, line);
          add(*get, std::move(e));
          add(*get, std::move(idx));
          e = std::move(get);
        } else {
          auto get = node(ExprKind::kGetAttr, line);
          get->name = expect_name();
          add(*get, std::move(e));
          e = std::move(get);
        }
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression();
    if (accept_op(":")) {
      is_slice = true;
      if (!is_op(":") && !is_op("]")) parts[1] = parse_expression();
      if (accept_op(":")) {
        if (!is_op("]")) parts[2] = parse_expression();
      }
    }
    expect_op("]");
    auto e = node(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, line);
    add(*e, std::move(target));
    if (is_slice) {
      for (auto& p : parts) add(*e, std::move(p));
    } else {
      if (!parts[0]) error("empty subscript");
      add(*e, std::move(parts[0]));
    }
    return e;
  }

  // Parses "(args, kw=value)" into e's children (after those already there) and kwargs.
  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        ExprPtr value = parse_expression();
        e.depth = std::max(e.depth, value->depth + 1);
        if (e.depth > kMaxExprDepth) error("expression nested too deeply");
        e.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e.kwargs.empty()) error("positional argument after keyword argument");
        add(e, parse_expression());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::kCall, peek().line);
    add(*e, std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // "| name(args)" applied to input (null input inside {% filter %} and {% set x | f %}).
  ExprPtr parse_filter(ExprPtr input) {
    int line = next().line;  // '|'
    auto f = node(ExprKind::kFilter, line);
    f->name = expect_name();
    while (accept_op(".")) f->name += "." + expect_name();
    add(*f, std::move(input));
    if (is_op("(")) parse_args(*f);
    return f;
  }

  ExprPtr parse_test(ExprPtr input) {
    int line = next().line;  // 'is'
    auto t = node(ExprKind::kTest, line);
    t->negated = accept_name("not");
    t->name = expect_name();
    while (accept_op(".")) t->name += "." + expect_name();
    add(*t, std::move(input));
    const Token& p = peek();
    if (is_op("(")) {
      parse_args(*t);
    } else if ((p.kind == TokenKind::kName || p.kind == TokenKind::kString || p.kind == TokenKind::kInt ||
                p.kind == TokenKind::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") &&
               !is_name("not") && !is_name("is")) {
      add(*t, parse_postfix(parse_primary()));
    }
    return t;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `ends` (consumed with its name; *end receives the name).
  StmtList parse_body(std::initializer_list<std::string_view> ends, std::string* end) {
    if (++block_depth_ > kMaxBlockDepth) error("blocks nested too deeply");
    StmtList body;
    while (true) {
      const Token& t = peek();
      switch (t.kind) {
        case TokenKind::kText: {
          auto s = std::make_unique<Stmt>();
          s->kind = StmtKind::kText;
          s->line = t.line;
          s->text = next().text;
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::kVarBegin: {
          next();
          auto s = std::make_unique<Stmt>();
          s->kind = StmtKind::kOutput;
          s->line = t.line;
          s->expr = parse_tuple();
          if (peek().kind != TokenKind::kVarEnd) unexpected("end of print statement");
          next();
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::kBlockBegin: {
          next();
          if (peek().kind != TokenKind::kName) unexpected("a statement name");
          std::string name = peek().text;
          if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
            next();
            *end = name;
            --block_depth_;
            return body;
          }
          body.push_back(parse_statement());
          break;
        }
        case TokenKind::kEof: {
          if (ends.size() != 0) {
            std::string expected;
            for (auto e : ends) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
            error("unexpected end of template, expected " + expected);
          }
          --block_depth_;
          return body;
        }
        case TokenKind::kVarEnd:
        case TokenKind::kBlockEnd:
        case TokenKind::kName:
        case TokenKind::kString:
        case TokenKind::kInt:
        case TokenKind::kFloat:
        case TokenKind::kOp:
          unexpected("text or a tag");
      }
    }
  }

  StmtPtr make_stmt(StmtKind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    const Token& t = next();
    const std::string& name = t.text;
    int line = t.line;
    if (name == "if") return parse_if(line);
    if (name == "for") return parse_for(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "call") return parse_call_block(line);
    if (name == "filter") {
      auto s = make_stmt(StmtKind::kFilterBlock, line);
      parse_filter_chain(*s);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error("'" + name + "' outside of a loop");
      expect_block_end();
      return make_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    if (name == "generation") {
      auto s = make_stmt(StmtKind::kScope, line);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return s;
    }
    fail("template syntax error at line {}: unknown or unexpected tag '{}'", line, name);
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(StmtKind::kIf, line);
    ExprPtr cond = parse_tuple();
    while (true) {
      expect_block_end();
      std::string end;
      StmtList body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple();
        continue;
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end);
      }
      expect_block_end();
      return s;
    }
  }

  void parse_targets(std::vector<Target>& targets, bool allow_attr) {
    bool paren = accept_op("(");
    do {
      if (paren && is_op(")")) break;
      Target target{expect_name(), ""};
      if (allow_attr && accept_op(".")) target.attr = expect_name();
      targets.push_back(std::move(target));
    } while (accept_op(","));
    if (paren) expect_op(")");
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(StmtKind::kFor, line);
    parse_targets(s->targets, false);
    if (!accept_name("in")) unexpected("'in'");
    s->expr = parse_tuple(false);
    if (accept_name("if")) s->cond = parse_expression();
    if (accept_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return s;
  }

  void parse_filter_chain(Stmt& s) {
    do {
      --pos_;  // parse_filter consumes the '|' (or the tag name standing in for it)
      s.filters.push_back(parse_filter(nullptr));
    } while (is_op("|") && (next(), true));
  }

  StmtPtr parse_set(int line) {
    auto s = make_stmt(StmtKind::kSet, line);
    parse_targets(s->targets, true);
    if (accept_op("=")) {
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1) unexpected("'='");
    s->kind = StmtKind::kSetBlock;
    if (accept_op("|")) parse_filter_chain(*s);
    expect_block_end();
    std::string end;
    int saved_loop_depth = loop_depth_;
    s->body = parse_body({"endset"}, &end);
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    return s;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      std::string param = expect_name();
      ExprPtr def;
      if (accept_op("=")) {
        def = parse_expression();
      } else if (!s.params.empty() && s.params.back().second) {
        error("non-default argument follows default argument");
      }
      s.params.emplace_back(std::move(param), std::move(def));
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(StmtKind::kMacro, line);
    s->text = expect_name();
    parse_params(*s);
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved_loop_depth;
    if (peek().kind == TokenKind::kName) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(StmtKind::kCallBlock, line);
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression();
    if (s->expr->kind != ExprKind::kCall) error("expected a call after 'call'");
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = parse_body({"endcall"}, &end);
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    return s;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int block_depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::shared_ptr<const Template> parse_template(std::string_view source) {
  auto t = std::make_shared<Template>();
  t->body = Parser(tokenize(source)).parse_top();
  return t;
}

}  // namespace polylora::jinja
