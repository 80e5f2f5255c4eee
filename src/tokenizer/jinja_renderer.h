// tokenizer/jinja_renderer.h: evaluates a parsed Jinja template against a context of values.
// Owns: the render state of one call (scopes, output buffer, loop and macro frames, step and depth
// counters). A Renderer is single-use and single-threaded; the Template it reads is shared and immutable.
// Must not: parse templates or know about chat messages (chat_template.h builds the context).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace polylora::jinja {

struct RenderLimits {
  int64_t max_steps = 5'000'000;               // expression and statement evaluations per render
  int max_depth = 400;                         // nested evaluations (expressions, blocks, macro calls)
  size_t max_output_bytes = size_t{64} << 20;  // rendered text, and any one string built on the way
  size_t max_built_bytes = size_t{512} << 20;  // all strings built by ~ + * join replace, together
  size_t max_built_items = 4'000'000;          // all list items built by range + *, together
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
};

class Renderer {
 public:
  explicit Renderer(const RenderLimits& limits = {}) : limits_(limits) {}
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders `tmpl` with `globals` as the outermost variables. Throws polylora::Error with a line number
  // (or TemplateRaisedError with the template's own message).
  std::string render(const Template& tmpl, std::vector<std::pair<std::string, Value>> globals);

  // For builtins: calls a callable value; checks a string about to be built against the size limit.
  Value call(const Value& callee, CallArgs& args);
  void check_size(size_t bytes) const;
  // Charges a string or list about to be built against the per-render budgets (and the size limit).
  void charge_bytes(size_t bytes);
  void charge_items(size_t items);
  // Namespaces are the only mutable values, so the only way to build a reference cycle; their entries are
  // dropped when the render ends so such cycles are freed.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using ScopePtr = std::shared_ptr<Scope>;

  void emit(const std::string& text);  // appends to the current output (the result, or a capture)
  Flow exec_body(const StmtList& body, const ScopePtr& scope);
  Flow exec(const Stmt& s, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  void assign(const ScopePtr& scope, const std::vector<Target>& targets, const Value& value);
  std::string capture(const StmtList& body, const ScopePtr& scope);
  Value apply_filters(const std::vector<ExprPtr>& filters, Value value, const ScopePtr& scope);
  Value make_macro(const Stmt& s, const ScopePtr& closure);
  Value call_macro(const Stmt& s, const ScopePtr& closure, CallArgs& args);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_name(const Expr& e, const ScopePtr& scope);
  Value eval_binary(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_attr(const Expr& e, const ScopePtr& scope);
  Value eval_item(const Expr& e, const ScopePtr& scope);
  Value eval_slice(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope);
  Value eval_filter(const Expr& e, Value input, const ScopePtr& scope);
  Value eval_test(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope);

  void enter(int line);
  struct DepthGuard {
    DepthGuard(Renderer& r, int line) : renderer(r) { r.enter(line); }
    ~DepthGuard() { --renderer.depth_; }
    Renderer& renderer;
  };

  RenderLimits limits_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  size_t built_bytes_ = 0;
  size_t built_items_ = 0;
  int depth_ = 0;
  int line_ = 0;
  std::vector<ScopePtr> closure_scopes_;  // cleared at the end to break macro <-> scope cycles
  std::vector<Value> namespaces_;
};

}  // namespace polylora::jinja
