// common/log.h: logging to standard error (standard output is reserved for command results).
#pragma once

#include <spdlog/spdlog.h>

namespace polylora {
// Sends all logs to stderr; level from POLYLORA_LOG_LEVEL (trace|debug|info|warn|error), default info.
void init_logging();
}  // namespace polylora
