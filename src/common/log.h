// common/log.h: logging to standard error (standard output is reserved for command results).
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace polylora {
// Sends all logs to stderr; level from POLYLORA_LOG_LEVEL (trace|debug|info|warn|error), default info.
// POLYLORA_LOG_FORMAT=json writes each line as one JSON object: {"time", "level", "message", "logger"}.
void init_logging();
// For tests: one log record as that JSON line (without the newline). `time` is ISO 8601 in UTC.
std::string json_log_line(std::string_view time, std::string_view level, std::string_view message,
                          std::string_view logger);
}  // namespace polylora
