// apps/cmd_chat_template.cc: `polylora chat-template`: renders a Jinja chat template for each JSON line of
// standard input ({"messages", "tools", "add_generation_prompt", "kwargs"}) and writes one JSON line per
// input, {"rendered": ...} or {"error": ...}. A bad line yields an error line; processing continues.
// Must not: hold rendering logic (tokenizer/chat_template.h does).
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "apps/command.h"
#include "common/error.h"
#include "tokenizer/chat_template.h"

namespace polylora::apps {
namespace {

using Json = nlohmann::ordered_json;

// One input line to one output object.
Json render_line(const ChatTemplate& tmpl, const std::string& line, const ChatTemplateInputs& defaults) {
  try {
    Json request = Json::parse(line);
    if (!request.is_object()) return {{"error", "each input line must be a JSON object"}};
    ChatTemplateInputs inputs = defaults;
    if (request.contains("messages")) inputs.messages = request["messages"];
    if (!inputs.messages.is_array()) return {{"error", "'messages' must be an array"}};
    if (request.contains("tools")) inputs.tools = request["tools"];
    if (request.contains("add_generation_prompt")) {
      if (!request["add_generation_prompt"].is_boolean())
        return {{"error", "'add_generation_prompt' must be a boolean"}};
      inputs.add_generation_prompt = request["add_generation_prompt"].get<bool>();
    }
    if (request.contains("kwargs") && !request["kwargs"].is_null()) {
      if (!request["kwargs"].is_object()) return {{"error", "'kwargs' must be an object"}};
      inputs.kwargs = request["kwargs"];
    }
    return {{"rendered", tmpl.render(inputs)}};
  } catch (const Json::exception& e) {
    return {{"error", std::string("invalid JSON input: ") + e.what()}};
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

int run(int argc, char** argv) {
  CLI::App app{"Render a chat template for each JSON line of standard input", "chat-template"};
  std::string template_path;
  ChatTemplateInputs defaults;
  std::string date;
  app.add_option("--template", template_path, "Jinja chat template file")->required();
  app.add_option("--bos-token", defaults.bos_token, "value of bos_token");
  app.add_option("--eos-token", defaults.eos_token, "value of eos_token");
  app.add_option("--date", date, "YYYY-MM-DD date seen by strftime_now (default: today)");
  CLI11_PARSE(app, argc, argv);
  if (!date.empty()) defaults.date = date;

  std::ifstream in(template_path, std::ios::binary);
  if (!in) fail("cannot read chat template '{}'", template_path);
  std::stringstream source;
  source << in.rdbuf();
  ChatTemplate tmpl = ChatTemplate::compile(source.str());

  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::cout << render_line(tmpl, line, defaults).dump(-1, ' ', false, Json::error_handler_t::replace)
              << '\n';
    std::cout.flush();
  }
  return 0;
}

const Registrar kRegistrar("chat-template", "render a Jinja chat template for JSON lines of messages", run);

}  // namespace
}  // namespace polylora::apps
