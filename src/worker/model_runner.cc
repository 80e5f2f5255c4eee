// worker/model_runner.cc: StepPlan -> BatchBuilder -> forward -> sample -> StepResult, synchronously or
// one step ahead.
#include "worker/model_runner.h"

#include <algorithm>

#include "common/error.h"

namespace polylora {

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, int64_t max_step_tokens,
                         std::unique_ptr<DeviceSampler> device_sampler)
    : model_(model),
      kv_(model.config(), model.backend(), num_blocks, block_size),
      sampler_(model.config().vocab_size),
      builder_(block_size),
      max_rows_(std::max<int64_t>(1, max_step_tokens)) {
  device_sampler_ = std::move(device_sampler);
  Backend& be = model_.backend();
  d_ids_ = static_cast<int32_t*>(be.alloc(static_cast<size_t>(max_rows_) * sizeof(int32_t)));
  for (size_t i = 0; i < h_ids_.size(); ++i) {
    h_ids_[i] = static_cast<int32_t*>(be.alloc_host(static_cast<size_t>(max_rows_) * sizeof(int32_t)));
    done_[i] = be.create_event();
  }
}

ModelRunner::~ModelRunner() {
  Backend& be = model_.backend();
  be.synchronize();
  for (size_t i = 0; i < h_ids_.size(); ++i) {
    be.free_host(h_ids_[i]);
    be.destroy_event(done_[i]);
  }
  be.free(d_ids_);
}

StepResult ModelRunner::execute(const StepPlan& plan, const AdapterRegistry* adapters) {
  CHECK_MSG(inflight_.empty(), "execute() while a step is in flight");
  launch(plan, adapters);
  if (inflight_.empty()) return {};
  return collect();
}

// Plain greedy rows (no logprobs, processors or penalties that would change the argmax) take an argmax on
// the backend; with a device sampler every row does, unless it has penalties while the token before it is
// still being sampled (the sampler needs the whole history on the host) or the step has more rows than
// the sampler takes (long prompt-logprob chunks): those steps use the CPU sampler.
ModelRunner::Sampling ModelRunner::choose_sampling(const BatchBuilder::Step& step) const {
  if (step.rows.empty()) return Sampling::kHost;
  bool argmax = true, device = device_sampler_ != nullptr &&
                               static_cast<int64_t>(step.rows.size()) <= device_sampler_->max_rows();
  for (const BatchBuilder::Row& o : step.rows) {
    const BatchBuilder::RequestState* s = builder_.find(o.id);
    const SamplingParams& p = s->sampling->params;
    const bool penalties =
        p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
    argmax &= o.sample && p.greedy() && !p.logprobs && p.logit_bias.empty() && !penalties &&
              (s->num_output() >= p.min_tokens || (s->sampling->eos_ids.empty() && p.stop_token_ids.empty()));
    device &= !(penalties && s->pending_row >= 0);
    device &= !p.needs_host_masks();  // allowed_token_ids / bad_words: the host sampler's masks
    argmax &= !p.needs_host_masks();
  }
  return argmax && !device ? Sampling::kArgmax : device ? Sampling::kDevice : Sampling::kHost;
}

void ModelRunner::launch_device_sampler(const BatchBuilder::Step& step, InFlight& f) {
  sample_rows_.clear();
  for (const BatchBuilder::Row& o : step.rows) {
    const BatchBuilder::RequestState& s = *builder_.find(o.id);
    const RequestSampling& info = *s.sampling;
    DeviceSampleRow r;
    r.params = &info.params;
    r.eos_ids = info.eos_ids;
    r.seed = info.seed;
    r.prompt_ids = std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(s.num_prompt_tokens));
    if (o.sample) {
      // The history up to this row's position (known: choose_sampling() saw to it for penalties; its size
      // is the output step either way).
      r.output_ids = std::span<const int32_t>(s.tokens.data() + s.num_prompt_tokens,
                                              static_cast<size_t>(o.position + 1 - s.num_prompt_tokens));
    } else {
      r.forced_token = s.tokens[static_cast<size_t>(o.position + 1)];
    }
    sample_rows_.push_back(r);
    f.want_logprobs.push_back(info.params.logprobs.has_value());
  }
  f.ticket = device_sampler_->launch(model_.device_logits(), sample_rows_);
  f.device_sampler = true;
}

void ModelRunner::launch(const StepPlan& plan, const AdapterRegistry* adapters) {
  CHECK_MSG(inflight_.size() < 2, "more than two steps in flight");
  CHECK_MSG(!needs_collect_before_launch(), "the step in flight samples on the host: collect() it first");
  builder_.apply(plan);
  if (plan.empty()) return;
  // The ids of the step in flight, by logits row, feed its pending tokens.
  const InFlight* prev = inflight_.empty() ? nullptr : &inflight_.back();
  const int32_t* feed_src = prev && prev->device_sampler ? device_sampler_->device_ids() : d_ids_;
  builder_.build(plan, adapters, feed_src, step_);
  const ForwardBatch& b = step_.batch;
  const auto R = static_cast<int64_t>(b.logits_rows.size());
  CHECK_MSG(R <= max_rows_, "a step with {} logits rows exceeds the runner's {}", R, max_rows_);
  Backend& be = model_.backend();
  model_.launch(b, kv_.views(), step_.adapters, step_.feed);
  InFlight f;
  f.rows = step_.rows;
  f.slot = next_slot_;
  next_slot_ ^= 1;
  switch (choose_sampling(step_)) {
    case Sampling::kArgmax:
      be.argmax_rows(model_.device_logits(), R, model_.config().vocab_size, d_ids_);
      be.copy_to_host_async(h_ids_[static_cast<size_t>(f.slot)], d_ids_, static_cast<size_t>(R) * sizeof(int32_t));
      break;
    case Sampling::kDevice:
      launch_device_sampler(step_, f);
      break;
    case Sampling::kHost:
      f.on_host = true;
      break;
  }
  model_.end_step();
  be.record_event(done_[static_cast<size_t>(f.slot)]);
  builder_.advance(step_);
  inflight_.push_back(std::move(f));
}

StepResult ModelRunner::collect() {
  CHECK_MSG(!inflight_.empty(), "collect() with no step in flight");
  InFlight f = std::move(inflight_.front());
  inflight_.pop_front();
  Backend& be = model_.backend();
  be.wait_event(done_[static_cast<size_t>(f.slot)]);
  model_.step_completed();
  StepResult result;
  if (f.on_host) {
    sample_on_host(f.rows, result);
  } else if (f.device_sampler) {
    std::vector<SampleResult> res = device_sampler_->wait(f.ticket);
    CHECK(res.size() == f.rows.size());
    for (size_t r = 0; r < f.rows.size(); ++r) {
      const BatchBuilder::Row& o = f.rows[r];
      LogprobEntry e{res[r].token, res[r].logprob, res[r].rank, {}};
      for (const auto& tk : res[r].top) e.top.push_back({tk.id, tk.logprob});
      if (!o.sample) {
        result.prompt_logprobs[o.id].emplace_back(o.position + 1, std::move(e));
        continue;
      }
      SampledToken& t = result.sampled[o.id];
      t.token = res[r].token;
      if (f.want_logprobs[r]) t.logprob = std::move(e);
    }
  } else {
    const int32_t* ids = h_ids_[static_cast<size_t>(f.slot)];
    for (size_t r = 0; r < f.rows.size(); ++r) result.sampled[f.rows[r].id].token = ids[r];
  }
  for (const BatchBuilder::Row& o : f.rows)
    if (o.sample) builder_.fill(o.id, o.position + 1, result.sampled.at(o.id).token);
  return result;
}

void ModelRunner::sample_on_host(const std::vector<BatchBuilder::Row>& rows, StepResult& result) {
  const int64_t vocab = model_.config().vocab_size;
  logits_.resize(rows.size() * static_cast<size_t>(vocab));
  // No later step was launched (needs_collect_before_launch()), so the device logits are this step's.
  model_.backend().copy_to_host(logits_.data(), model_.device_logits(), logits_.size() * sizeof(float));

  // Prompt logprobs first (sampling modifies rows in place), then one sampling call for the batch.
  std::vector<SamplerRow> sample_rows;
  std::vector<RequestId> sample_ids;
  // Structured output: each constrained row's token mask, from its matcher's current state (the engine
  // advanced it with every token before this step was launched).
  std::vector<std::vector<uint32_t>> grammar_masks;
  for (size_t r = 0; r < rows.size(); ++r) {
    const BatchBuilder::Row& o = rows[r];
    const BatchBuilder::RequestState& s = *builder_.find(o.id);
    float* row = logits_.data() + r * vocab;
    if (s.prompt_logprobs && o.position + 1 < s.num_prompt_tokens) {
      int64_t k = s.sampling->params.prompt_logprobs.value_or(0);
      SampleResult pl = Sampler::prompt_logprob(row, vocab, s.tokens[o.position + 1], k);
      LogprobEntry e{pl.token, pl.logprob, pl.rank, {}};
      for (const auto& t : pl.top) e.top.push_back({t.id, t.logprob});
      result.prompt_logprobs[o.id].emplace_back(o.position + 1, std::move(e));
    }
    if (o.sample) {
      const RequestSampling& info = *s.sampling;
      SamplerRow sr;
      sr.logits = row;
      sr.params = &info.params;
      // The history up to this row's position (the token it samples is pending in `tokens`).
      const auto known = static_cast<size_t>(o.position + 1);
      sr.prompt_ids = std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(s.num_prompt_tokens));
      sr.output_ids = std::span<const int32_t>(s.tokens.data() + s.num_prompt_tokens,
                                               known - static_cast<size_t>(s.num_prompt_tokens));
      sr.eos_ids = info.eos_ids;
      sr.seed = info.seed;
      if (info.grammar) {
        grammar_masks.emplace_back(structured::mask_words(vocab));
        info.grammar->fill_mask(grammar_masks.back());
      }
      sample_rows.push_back(sr);
      sample_ids.push_back(o.id);
    }
  }
  for (size_t i = 0, g = 0; i < sample_rows.size(); ++i)
    if (builder_.find(sample_ids[i])->sampling->grammar) sample_rows[i].grammar_mask = grammar_masks[g++];
  std::vector<SampleResult> sampled = sampler_.sample(sample_rows);
  for (size_t i = 0; i < sampled.size(); ++i) {
    SampledToken t;
    t.token = sampled[i].token;
    if (builder_.find(sample_ids[i])->sampling->params.logprobs) {
      LogprobEntry e{sampled[i].token, sampled[i].logprob, sampled[i].rank, {}};
      for (const auto& tk : sampled[i].top) e.top.push_back({tk.id, tk.logprob});
      t.logprob = std::move(e);
    }
    result.sampled[sample_ids[i]] = std::move(t);
  }
}

}  // namespace polylora
