// server/beam_search.h: vLLM's beam search (`use_beam_search` on /v1/completions and /v1/chat/completions)
// for one prompt, run as vLLM runs it: in rounds of one-token engine requests. Each round asks the engine,
// for every live beam, for one greedy token with 2·width alternatives (their raw logprobs); every
// alternative extends its beam's cumulative logprob, an extension by the EOS token (unless ignore_eos) is
// set aside as finished, and the best `width` of the others live on. After max_tokens rounds (or once no
// beam is left), the finished and live beams are ranked by cumulative logprob / length^length_penalty
// (length: prompt and output, less a final EOS; vLLM's get_beam_search_score) and the best `width` come
// back as one final RequestOutput of `width` sequences on a stream of its own, so that Generation answers
// it as any other engine request. Each round's prompts are the previous round's plus one token: the prefix
// cache makes them cost about a token each.
// Must not: parse requests or build JSON (openai_api.cc and generation.cc do).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_thread.h"
#include "server/openai_api.h"

namespace polylora::server {

class BeamSearch : public std::enable_shared_from_this<BeamSearch> {
 public:
  using PostWork = std::function<void(std::function<void()>)>;
  // `request`: the parsed prompt (its id names the round requests, its adapter, cache salt and priority
  // are theirs; of its sampling, max_tokens, logprobs and skip_special_tokens apply). `done` is called once
  // (not after cancel): with the stream of the final output, or with the error that refused a round's
  // request. `max_model_len` bounds the rounds (a beam's prompt must leave room for its token).
  BeamSearch(EngineRequest request, BeamSearchOptions options, EngineThread& engine,
             const tokenizer::Tokenizer* tokenizer, int64_t max_model_len, PostWork post_work,
             EngineThread::AddCallback done);
  void start();
  // Aborts the round in flight; `done` is not called afterwards.
  void cancel();

 private:
  struct Beam {
    std::vector<int32_t> tokens;         // prompt and output
    std::vector<LogprobEntry> logprobs;  // per output token: its logprob, rank and the alternatives
    double cum_logprob = 0;
    bool eos = false;  // finished by the EOS token
  };
  void submit_round();  // under mu_
  void on_added(size_t beam, std::shared_ptr<OutputStream> stream, std::exception_ptr error);
  void drain(size_t beam);
  void end_round();    // under mu_, when every beam of the round has its output
  void finish();       // under mu_
  void abort_round();  // under mu_
  void complete(std::shared_ptr<OutputStream> stream, std::exception_ptr error);  // under mu_
  double score(const Beam& b) const;
  std::string round_request_id(size_t beam) const;

  EngineRequest request_;
  BeamSearchOptions options_;
  EngineThread& engine_;
  const tokenizer::Tokenizer* tokenizer_;
  PostWork post_work_;
  EngineThread::AddCallback done_;
  std::optional<int32_t> eos_;
  int64_t rounds_ = 0;  // max_tokens, bounded by the context

  std::mutex mu_;
  bool ended_ = false;  // done called, or cancelled
  int64_t round_ = 0;
  std::vector<Beam> beams_;     // live
  std::vector<Beam> finished_;  // ended by EOS
  // The round in flight, one entry per live beam.
  std::vector<std::shared_ptr<OutputStream>> streams_;
  std::vector<std::optional<LogprobEntry>> results_;
  std::vector<bool> answered_;  // its output (or refusal) has come
  size_t pending_ = 0;          // beams of the round still without output
  int64_t cached_tokens_ = -1;  // the first round's prefix-cache hit
};

}  // namespace polylora::server
