// tokenizer/chat_template.cc: builds the Jinja context from chat inputs (JSON -> values) and renders.
// Must not: tokenize.
#include "tokenizer/chat_template.h"

#include <algorithm>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_renderer.h"

namespace polylora {
namespace {

constexpr int kMaxJsonDepth = 128;

jinja::Value from_json(const nlohmann::ordered_json& j, int depth = 0) {
  using jinja::Value;
  if (depth > kMaxJsonDepth) fail("chat template input nested more than {} levels deep", kMaxJsonDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::binary:
      fail("binary JSON values are not supported in chat templates");
    case nlohmann::json::value_t::array: {
      jinja::ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      d.entries().entries.reserve(j.size());
      for (const auto& [k, v] : j.items()) {
        Value value = from_json(v, depth + 1);
        d.entries().depth = std::max(d.entries().depth, value.depth() + 1);
        d.entries().entries.emplace_back(Value::string(k), std::move(value));
      }
      return d;
    }
  }
  return Value::none();
}

}  // namespace

ChatTemplate ChatTemplate::compile(std::string source) {
  ChatTemplate t;
  t.tree_ = jinja::parse_template(source);
  t.content_format_ = detect_content_format(*t.tree_);
  t.source_ = std::move(source);
  return t;
}

std::string ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  return render(inputs, jinja::RenderLimits{});
}

std::string ChatTemplate::render(const ChatTemplateInputs& inputs, const jinja::RenderLimits& limits) const {
  auto globals = jinja::builtin_globals(inputs.date);
  auto set = [&](const std::string& name, jinja::Value v) {
    for (auto& g : globals) {
      if (g.first == name) {
        g.second = std::move(v);
        return;
      }
    }
    globals.emplace_back(name, std::move(v));
  };
  set("messages", from_json(inputs.messages));
  set("tools", from_json(inputs.tools));
  set("add_generation_prompt", jinja::Value::boolean(inputs.add_generation_prompt));
  set("bos_token", jinja::Value::string(inputs.bos_token));
  set("eos_token", jinja::Value::string(inputs.eos_token));
  if (inputs.kwargs.is_object()) {
    for (const auto& [k, v] : inputs.kwargs.items()) set(k, from_json(v));
  } else if (!inputs.kwargs.is_null()) {
    fail("chat template kwargs must be a JSON object");
  }
  jinja::Renderer renderer(limits);
  return renderer.render(*tree_, std::move(globals));
}

}  // namespace polylora
