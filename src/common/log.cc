// common/log.cc: logger set-up, and the JSON line formatter (POLYLORA_LOG_FORMAT=json).
#include "common/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>

#include "common/utf8.h"

namespace polylora {
namespace {

void append_json_string(std::string& out, std::string_view raw) {
  const std::string s = sanitize_utf8(raw);  // a JSON string must be valid UTF-8
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    auto t = system_clock::to_time_t(msg.time);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char when[40];
    size_t n = std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    int ms = static_cast<int>(duration_cast<milliseconds>(msg.time.time_since_epoch()).count() % 1000);
    std::snprintf(when + n, sizeof when - n, ".%03dZ", ms);
    auto level = spdlog::level::to_string_view(msg.level);
    std::string line = json_log_line(when, upper(std::string_view(level.data(), level.size())),
                                     std::string_view(msg.payload.data(), msg.payload.size()),
                                     std::string_view(msg.logger_name.data(), msg.logger_name.size()));
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

std::string json_log_line(std::string_view time, std::string_view level, std::string_view message,
                          std::string_view logger) {
  std::string out = "{\"time\":";
  append_json_string(out, time);
  out += ",\"level\":";
  append_json_string(out, level);
  out += ",\"message\":";
  append_json_string(out, message);
  out += ",\"logger\":";
  append_json_string(out, logger);
  out += '}';
  return out;
}

void init_logging() {
  auto logger = spdlog::stderr_color_mt("polylora");
  spdlog::set_default_logger(logger);
  const char* format = std::getenv("POLYLORA_LOG_FORMAT");
  if (format && std::string(format) == "json")
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  else
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  const char* level = std::getenv("POLYLORA_LOG_LEVEL");
  spdlog::set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
}

}  // namespace polylora
