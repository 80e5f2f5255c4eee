// engine/stats_logger.h: vLLM's periodic stats line ("Engine 000: Avg prompt throughput: ..."), computed
// from successive EngineStats. Fed by the engine thread (it owns the engine); pure arithmetic, so a test
// can drive it with made-up stats and times.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "engine/engine.h"

namespace polylora {

class StatsLogger {
 public:
  using Clock = std::chrono::steady_clock;
  struct Line {
    std::string text;
    bool idle = false;  // no throughput now nor in the previous line: vLLM logs it at debug level
  };
  // interval_s <= 0: never due.
  StatsLogger(double interval_s, Clock::time_point start);
  bool enabled() const { return interval_s_ > 0; }
  Clock::time_point next_due() const { return next_; }
  // The line when `now` is at or past the next due time (then the next one is `interval` later).
  std::optional<Line> maybe_log(const EngineStats& s, Clock::time_point now);
  // The line for the stats since the last one, whatever the time.
  Line make_line(const EngineStats& s, Clock::time_point now);

 private:
  double interval_s_;
  Clock::time_point last_, next_;
  int64_t last_prompt_ = 0, last_generation_ = 0;
  double last_prompt_tp_ = 0, last_generation_tp_ = 0;
};

}  // namespace polylora
