// server/output_parser.cc: reasoning and tool-call parsers (see the header). Each feed re-parses the whole
// text into a snapshot (reasoning, content, calls) in which nothing undecided appears: a suffix that may
// still become a marker is held back, and a call appears once its name is known. The delta is the
// snapshot less what was already sent.
#include "server/output_parser.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "server/pythonic_tools.h"
#include "server/qwen3_coder_tools.h"
#include "server/text_markers.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolCallOpen = "<tool_call>", kToolCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kPythonStart = "<|python_start|>", kPythonEnd = "<|python_end|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_space(s[pos])) ++pos;
  return pos;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Harmony markers all start with "<|": a trailing "<", "<|" or "<|xyz" (no closing "|>") may be one.
size_t partial_special(std::string_view s) {
  size_t lt = s.rfind('<');
  if (lt == std::string_view::npos) return 0;
  std::string_view tail = s.substr(lt);
  if (tail.size() == 1) return 1;
  if (tail[1] != '|') return 0;
  if (tail.find("|>") != std::string_view::npos) return 0;
  for (size_t i = 2; i < tail.size(); ++i)
    if (!(std::isalnum(static_cast<unsigned char>(tail[i])) || tail[i] == '_' || tail[i] == '|')) return 0;
  return tail.size();
}

// The end of the JSON value starting at `pos` (after it), or npos when the text ends inside it.
// Only balance and strings are followed; the value is checked by a real parse once it is complete.
size_t scan_json_value(std::string_view s, size_t pos) {
  pos = skip_space(s, pos);
  if (pos >= s.size()) return std::string_view::npos;
  char c = s[pos];
  if (c == '{' || c == '[') {
    int depth = 0;
    bool in_string = false;
    for (size_t i = pos; i < s.size(); ++i) {
      char d = s[i];
      if (in_string) {
        if (d == '\\')
          ++i;
        else if (d == '"')
          in_string = false;
      } else if (d == '"') {
        in_string = true;
      } else if (d == '{' || d == '[') {
        ++depth;
      } else if (d == '}' || d == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return std::string_view::npos;
  }
  if (c == '"') {
    for (size_t i = pos + 1; i < s.size(); ++i) {
      if (s[i] == '\\')
        ++i;
      else if (s[i] == '"')
        return i + 1;
    }
    return std::string_view::npos;
  }
  // number, true, false, null: up to a delimiter (incomplete at the end of the text)
  size_t i = pos;
  while (i < s.size() && !is_space(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ';') ++i;
  return i == s.size() ? std::string_view::npos : i;
}

bool valid_json(std::string_view s) {
  return json::accept(s.begin(), s.end());
}

// Reads `"key"` at pos (after spaces); returns the position after it or npos.
size_t read_key(std::string_view s, size_t pos, std::string_view key) {
  pos = skip_space(s, pos);
  std::string quoted = "\"" + std::string(key) + "\"";
  if (s.substr(pos, quoted.size()) != quoted) return std::string_view::npos;
  pos = skip_space(s, pos + quoted.size());
  if (pos >= s.size() || s[pos] != ':') return std::string_view::npos;
  return pos + 1;
}

// A {"name": ..., "arguments"|"parameters": ...} object at `pos`, possibly unfinished.
struct CallObject {
  bool name_known = false;
  std::string name;
  std::string arguments;                // so far
  bool complete = false;                // the object's closing brace has been read
  bool valid = false;                   // complete and well-formed
  size_t end = std::string_view::npos;  // after the object, when complete
};

CallObject read_call_object(std::string_view s, size_t pos, bool final) {
  CallObject out;
  size_t start = skip_space(s, pos);
  if (start >= s.size() || s[start] != '{') return out;
  size_t obj_end = scan_json_value(s, start);
  // Fast path: the name first, then the arguments, which stream as they come.
  size_t p = read_key(s, start + 1, "name");
  if (p != std::string_view::npos) {
    size_t name_end = scan_json_value(s, p);
    size_t q = skip_space(s, p);
    if (name_end != std::string_view::npos && q < s.size() && s[q] == '"') {
      json name = json::parse(s.substr(q, name_end - q), nullptr, false);
      if (name.is_string()) {
        out.name_known = true;
        out.name = name.get<std::string>();
        size_t comma = skip_space(s, name_end);
        if (comma < s.size() && s[comma] == ',') {
          size_t a = read_key(s, comma + 1, "arguments");
          if (a == std::string_view::npos) a = read_key(s, comma + 1, "parameters");
          if (a != std::string_view::npos) {
            a = skip_space(s, a);
            size_t a_end = scan_json_value(s, a);
            out.arguments =
                std::string(s.substr(a, a_end == std::string_view::npos ? s.size() - a : a_end - a));
          }
        }
      }
    }
  }
  if (obj_end == std::string_view::npos && !final) return out;
  out.complete = true;
  out.end = obj_end == std::string_view::npos ? s.size() : obj_end;
  json obj = json::parse(s.substr(start, out.end - start), nullptr, false);
  if (obj.is_discarded() || !obj.is_object() || !obj.contains("name") || !obj["name"].is_string()) return out;
  const char* key = obj.contains("arguments") ? "arguments" : "parameters";
  std::string name = obj["name"].get<std::string>();
  std::string args = obj.contains(key)
                         ? (obj[key].is_string() ? obj[key].get<std::string>() : obj[key].dump())
                         : std::string("{}");
  if (!out.name_known || out.name != name || !valid_json(out.arguments)) {
    // Keys in another order (or arguments as a string): the parsed values, in one piece.
    out.name_known = true;
    out.name = name;
    out.arguments = args;
  }
  out.valid = true;
  return out;
}

}  // namespace

std::optional<ToolParserKind> tool_parser_from_name(std::string_view name) {
  if (name == "hermes") return ToolParserKind::kHermes;
  if (name == "openai") return ToolParserKind::kOpenai;
  if (name == "llama3_json") return ToolParserKind::kLlama3Json;
  if (name == "mistral") return ToolParserKind::kMistral;
  if (name == "qwen3_coder") return ToolParserKind::kQwen3Coder;
  if (name == "pythonic") return ToolParserKind::kPythonic;
  if (name == "llama4_pythonic") return ToolParserKind::kLlama4Pythonic;
  return std::nullopt;
}

std::optional<ReasoningParserKind> reasoning_parser_from_name(std::string_view name) {
  if (name == "qwen3") return ReasoningParserKind::kQwen3;
  if (name == "deepseek_r1") return ReasoningParserKind::kDeepSeekR1;
  if (name == "openai_gptoss" || name == "gpt_oss") return ReasoningParserKind::kGptOss;
  return std::nullopt;
}

const char* tool_parser_names() {
  return "hermes, openai, llama3_json, mistral, qwen3_coder, pythonic, llama4_pythonic";
}

const char* reasoning_parser_names() {
  return "qwen3, deepseek_r1, openai_gptoss";
}

bool needs_special_tokens(ToolParserKind tools, ReasoningParserKind reasoning) {
  return tools == ToolParserKind::kOpenai || tools == ToolParserKind::kMistral ||
         tools == ToolParserKind::kLlama3Json || tools == ToolParserKind::kLlama4Pythonic ||
         reasoning == ReasoningParserKind::kGptOss;
}

OutputParser::OutputParser(OutputParserOptions options) : options_(std::move(options)) {
  if (options_.tools == ToolParserKind::kQwen3Coder) param_types_ = tool_param_types(options_.tools_json);
}

OutputDelta OutputParser::feed(std::string_view text) {
  text_.append(text);
  return diff(snapshot(false));
}

OutputDelta OutputParser::finish() {
  Snapshot s = snapshot(true);
  OutputDelta d = diff(s);
  final_ = {};
  final_.reasoning = s.reasoning;
  final_.content = s.content;
  final_.has_reasoning = s.has_reasoning;
  for (size_t i = 0; i < s.calls.size(); ++i) final_.tool_calls.push_back(s.calls[i]);
  return d;
}

OutputParser::Result OutputParser::parse(const OutputParserOptions& options, std::string_view text) {
  OutputParser p(options);
  p.text_ = std::string(text);
  p.finish();
  return p.final_;
}

OutputDelta OutputParser::diff(const Snapshot& now) {
  OutputDelta d;
  auto grow = [](std::string& sent, const std::string& now_text, std::string& out) {
    if (now_text.size() > sent.size() && now_text.compare(0, sent.size(), sent) == 0) {
      out = now_text.substr(sent.size());
      sent = now_text;
    }
  };
  grow(sent_.reasoning, now.reasoning, d.reasoning);
  grow(sent_.content, now.content, d.content);
  sent_.has_reasoning = sent_.has_reasoning || now.has_reasoning;
  for (size_t i = 0; i < now.calls.size(); ++i) {
    if (i >= sent_.calls.size()) {
      if (i > sent_.calls.size()) break;
      sent_.calls.push_back({now.calls[i].name, ""});
      d.calls.push_back({i, true, now.calls[i].name, ""});
    }
    std::string args;
    grow(sent_.calls[i].arguments, now.calls[i].arguments, args);
    if (!d.calls.empty() && d.calls.back().index == i)
      d.calls.back().arguments += args;
    else if (!args.empty())
      d.calls.push_back({i, false, "", args});
  }
  return d;
}

namespace {

struct Sink {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
  bool has_reasoning = false;
};

// Tool calls in `s` (the text after reasoning), for the JSON-based parsers and qwen3_coder (`types`: its
// tools' parameter types).
void parse_tool_text(const OutputParserOptions& o, const ToolParamTypes& types, std::string_view s,
                     bool final, Sink& out) {
  auto add_call = [&](const CallObject& c) {
    if (c.name_known) out.calls.push_back({c.name, c.arguments});
  };
  // A list of call objects separated by `sep` from `pos`; false when a complete one does not parse.
  auto read_calls = [&](size_t pos, char sep, char close) {
    while (true) {
      pos = skip_space(s, pos);
      if (pos >= s.size()) return true;
      if (close && s[pos] == close) return true;
      CallObject c = read_call_object(s, pos, final);
      add_call(c);
      if (!c.complete) return true;
      if (!c.valid) return false;
      pos = skip_space(s, c.end);
      if (pos < s.size() && s[pos] == sep) ++pos;
    }
  };
  switch (o.tools) {
    case ToolParserKind::kNone:
    case ToolParserKind::kOpenai:  // harmony is parsed with its channels
      out.content.append(s);
      return;
    case ToolParserKind::kQwen3Coder: {
      Qwen3CoderParse q = parse_qwen3_coder(s, final, types);
      out.content.append(q.content);
      for (auto& c : q.calls) out.calls.push_back(std::move(c));
      return;
    }
    case ToolParserKind::kNamed: {
      size_t a = skip_space(s, 0);
      size_t end = scan_json_value(s, a);
      out.calls.push_back(
          {o.named_function, std::string(rtrim(s.substr(
                                 a, end == std::string_view::npos ? std::string_view::npos : end - a)))});
      return;
    }
    case ToolParserKind::kRequired: {
      size_t a = skip_space(s, 0);
      if (a < s.size() && s[a] == '[') {
        Sink calls;
        std::swap(calls, out);
        bool ok = read_calls(a + 1, ',', ']');
        std::swap(calls, out);
        if (ok || !final) {
          for (auto& c : calls.calls) out.calls.push_back(std::move(c));
          return;
        }
      }
      if (final) out.content.append(s);
      return;
    }
    case ToolParserKind::kHermes: {
      size_t open = s.find(kToolCallOpen);
      if (open == std::string_view::npos) {
        size_t hold = final ? 0 : partial_suffix(s, kToolCallOpen);
        out.content.append(s.substr(0, s.size() - hold));
        return;
      }
      std::string_view before = s.substr(0, open);
      std::vector<ParsedToolCall> calls;
      bool ok = true;
      size_t pos = open;
      while (pos != std::string_view::npos && ok) {
        size_t body = pos + kToolCallOpen.size();
        size_t close = s.find(kToolCallClose, body);
        bool complete = close != std::string_view::npos || final;
        std::string_view inner =
            s.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
        if (close == std::string_view::npos && !final)
          inner.remove_suffix(partial_suffix(inner, kToolCallClose));
        CallObject c = read_call_object(inner, 0, complete);
        if (c.name_known) calls.push_back({c.name, c.arguments});
        if (complete && !c.valid) ok = false;
        if (close == std::string_view::npos) break;
        pos = s.find(kToolCallOpen, close + kToolCallClose.size());
      }
      if (!ok && final) {  // vLLM: a call that does not parse leaves the whole output as content
        out.content.append(s);
        return;
      }
      out.content.append(before);
      for (auto& c : calls) out.calls.push_back(std::move(c));
      return;
    }
    case ToolParserKind::kLlama3Json: {
      size_t a = skip_space(s, 0);
      std::string_view rest = s.substr(a);
      if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
        a = skip_space(s, a + kPythonTag.size());
      } else if (!final && (rest.empty() || kPythonTag.substr(0, rest.size()) == rest)) {
        return;  // undecided
      } else if (rest.empty() || rest[0] != '{') {
        out.content.append(s);
        return;
      }
      Sink calls;
      std::swap(calls, out);
      bool ok = read_calls(a, ';', 0);
      std::swap(calls, out);
      if (!ok && final) {
        out.content.append(s);
        return;
      }
      for (auto& c : calls.calls) out.calls.push_back(std::move(c));
      return;
    }
    case ToolParserKind::kPythonic:
    case ToolParserKind::kLlama4Pythonic: {
      // vLLM: an output that starts with "[" (llama4: or <|python_start|>, its tags then dropped) may be a
      // call list; anything else, or a list that does not parse in the end, is content.
      size_t a = skip_space(s, 0);
      std::string_view body = s.substr(a);
      std::string stripped;
      if (o.tools == ToolParserKind::kLlama4Pythonic) {
        if (!final && !body.empty() && body.size() < kPythonStart.size() &&
            kPythonStart.substr(0, body.size()) == body)
          return;  // undecided: may still become <|python_start|>
        if (body.substr(0, kPythonStart.size()) == kPythonStart) {
          std::string_view inner = body.substr(kPythonStart.size());
          for (size_t at; (at = inner.find(kPythonEnd)) != std::string_view::npos;) {
            stripped.append(inner.substr(0, at));
            inner.remove_prefix(at + kPythonEnd.size());
          }
          if (!final) inner.remove_suffix(partial_suffix(inner, kPythonEnd));
          stripped.append(inner);
          body = stripped;
          body.remove_prefix(skip_space(body, 0));
        }
      }
      if (body.empty()) {
        if (final) out.content.append(s);
        return;
      }
      if (body[0] != '[') {
        out.content.append(s);
        return;
      }
      PythonicParse pc = parse_pythonic_calls(body, final);
      if (final && !pc.ok) {
        out.content.append(s);
        return;
      }
      for (auto& c : pc.calls) out.calls.push_back(std::move(c));
      return;
    }
    case ToolParserKind::kMistral: {
      size_t open = s.find(kMistralCalls);
      if (open == std::string_view::npos) {
        size_t hold = final ? 0 : partial_suffix(s, kMistralCalls);
        out.content.append(s.substr(0, s.size() - hold));
        return;
      }
      std::string_view before = s.substr(0, open);
      Sink calls;
      std::swap(calls, out);
      bool ok = true;
      size_t pos = open;
      while (pos != std::string_view::npos && ok) {
        size_t p = skip_space(s, pos + kMistralCalls.size());
        if (p < s.size() && s[p] == '[') {  // the JSON-list form
          ok = read_calls(p + 1, ',', ']');
          break;
        }
        // NAME[ARGS]{...}: the name is known once [ARGS] is seen
        size_t args = s.find(kMistralArgs, p);
        if (args == std::string_view::npos) {
          if (final && p < s.size()) ok = false;
          break;
        }
        std::string name(rtrim(s.substr(p, args - p)));
        size_t a = skip_space(s, args + kMistralArgs.size());
        size_t end = scan_json_value(s, a);
        std::string_view value =
            s.substr(a, end == std::string_view::npos ? std::string_view::npos : end - a);
        if (end == std::string_view::npos && !final)
          value.remove_suffix(partial_suffix(value, kMistralCalls));
        out.calls.push_back({name, std::string(rtrim(value))});
        if (end == std::string_view::npos) {
          if (final && !valid_json(rtrim(value))) ok = false;
          break;
        }
        pos = s.find(kMistralCalls, end);
      }
      std::swap(calls, out);
      if (!ok && final) {
        out.content.append(s);
        return;
      }
      out.content.append(before);
      for (auto& c : calls.calls) out.calls.push_back(std::move(c));
      return;
    }
  }
}

// Harmony: messages "<|start|>assistant<|channel|>NAME[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY"
// ended by <|end|>, <|call|> or <|return|> (the first message's <|start|>assistant is in the prompt).
void parse_harmony(const OutputParserOptions& o, std::string_view s, bool final, Sink& out) {
  static constexpr std::string_view kMessage = "<|message|>", kChannel = "<|channel|>";
  out.has_reasoning = true;
  if (final && s.find(kMessage) == std::string_view::npos && s.find(kChannel) == std::string_view::npos) {
    out.content.append(s);  // not harmony at all: plain content
    return;
  }
  size_t pos = 0;
  while (pos < s.size()) {
    size_t msg = s.find(kMessage, pos);
    if (msg == std::string_view::npos) return;  // the header is not complete yet
    std::string_view header = s.substr(pos, msg - pos);
    size_t body = msg + kMessage.size();
    size_t end = std::string_view::npos, end_len = 0;
    for (std::string_view t : {"<|end|>", "<|call|>", "<|return|>", "<|start|>"}) {
      size_t e = s.find(t, body);
      if (e != std::string_view::npos && e < end) {
        end = e;
        end_len = t.size();
      }
    }
    std::string_view text =
        s.substr(body, end == std::string_view::npos ? std::string_view::npos : end - body);
    if (end == std::string_view::npos && !final) text.remove_suffix(partial_special(text));
    std::string channel, recipient;
    if (size_t c = header.find(kChannel); c != std::string_view::npos) {
      size_t a = c + kChannel.size(), b = a;
      while (b < header.size() && !is_space(header[b]) && header[b] != '<') ++b;
      channel = std::string(header.substr(a, b - a));
    }
    if (size_t t = header.find("to="); t != std::string_view::npos) {
      size_t a = t + 3, b = a;
      while (b < header.size() && !is_space(header[b]) && header[b] != '<') ++b;
      recipient = std::string(header.substr(a, b - a));
    }
    if (recipient.rfind("functions.", 0) == 0 && o.tools == ToolParserKind::kOpenai) {
      out.calls.push_back(
          {recipient.substr(10), std::string(end == std::string_view::npos && !final ? text : rtrim(text))});
    } else if (channel == "analysis") {
      out.reasoning.append(text);
    } else {
      out.content.append(text);  // final, and commentary preambles
    }
    if (end == std::string_view::npos) return;
    pos = end + end_len;  // the next message's <|start|>role, if any, is part of its header
  }
}

}  // namespace

OutputParser::Snapshot OutputParser::snapshot(bool final) const {
  Sink sink;
  std::string_view s = text_;
  if (options_.reasoning == ReasoningParserKind::kGptOss || options_.tools == ToolParserKind::kOpenai) {
    parse_harmony(options_, s, final, sink);
    sink.has_reasoning = options_.reasoning == ReasoningParserKind::kGptOss && !sink.reasoning.empty();
  } else {
    std::string_view rest = s;
    if (options_.reasoning == ReasoningParserKind::kQwen3 ||
        options_.reasoning == ReasoningParserKind::kDeepSeekR1) {
      size_t start = std::string_view::npos;
      // deepseek_r1: reasoning until </think> (or to the end without one), a <think> written by the model
      // skipped, as vLLM's DeepSeekR1ReasoningParser.
      if (options_.starts_in_reasoning || options_.reasoning == ReasoningParserKind::kDeepSeekR1) {
        start = 0;
        // some templates leave the model to write <think> itself (held back while it may still be one)
        size_t a = skip_space(s, 0);
        std::string_view head = s.substr(a);
        if (head.substr(0, kThinkOpen.size()) == kThinkOpen)
          start = a + kThinkOpen.size();
        else if (!final && kThinkOpen.substr(0, head.size()) == head)
          start = s.size();  // undecided: "<thi" (or whitespace alone) may still become "<think>"
      } else {
        size_t a = skip_space(s, 0);
        std::string_view head = s.substr(a);
        if (head.substr(0, kThinkOpen.size()) == kThinkOpen)
          start = a + kThinkOpen.size();
        else if (!final && kThinkOpen.substr(0, head.size()) == head)
          rest = {};  // undecided: "<thi" may still become "<think>"
      }
      if (start != std::string_view::npos) {
        sink.has_reasoning = true;
        size_t close = s.find(kThinkClose, start);
        if (close == std::string_view::npos) {
          std::string_view r = s.substr(start);
          if (!final) r.remove_suffix(partial_suffix(r, kThinkClose));
          sink.reasoning = std::string(r);
          rest = {};
        } else {
          sink.reasoning = std::string(s.substr(start, close - start));
          rest = s.substr(skip_space(s, close + kThinkClose.size()));
        }
      }
    }
    if (!rest.empty()) parse_tool_text(options_, param_types_, rest, final, sink);
  }
  Snapshot snap;
  snap.reasoning = std::move(sink.reasoning);
  snap.content = std::move(sink.content);
  snap.calls = std::move(sink.calls);
  snap.has_reasoning = sink.has_reasoning;
  return snap;
}

std::string required_tools_schema(std::string_view tools_json) {
  json tools = json::parse(tools_json.begin(), tools_json.end(), nullptr, false);
  json any = json::array();
  if (tools.is_array())
    for (const auto& t : tools) {
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
      const json& f = t["function"];
      json name = f.contains("name") && f["name"].is_string() ? f["name"] : json("");
      json params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"]
                                                                            : json{{"type", "object"}};
      any.push_back(
          {{"type", "object"},
           {"properties",
            {{"name", {{"type", "string"}, {"enum", json::array({name})}}}, {"parameters", params}}},
           {"required", json::array({"name", "parameters"})}});
    }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any}}}};
  return schema.dump();
}

}  // namespace polylora::server
