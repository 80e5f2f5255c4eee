// tokenizer/jinja_renderer.cc: the Jinja evaluator: statements, expressions, scoping (for loops and
// macros open scopes, `if` does not), loop variables, macros and the step/depth/size guards.
// Must not: parse templates.
#include "tokenizer/jinja_renderer.h"

#include <algorithm>
#include <exception>
#include <new>

#include "tokenizer/jinja_builtins.h"

namespace polylora::jinja {

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    for (const auto& v : s->vars) {
      if (v.first == name) return &v.second;
    }
  }
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  for (auto& v : vars) {
    if (v.first == name) {
      v.second = std::move(value);
      return;
    }
  }
  vars.emplace_back(std::string(name), std::move(value));
}

Renderer::~Renderer() {
  for (auto& s : closure_scopes_) s->vars.clear();
  for (auto& ns : namespaces_) ns.entries().entries.clear();
}

void Renderer::enter(int line) {
  line_ = line;
  if (++depth_ > limits_.max_depth) {
    fail("template nested too deeply (more than {} levels of evaluation; runaway recursion?)",
         limits_.max_depth);
  }
  if (++steps_ > limits_.max_steps) {
    fail("template exceeded {} evaluation steps (runaway loop?)", limits_.max_steps);
  }
}

void Renderer::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) fail("template output exceeds {} bytes", limits_.max_output_bytes);
}

void Renderer::charge_bytes(size_t bytes) {
  check_size(bytes);
  built_bytes_ += bytes;
  if (built_bytes_ > limits_.max_built_bytes) {
    fail("template built more than {} bytes of strings (runaway string building?)", limits_.max_built_bytes);
  }
}

void Renderer::charge_items(size_t items) {
  if (items > limits_.max_built_items || built_items_ + items > limits_.max_built_items) {
    fail("template built more than {} list items (runaway list building?)", limits_.max_built_items);
  }
  built_items_ += items;
}

void Renderer::emit(const std::string& text) {
  charge_bytes(text.size());
  out_->append(text);
  check_size(out_->size());
}

std::string Renderer::render(const Template& tmpl, std::vector<std::pair<std::string, Value>> globals) {
  auto root = std::make_shared<Scope>();
  root->vars = std::move(globals);
  closure_scopes_.push_back(root);
  std::string out;
  out_ = &out;
  try {
    exec_body(tmpl.body, root);
  } catch (const TemplateRaisedError&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail("template error at line {}: out of memory", line_);
  } catch (const std::exception& e) {
    fail("template error at line {}: {}", line_, e.what());
  }
  return out;
}

Renderer::Flow Renderer::exec_body(const StmtList& body, const ScopePtr& scope) {
  for (const auto& s : body) {
    Flow f = exec(*s, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::string Renderer::capture(const StmtList& body, const ScopePtr& scope) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec_body(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Renderer::Flow Renderer::exec(const Stmt& s, const ScopePtr& scope) {
  DepthGuard guard(*this, s.line);
  switch (s.kind) {
    case StmtKind::kText:
      emit(s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      Value v = eval(*s.expr, scope);
      emit(v.str());
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (eval(*cond, scope).truthy()) return exec_body(body, scope);
      }
      return exec_body(s.else_body, scope);
    case StmtKind::kFor:
      return exec_for(s, scope);
    case StmtKind::kSet:
    case StmtKind::kSetBlock:
      exec_set(s, scope);
      return Flow::kNormal;
    case StmtKind::kMacro:
      scope->set(s.text, make_macro(s, scope));
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      const Expr& call_expr = *s.expr;
      Value callee = eval(*call_expr.children[0], scope);
      CallArgs args = eval_args(call_expr, 1, scope);
      auto caller_scope = scope;
      closure_scopes_.push_back(caller_scope);
      const Stmt* stmt = &s;
      args.kwargs.emplace_back("caller",
                               Value::function("caller", [stmt, caller_scope](Renderer& r, CallArgs& a) {
                                 return r.call_macro(*stmt, caller_scope, a);
                               }));
      emit(call(callee, args).str());
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      Value v = apply_filters(s.filters, Value::string(capture(s.body, scope)), scope);
      emit(v.str());
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope:
      return exec_body(s.body, scope);
  }
  return Flow::kNormal;
}

Value Renderer::apply_filters(const std::vector<ExprPtr>& filters, Value value, const ScopePtr& scope) {
  for (const auto& f : filters) value = eval_filter(*f, std::move(value), scope);
  return value;
}

void Renderer::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value value;
  if (s.kind == StmtKind::kSetBlock) {
    value = apply_filters(s.filters, Value::string(capture(s.body, scope)), scope);
  } else {
    value = eval(*s.expr, scope);
  }
  assign(scope, s.targets, value);
}

void Renderer::assign(const ScopePtr& scope, const std::vector<Target>& targets, const Value& value) {
  if (targets.size() == 1) {
    const Target& t = targets[0];
    if (t.attr.empty()) {
      scope->set(t.name, value);
      return;
    }
    const Value* ns = scope->find(t.name);
    if (!ns || ns->kind() != ValueKind::kNamespace) {
      fail("cannot assign attribute '{}' on '{}': not a namespace object", t.attr, t.name);
    }
    ns->entries().set(Value::string(t.attr), value);
    return;
  }
  if (!value.is_sequence() && !value.is_string() && !value.is_mapping()) {
    fail("cannot unpack non-iterable {} object", value.type_name());
  }
  ValueList items = value.iterate();
  if (items.size() != targets.size()) {
    fail("cannot unpack {} values into {} names", items.size(), targets.size());
  }
  for (size_t i = 0; i < targets.size(); ++i) assign(scope, {targets[i]}, items[i]);
}

Renderer::Flow Renderer::exec_for(const Stmt& s, const ScopePtr& scope) {
  Value iterable = eval(*s.expr, scope);
  ValueList all = iterable.iterate();
  ValueList items;
  if (s.cond) {
    for (auto& item : all) {
      auto filter_scope = std::make_shared<Scope>();
      filter_scope->parent = scope;
      assign(filter_scope, s.targets, item);
      if (eval(*s.cond, filter_scope).truthy()) items.push_back(std::move(item));
    }
  } else {
    items = std::move(all);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // One loop object per loop, updated in place each iteration (as Jinja's LoopContext is).
  enum LoopKey {
    kIndex,
    kIndex0,
    kRevindex,
    kRevindex0,
    kFirst,
    kLast,
    kLength,
    kDepth,
    kDepth0,
    kPrev,
    kNext,
    kCycle
  };
  static const char* const kLoopKeys[] = {"index",  "index0", "revindex", "revindex0", "first",    "last",
                                          "length", "depth",  "depth0",   "previtem",  "nextitem", "cycle"};
  Value loop = Value::dict();
  auto& d = loop.entries();
  auto position = std::make_shared<int64_t>(0);
  for (const char* key : kLoopKeys) d.entries.emplace_back(Value::string(key), Value::integer(0));
  d.entries[kLength].second = Value::integer(n);
  d.entries[kDepth].second = Value::integer(1);
  d.entries[kDepth0].second = Value::integer(0);
  d.entries[kCycle].second = Value::function("cycle", [position](Renderer&, CallArgs& a) {
    if (a.args.empty()) fail("loop.cycle() needs at least one argument");
    return a.args[static_cast<size_t>(*position) % a.args.size()];
  });
  for (const auto& item : items) d.depth = std::max(d.depth, item.depth() + 1);
  for (int64_t i = 0; i < n; ++i) {
    DepthGuard guard(*this, s.line);
    auto iter_scope = std::make_shared<Scope>();
    iter_scope->parent = scope;
    assign(iter_scope, s.targets, items[static_cast<size_t>(i)]);
    *position = i;
    d.entries[kIndex].second = Value::integer(i + 1);
    d.entries[kIndex0].second = Value::integer(i);
    d.entries[kRevindex].second = Value::integer(n - i);
    d.entries[kRevindex0].second = Value::integer(n - i - 1);
    d.entries[kFirst].second = Value::boolean(i == 0);
    d.entries[kLast].second = Value::boolean(i == n - 1);
    d.entries[kPrev].second = i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("previtem");
    d.entries[kNext].second = i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("nextitem");
    iter_scope->vars.emplace_back("loop", loop);
    Flow f = exec_body(s.body, iter_scope);
    if (f == Flow::kBreak) break;
  }
  if (n == 0) return exec_body(s.else_body, scope);
  return Flow::kNormal;
}

Value Renderer::make_macro(const Stmt& s, const ScopePtr& closure) {
  closure_scopes_.push_back(closure);
  const Stmt* stmt = &s;
  ScopePtr captured = closure;
  return Value::function(
      s.text, [stmt, captured](Renderer& r, CallArgs& args) { return r.call_macro(*stmt, captured, args); });
}

Value Renderer::call_macro(const Stmt& s, const ScopePtr& closure, CallArgs& args) {
  DepthGuard guard(*this, s.line);
  const std::string name = s.kind == StmtKind::kMacro ? s.text : "caller";
  if (args.args.size() > s.params.size()) {
    fail("macro '{}' takes not more than {} argument(s)", name, s.params.size());
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = closure;
  std::vector<bool> bound(s.params.size(), false);
  for (size_t i = 0; i < args.args.size(); ++i) {
    scope->set(s.params[i].first, args.args[i]);
    bound[i] = true;
  }
  for (auto& [key, value] : args.kwargs) {
    size_t i = 0;
    while (i < s.params.size() && s.params[i].first != key) ++i;
    if (i < s.params.size()) {
      if (bound[i]) fail("macro '{}' got multiple values for argument '{}'", name, key);
      scope->set(key, value);
      bound[i] = true;
    } else if (key == "caller") {
      scope->set(key, value);
    } else {
      fail("macro '{}' has no argument named '{}'", name, key);
    }
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (bound[i]) continue;
    const auto& [param, def] = s.params[i];
    scope->set(param, def ? eval(*def, scope) : Value::undefined(param));
  }
  return Value::string(capture(s.body, scope));
}

Value Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.kind() != ValueKind::kFunction) {
    if (callee.is_undefined()) fail("'{}' is undefined", callee.as_string());
    fail("'{}' object is not callable", callee.type_name());
  }
  return callee.as_function().call(*this, args);
}

// ---- expressions ----

Value Renderer::eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(*this, e.line);
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName:
      return eval_name(e, scope);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c, scope));
      return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value key = eval(*e.children[i], scope);
        if (key.is_sequence() && key.kind() == ValueKind::kList) fail("unhashable type: 'list'");
        if (key.has_entries()) fail("unhashable type: '{}'", key.type_name());
        d.entries().set(key, eval(*e.children[i + 1], scope));
      }
      return d;
    }
    case ExprKind::kNot:
      return Value::boolean(!eval(*e.children[0], scope).truthy());
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.children[0], scope);
      if (v.is_undefined()) fail("'{}' is undefined", v.as_string());
      if (!v.is_number())
        fail("bad operand type for unary {}: '{}'", e.kind == ExprKind::kNeg ? "-" : "+", v.type_name());
      if (e.kind == ExprKind::kPos) return v.kind() == ValueKind::kBool ? Value::integer(v.as_int()) : v;
      if (v.kind() == ValueKind::kFloat) return Value::number(-v.as_float());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value::integer(-v.as_int());
    }
    case ExprKind::kBinary:
      return eval_binary(e, scope);
    case ExprKind::kCompare:
      return eval_compare(e, scope);
    case ExprKind::kAnd: {
      Value a = eval(*e.children[0], scope);
      return a.truthy() ? eval(*e.children[1], scope) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.children[0], scope);
      return a.truthy() ? a : eval(*e.children[1], scope);
    }
    case ExprKind::kCondition:
      if (eval(*e.children[1], scope).truthy()) return eval(*e.children[0], scope);
      return e.children[2] ? eval(*e.children[2], scope) : Value::undefined();
    case ExprKind::kGetAttr:
      return eval_attr(e, scope);
    case ExprKind::kGetItem:
      return eval_item(e, scope);
    case ExprKind::kSlice:
      return eval_slice(e, scope);
    case ExprKind::kCall:
      return eval_call(e, scope);
    case ExprKind::kFilter:
      return eval_filter(e, eval(*e.children[0], scope), scope);
    case ExprKind::kTest:
      return eval_test(e, scope);
  }
  return Value();
}

Value Renderer::eval_name(const Expr& e, const ScopePtr& scope) {
  if (const Value* v = scope->find(e.name)) return *v;
  return Value::undefined(e.name);
}

Value Renderer::eval_binary(const Expr& e, const ScopePtr& scope) {
  Value a = eval(*e.children[0], scope);
  Value b = eval(*e.children[1], scope);
  return binary_op(*this, e.name, a, b);
}

Value Renderer::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.children[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1], scope);
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") {
      ok = values_equal(left, right);
    } else if (op == "!=") {
      ok = !values_equal(left, right);
    } else if (op == "in") {
      ok = contains(right, left);
    } else if (op == "not in") {
      ok = !contains(right, left);
    } else {
      auto c = compare_values(left, right);
      if (!c) {
        if (left.is_undefined() || right.is_undefined()) {
          fail("'{}' is undefined", left.is_undefined() ? left.as_string() : right.as_string());
        }
        fail("'{}' not supported between instances of '{}' and '{}'", op, left.type_name(),
             right.type_name());
      }
      ok = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval_attr(const Expr& e, const ScopePtr& scope) {
  Value obj = eval(*e.children[0], scope);
  if (obj.is_undefined()) fail("'{}' is undefined", obj.as_string());
  // Like Python's getattr: a dict's methods (items, keys, values, get) win over its keys.
  if (obj.has_entries() && !(obj.is_mapping() && has_method(obj, e.name))) {
    if (const Value* v = obj.entries().find(e.name)) return *v;
  }
  if (has_method(obj, e.name)) {
    std::string name = e.name;
    return Value::function(name,
                           [obj, name](Renderer& r, CallArgs& a) { return call_method(r, obj, name, a); });
  }
  return Value::undefined(e.name);
}

namespace {

int64_t normalize_index(int64_t i, int64_t size) {
  return i < 0 ? i + size : i;
}

}  // namespace

Value Renderer::eval_item(const Expr& e, const ScopePtr& scope) {
  Value obj = eval(*e.children[0], scope);
  if (obj.is_undefined()) fail("'{}' is undefined", obj.as_string());
  Value key = eval(*e.children[1], scope);
  switch (obj.kind()) {
    case ValueKind::kDict:
    case ValueKind::kNamespace:
      if (const Value* v = obj.entries().find(key)) return *v;
      break;
    case ValueKind::kList:
    case ValueKind::kTuple:
      if (key.is_int()) {
        int64_t size = static_cast<int64_t>(obj.items().size());
        int64_t i = normalize_index(key.as_int(), size);
        if (i >= 0 && i < size) return obj.items()[static_cast<size_t>(i)];
      }
      break;
    case ValueKind::kString:
      if (key.is_int()) {
        auto offsets = utf8_offsets(obj.as_string());
        int64_t size = static_cast<int64_t>(offsets.size()) - 1;
        int64_t i = normalize_index(key.as_int(), size);
        if (i >= 0 && i < size) {
          size_t a = offsets[static_cast<size_t>(i)], b = offsets[static_cast<size_t>(i) + 1];
          return Value::string(obj.as_string().substr(a, b - a));
        }
      }
      break;
    case ValueKind::kUndefined:
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kFunction:
      break;
  }
  if (key.is_string() && has_method(obj, key.as_string())) {
    std::string name = key.as_string();
    return Value::function(name,
                           [obj, name](Renderer& r, CallArgs& a) { return call_method(r, obj, name, a); });
  }
  return Value::undefined(key.is_string() ? key.as_string() : key.repr());
}

Value Renderer::eval_slice(const Expr& e, const ScopePtr& scope) {
  Value obj = eval(*e.children[0], scope);
  std::optional<int64_t> bounds[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.children[k + 1]) continue;
    Value v = eval(*e.children[k + 1], scope);
    if (v.is_none()) continue;
    if (!v.is_int()) fail("slice indices must be integers or None, not {}", v.type_name());
    bounds[k] = v.as_int();
  }
  int64_t step = bounds[2].value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t size;
  if (obj.is_string()) {
    offsets = utf8_offsets(obj.as_string());
    size = static_cast<int64_t>(offsets.size()) - 1;
  } else if (obj.is_sequence()) {
    size = static_cast<int64_t>(obj.items().size());
  } else if (obj.is_undefined()) {
    fail("'{}' is undefined", obj.as_string());
  } else {
    fail("'{}' object is not subscriptable", obj.type_name());
  }
  auto clamp = [&](std::optional<int64_t> b, int64_t def) -> int64_t {
    if (!b) return def;
    int64_t v = *b;
    if (v < 0) {
      v += size;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= size) {
      v = step < 0 ? size - 1 : size;
    }
    return v;
  };
  int64_t start = clamp(bounds[0], step < 0 ? size - 1 : 0);
  int64_t stop = clamp(bounds[1], step < 0 ? -1 : size);
  std::vector<int64_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : picks) {
      size_t a = offsets[static_cast<size_t>(i)], b = offsets[static_cast<size_t>(i) + 1];
      out.append(obj.as_string(), a, b - a);
    }
    return Value::string(std::move(out));
  }
  ValueList items;
  items.reserve(picks.size());
  for (int64_t i : picks) items.push_back(obj.items()[static_cast<size_t>(i)]);
  return obj.kind() == ValueKind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

CallArgs Renderer::eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
  CallArgs args;
  for (size_t i = first; i < e.children.size(); ++i) args.args.push_back(eval(*e.children[i], scope));
  for (const auto& [key, value] : e.kwargs) args.kwargs.emplace_back(key, eval(*value, scope));
  return args;
}

Value Renderer::eval_call(const Expr& e, const ScopePtr& scope) {
  const Expr& callee_expr = *e.children[0];
  if (callee_expr.kind == ExprKind::kGetAttr) {
    // obj.method(...): call the method directly unless obj holds a key of that name.
    Value obj = eval(*callee_expr.children[0], scope);
    if (obj.is_undefined()) fail("'{}' is undefined", obj.as_string());
    const Value* held = obj.has_entries() && !(obj.is_mapping() && has_method(obj, callee_expr.name))
                            ? obj.entries().find(callee_expr.name)
                            : nullptr;
    if (!held && has_method(obj, callee_expr.name)) {
      CallArgs args = eval_args(e, 1, scope);
      line_ = e.line;
      return call_method(*this, obj, callee_expr.name, args);
    }
    Value callee = held ? *held : Value::undefined(callee_expr.name);
    CallArgs args = eval_args(e, 1, scope);
    line_ = e.line;
    return call(callee, args);
  }
  Value callee = eval(callee_expr, scope);
  CallArgs args = eval_args(e, 1, scope);
  line_ = e.line;
  return call(callee, args);
}

Value Renderer::eval_filter(const Expr& e, Value input, const ScopePtr& scope) {
  CallArgs args = eval_args(e, 1, scope);
  line_ = e.line;
  return apply_filter(*this, e.name, input, args);
}

Value Renderer::eval_test(const Expr& e, const ScopePtr& scope) {
  Value input = eval(*e.children[0], scope);
  CallArgs args = eval_args(e, 1, scope);
  line_ = e.line;
  bool result = apply_test(*this, e.name, input, args);
  return Value::boolean(e.negated ? !result : result);
}

}  // namespace polylora::jinja
