// tokenizer/chat_template_format.cc: which form a chat template wants message content in (vLLM's
// --chat-template-content-format auto): "openai" (a list of {"type": "text", "text": ...} parts) when it
// loops over a message's content, else "string". The rule is vLLM's _detect_content_format, over this
// parser's syntax tree: the names bound to `messages` (directly or through `{% set x = messages[1:] %}`,
// filters and tests, transitively), the loop variables of `{% for m in <such a name> %}`, and then any
// `{% for c in m['content'] %}` / `m.content` (through filters, tests and slices) over one of those. Where
// vLLM's detection asserts (a matching assignment or loop with a target that is not a plain name) it
// falls back to "string", and so does this.
// Must not: render, or know about requests.
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_parser.h"

namespace polylora {
namespace {

using jinja::Expr;
using jinja::ExprKind;
using jinja::Stmt;
using jinja::StmtKind;
using jinja::StmtList;

struct Unsupported {};  // vLLM's detection would have failed an assertion: "string"

bool is_var(const Expr* e, const std::string& name) {
  return e != nullptr && e->kind == ExprKind::kName && e->name == name;
}

bool is_attr(const Expr* e, const std::string& var, const std::string& key) {
  if (e == nullptr || e->children.empty()) return false;
  if (e->kind == ExprKind::kGetItem)
    return e->children.size() >= 2 && is_var(e->children[0].get(), var) && e->children[1] &&
           e->children[1]->kind == ExprKind::kLiteral && e->children[1]->value.is_string() &&
           e->children[1]->value.as_string() == key;
  if (e->kind == ExprKind::kGetAttr) return is_var(e->children[0].get(), var) && e->name == key;
  return false;
}

// `var` (or var[key] / var.key) itself, or through a filter, a test or a slice.
bool is_var_or_elems(const Expr* e, const std::string& var, const std::string* key) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kFilter || e->kind == ExprKind::kTest || e->kind == ExprKind::kSlice)
    return !e->children.empty() && is_var_or_elems(e->children[0].get(), var, key);
  return key ? is_attr(e, var, *key) : is_var(e, var);
}

// Every statement of the tree, depth first in source order (jinja2's find_all).
void collect(const StmtList& list, std::vector<const Stmt*>& out) {
  for (const auto& s : list) {
    if (!s) continue;
    out.push_back(s.get());
    for (const auto& [cond, body] : s->branches) collect(body, out);
    collect(s->body, out);
    collect(s->else_body, out);
  }
}

// The names bound to `root_name`: itself, then every `{% set x = <a bound name, or its elements> %}`.
std::vector<std::string> bound_names(const std::vector<const Stmt*>& stmts, const std::string& root_name) {
  std::vector<std::string> names{root_name};
  std::set<std::string> seen{root_name};
  std::deque<std::string> queue{root_name};
  while (!queue.empty()) {
    const std::string related = queue.front();
    queue.pop_front();
    for (const Stmt* s : stmts) {
      if (s->kind != StmtKind::kSet || !is_var_or_elems(s->expr.get(), related, nullptr)) continue;
      if (s->targets.size() != 1 || !s->targets[0].attr.empty()) throw Unsupported{};
      const std::string& lhs = s->targets[0].name;
      names.push_back(lhs);
      if (seen.insert(lhs).second) queue.push_back(lhs);  // (vLLM loops forever on a cycle)
    }
  }
  return names;
}

// Loop variables of `{% for v in <one of names, or its elements[key]> %}`.
std::vector<std::string> loop_names(const std::vector<const Stmt*>& stmts,
                                    const std::vector<std::string>& names, const std::string* key) {
  std::vector<std::string> out;
  for (const Stmt* s : stmts) {
    if (s->kind != StmtKind::kFor) continue;
    for (const std::string& n : names) {
      if (!is_var_or_elems(s->expr.get(), n, key)) continue;
      if (s->targets.size() != 1 || !s->targets[0].attr.empty()) throw Unsupported{};
      out.push_back(s->targets[0].name);
      if (key) return out;  // the first content loop decides
      break;
    }
  }
  return out;
}

}  // namespace

ChatContentFormat detect_content_format(const jinja::Template& tree) {
  std::vector<const Stmt*> stmts;
  collect(tree.body, stmts);
  try {
    const std::vector<std::string> message_lists = bound_names(stmts, "messages");
    const std::vector<std::string> messages = loop_names(stmts, message_lists, nullptr);
    const std::string content = "content";
    return loop_names(stmts, messages, &content).empty() ? ChatContentFormat::kString
                                                         : ChatContentFormat::kOpenai;
  } catch (const Unsupported&) {
    return ChatContentFormat::kString;
  }
}

}  // namespace polylora
