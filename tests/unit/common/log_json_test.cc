// tests/unit/common/log_json_test.cc: POLYLORA_LOG_FORMAT=json lines are JSON objects with the message
// escaped (quotes, backslashes, control characters, invalid UTF-8).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/log.h"

namespace polylora {
namespace {

TEST(LogJson, FieldsAndEscaping) {
  std::string msg = "say \"hi\"\\ \n\ttab \x01 caf\xc3\xa9 bad\xff end";
  std::string line = json_log_line("2026-01-02T03:04:05.678Z", "INFO", msg, "polylora");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["time"], "2026-01-02T03:04:05.678Z");
  EXPECT_EQ(j["level"], "INFO");
  EXPECT_EQ(j["logger"], "polylora");
  EXPECT_EQ(j["message"], "say \"hi\"\\ \n\ttab \x01 caf\xc3\xa9 bad\xef\xbf\xbd end");
}

}  // namespace
}  // namespace polylora
