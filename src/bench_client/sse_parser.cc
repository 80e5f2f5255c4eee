// bench_client/sse_parser.cc: see sse_parser.h.
#include "bench_client/sse_parser.h"

namespace polylora::bench_client {

bool SseParser::feed(std::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
  size_t begin = 0;
  while (true) {
    size_t end = pending_.find('\n', begin);
    if (end == std::string::npos) break;
    std::string_view line(pending_.data() + begin, end - begin);
    begin = end + 1;
    if (!emit_line(line)) {
      pending_.erase(0, begin);
      return false;
    }
  }
  pending_.erase(0, begin);
  return true;
}

bool SseParser::finish() {
  if (pending_.empty()) return true;
  std::string line = std::move(pending_);
  pending_.clear();
  return emit_line(line);
}

bool SseParser::emit_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  constexpr std::string_view kDataField = "data:";
  if (line.substr(0, kDataField.size()) != kDataField) return true;
  line.remove_prefix(kDataField.size());
  if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (line.empty()) return true;
  return on_data_(line);
}

}  // namespace polylora::bench_client
