// server/beam_search.cc: vLLM's beam search as rounds of one-token engine requests (see the header).
#include "server/beam_search.h"

#include <algorithm>
#include <cmath>

namespace polylora::server {

BeamSearch::BeamSearch(EngineRequest request, BeamSearchOptions options, EngineThread& engine,
                       const tokenizer::Tokenizer* tokenizer, int64_t max_model_len, PostWork post_work,
                       EngineThread::AddCallback done)
    : request_(std::move(request)),
      options_(options),
      engine_(engine),
      tokenizer_(tokenizer),
      post_work_(std::move(post_work)),
      done_(std::move(done)) {
  if (tokenizer_) eos_ = tokenizer_->eos_id();  // vLLM: the tokenizer's eos_token_id
  const int64_t room = max_model_len - static_cast<int64_t>(request_.prompt_ids.size());
  rounds_ = std::min(request_.sampling.max_tokens.value_or(room), room);
  beams_.push_back(Beam{request_.prompt_ids, {}, 0.0, false});
}

std::string BeamSearch::round_request_id(size_t beam) const {
  return request_.request_id + "-beam-" + std::to_string(round_) + "-" + std::to_string(beam);
}

void BeamSearch::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (rounds_ <= 0)
    finish();
  else
    submit_round();
}

void BeamSearch::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ended_ = true;
  done_ = nullptr;
  abort_round();
}

void BeamSearch::submit_round() {
  const size_t nb = beams_.size();
  streams_.assign(nb, nullptr);
  results_.assign(nb, std::nullopt);
  answered_.assign(nb, false);
  pending_ = nb;
  auto self = shared_from_this();
  for (size_t i = 0; i < nb; ++i) {
    EngineRequest r;
    r.request_id = round_request_id(i);
    r.prompt_ids = beams_[i].tokens;
    r.adapter = request_.adapter;
    r.cache_salt = request_.cache_salt;
    r.priority = request_.priority;
    // vLLM's per-round SamplingParams(logprobs=2·width, max_tokens=1): the logprobs are the raw ones, so the
    // request's temperature does not change them; greedy keeps the sampled token among the alternatives.
    r.sampling.temperature = 0.0;
    r.sampling.max_tokens = 1;
    r.sampling.logprobs = 2 * options_.width;
    engine_.add_request_async(std::move(r),
                              [self, i](std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
                                self->post_work_([self, i, stream = std::move(stream), error]() mutable {
                                  self->on_added(i, std::move(stream), error);
                                });
                              });
  }
}

void BeamSearch::on_added(size_t beam, std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) {
    if (stream) engine_.abort(round_request_id(beam));
    return;
  }
  if (error) {
    abort_round();
    complete(nullptr, error);
    return;
  }
  streams_[beam] = stream;
  // Strong: the round's streams are released (listeners cleared) when it ends, which breaks the cycle.
  auto self = shared_from_this();
  stream->set_listener([self, beam] { self->post_work_([self, beam] { self->drain(beam); }); });
}

void BeamSearch::drain(size_t beam) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_ || beam >= streams_.size() || answered_[beam] || !streams_[beam]) return;
  while (auto o = streams_[beam]->next(std::chrono::milliseconds(0))) {
    if (o->error) {  // the engine failed or is stopping: Generation answers it as it answers any request
      abort_round();
      auto failed = std::make_shared<OutputStream>();
      RequestOutput out;
      out.request_id = request_.request_id;
      out.error = o->error;
      out.error_is_shutdown = o->error_is_shutdown;
      out.finished = true;
      failed->push(std::move(out));
      complete(std::move(failed), nullptr);
      return;
    }
    if (round_ == 0 && cached_tokens_ < 0) cached_tokens_ = o->num_cached_tokens;
    for (const SequenceOutput& s : o->sequences)
      if (!s.new_logprobs.empty()) results_[beam] = s.new_logprobs.front();
    if (o->finished) {
      answered_[beam] = true;
      --pending_;
      break;
    }
  }
  if (pending_ == 0) end_round();
}

double BeamSearch::score(const Beam& b) const {
  auto len = static_cast<double>(b.tokens.size());
  if (eos_ && !b.tokens.empty() && b.tokens.back() == *eos_) len -= 1;
  return b.cum_logprob / std::pow(len, options_.length_penalty);
}

void BeamSearch::end_round() {
  const bool keep_logprobs = request_.sampling.logprobs.has_value();
  const auto top_kept = static_cast<size_t>(std::max<int64_t>(0, request_.sampling.logprobs.value_or(0)));
  std::vector<Beam> next;
  for (size_t i = 0; i < beams_.size(); ++i) {
    if (!results_[i]) continue;  // aborted without a token: the beam ends here
    const LogprobEntry& e = *results_[i];
    std::vector<TokenLogprob> candidates = e.top;
    if (std::none_of(candidates.begin(), candidates.end(),
                     [&](const TokenLogprob& t) { return t.id == e.id; }))
      candidates.push_back({e.id, e.logprob});
    for (size_t k = 0; k < candidates.size(); ++k) {
      const TokenLogprob& c = candidates[k];
      Beam nb = beams_[i];
      nb.tokens.push_back(c.id);
      nb.cum_logprob += c.logprob;
      if (keep_logprobs) {
        LogprobEntry le;
        le.id = c.id;
        le.logprob = c.logprob;
        le.rank = k < e.top.size() ? static_cast<int64_t>(k) + 1 : e.rank;
        le.top.assign(e.top.begin(),
                      e.top.begin() + static_cast<std::ptrdiff_t>(std::min(top_kept, e.top.size())));
        nb.logprobs.push_back(std::move(le));
      }
      if (eos_ && c.id == *eos_ && !options_.ignore_eos) {
        nb.eos = true;
        if (!options_
                 .include_stop_str_in_output) {  // vLLM keeps the EOS only with include_stop_str_in_output
          nb.tokens.pop_back();
          if (keep_logprobs) nb.logprobs.pop_back();
        }
        finished_.push_back(std::move(nb));
      } else {
        next.push_back(std::move(nb));
      }
    }
  }
  // Stable, best first (Python's sorted(..., reverse=True) keeps the order of equal scores).
  std::stable_sort(next.begin(), next.end(),
                   [this](const Beam& a, const Beam& b) { return score(a) > score(b); });
  if (next.size() > static_cast<size_t>(options_.width)) next.resize(static_cast<size_t>(options_.width));
  for (auto& s : streams_)
    if (s) s->set_listener(nullptr);
  streams_.clear();
  beams_ = std::move(next);
  ++round_;
  if (round_ >= rounds_ || beams_.empty())
    finish();
  else
    submit_round();
}

void BeamSearch::finish() {
  std::vector<Beam> all = std::move(finished_);
  for (auto& b : beams_) all.push_back(std::move(b));
  std::stable_sort(all.begin(), all.end(),
                   [this](const Beam& a, const Beam& b) { return score(a) > score(b); });
  if (all.size() > static_cast<size_t>(options_.width)) all.resize(static_cast<size_t>(options_.width));
  const size_t prompt = request_.prompt_ids.size();
  RequestOutput out;
  out.request_id = request_.request_id;
  out.num_prompt_tokens = static_cast<int64_t>(prompt);
  out.num_cached_tokens = std::max<int64_t>(0, cached_tokens_);
  out.finished = true;
  for (size_t k = 0; k < all.size(); ++k) {
    const Beam& b = all[k];
    SequenceOutput s;
    s.index = static_cast<int64_t>(k);
    s.new_token_ids.assign(b.tokens.begin() + static_cast<std::ptrdiff_t>(prompt), b.tokens.end());
    std::vector<int32_t> text_ids = s.new_token_ids;
    if (b.eos && !text_ids.empty() && text_ids.back() == *eos_) text_ids.pop_back();  // the EOS is not text
    if (tokenizer_) s.new_text = tokenizer_->decode(text_ids, request_.sampling.skip_special_tokens);
    s.new_logprobs = b.logprobs;
    s.finish_reason = b.eos ? FinishReason::kStop : FinishReason::kLength;
    if (b.eos) s.stop_reason = StopReason(*eos_);
    s.num_output_tokens = static_cast<int64_t>(s.new_token_ids.size());
    out.sequences.push_back(std::move(s));
  }
  beams_.clear();
  auto stream = std::make_shared<OutputStream>();
  stream->push(std::move(out));
  complete(std::move(stream), nullptr);
}

void BeamSearch::abort_round() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (!streams_[i]) continue;
    streams_[i]->set_listener(nullptr);
    if (!answered_[i]) engine_.abort(round_request_id(i));
  }
  streams_.clear();
}

void BeamSearch::complete(std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
  ended_ = true;
  auto done = std::move(done_);
  done_ = nullptr;
  if (done) done(std::move(stream), error);  // Generation's callback only posts work: safe under mu_
}

}  // namespace polylora::server
