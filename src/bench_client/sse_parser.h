// bench_client/sse_parser.h: incremental parser of a server-sent-events byte stream (the `stream: true`
// responses of OpenAI-compatible servers), fed with whatever chunks the socket delivers.
// Owns: line splitting across chunk boundaries and extraction of `data:` payloads.
// Must not: interpret the payloads (JSON handling is the caller's) or do I/O.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace polylora::bench_client {

class SseParser {
 public:
  // Called once per complete `data:` line with the payload after "data:" (one leading space removed),
  // e.g. `{"choices":...}` or `[DONE]`. Returning false stops the parse (feed() then returns false).
  using DataFn = std::function<bool(std::string_view data)>;

  explicit SseParser(DataFn on_data) : on_data_(std::move(on_data)) {}

  // Appends bytes; emits every line completed by them. Other fields (event:, id:, comments) are skipped.
  bool feed(std::string_view bytes);
  // Flushes a last line that had no trailing newline (the stream ended).
  bool finish();

 private:
  bool emit_line(std::string_view line);

  DataFn on_data_;
  std::string pending_;  // bytes after the last newline seen
};

}  // namespace polylora::bench_client
