// worker/model_runner.cc: StepPlan -> BatchBuilder -> forward -> sample -> StepResult, synchronously or
// one step ahead.
#include "worker/model_runner.h"

#include <algorithm>

#include "common/error.h"

namespace polylora {

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, int64_t max_step_tokens)
    : model_(model),
      kv_(model.config(), model.backend(), num_blocks, block_size),
      sampler_(model.config().vocab_size),
      builder_(block_size),
      max_rows_(std::max<int64_t>(1, max_step_tokens)) {
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

StepResult ModelRunner::execute(const StepPlan& plan, const AdapterOf& adapter_of) {
  CHECK_MSG(inflight_.empty(), "execute() while a step is in flight");
  launch(plan, adapter_of);
  if (inflight_.empty()) return {};
  return collect();
}

// Plain greedy rows (no logprobs, processors or penalties that would change the argmax) sample on the
// device: only the ids come back.
bool ModelRunner::device_sampleable(const BatchBuilder::Step& step) const {
  if (step.rows.empty()) return false;
  for (const BatchBuilder::Row& o : step.rows) {
    const BatchBuilder::RequestState* s = builder_.find(o.id);
    const SamplingParams& p = s->sampling->params;
    const bool ok =
        o.sample && p.greedy() && !p.logprobs && p.logit_bias.empty() && p.repetition_penalty == 1.0 &&
        p.frequency_penalty == 0.0 && p.presence_penalty == 0.0 &&
        (s->num_output() >= p.min_tokens || (s->sampling->eos_ids.empty() && p.stop_token_ids.empty()));
    if (!ok) return false;
  }
  return true;
}

void ModelRunner::launch(const StepPlan& plan, const AdapterOf& adapter_of) {
  CHECK_MSG(inflight_.size() < 2, "more than two steps in flight");
  CHECK_MSG(!needs_collect_before_launch(), "the step in flight samples on the host: collect() it first");
  builder_.apply(plan);
  if (plan.empty()) return;
  builder_.build(plan, adapter_of, d_ids_, step_);
  const ForwardBatch& b = step_.batch;
  const auto R = static_cast<int64_t>(b.logits_rows.size());
  CHECK_MSG(R <= max_rows_, "a step with {} logits rows exceeds the runner's {}", R, max_rows_);
  Backend& be = model_.backend();
  model_.launch(b, kv_.views(), step_.adapters, step_.feed);
  InFlight f;
  f.rows = step_.rows;
  f.slot = next_slot_;
  next_slot_ ^= 1;
  f.on_host = !device_sampleable(step_);
  if (!f.on_host) {
    be.argmax_rows(model_.device_logits(), R, model_.config().vocab_size, d_ids_);
    be.copy_to_host_async(h_ids_[static_cast<size_t>(f.slot)], d_ids_, static_cast<size_t>(R) * sizeof(int32_t));
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
      sample_rows.push_back(sr);
      sample_ids.push_back(o.id);
    }
  }
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
