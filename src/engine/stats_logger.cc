// engine/stats_logger.cc: the periodic stats line, in vLLM's (V1 LoggingStatLogger) wording.
#include "engine/stats_logger.h"

#include <spdlog/fmt/fmt.h>

namespace polylora {

StatsLogger::StatsLogger(double interval_s, Clock::time_point start)
    : interval_s_(interval_s), last_(start), next_(start) {
  if (enabled())
    next_ = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s));
}

std::optional<StatsLogger::Line> StatsLogger::maybe_log(const EngineStats& s, Clock::time_point now) {
  if (!enabled() || now < next_) return std::nullopt;
  Line line = make_line(s, now);
  auto step = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
  next_ += step;
  if (next_ <= now) next_ = now + step;  // a long step: do not log several lines at once
  return line;
}

StatsLogger::Line StatsLogger::make_line(const EngineStats& s, Clock::time_point now) {
  double elapsed = std::chrono::duration<double>(now - last_).count();
  if (elapsed <= 0) elapsed = 1e-9;
  double prompt_tp = static_cast<double>(s.prompt_tokens - last_prompt_) / elapsed;
  double generation_tp = static_cast<double>(s.generation_tokens - last_generation_) / elapsed;
  double hit_rate =
      s.prefix_queries > 0 ? 100.0 * static_cast<double>(s.prefix_hits) / static_cast<double>(s.prefix_queries)
                           : 0.0;
  Line line;
  line.text = fmt::format(
      "Engine 000: Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, "
      "Running: {} reqs, Waiting: {} reqs, GPU KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      prompt_tp, generation_tp, s.num_running, s.num_waiting, 100.0 * s.kv_usage, hit_rate);
  line.idle = prompt_tp == 0 && generation_tp == 0 && last_prompt_tp_ == 0 && last_generation_tp_ == 0;
  last_ = now;
  last_prompt_ = s.prompt_tokens;
  last_generation_ = s.generation_tokens;
  last_prompt_tp_ = prompt_tp;
  last_generation_tp_ = generation_tp;
  return line;
}

}  // namespace polylora
