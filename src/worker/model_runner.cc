// worker/model_runner.cc: StepPlan -> BatchBuilder -> forward -> sample -> StepResult, synchronously or
// one step ahead.
#include "worker/model_runner.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "structured/grammar.h"

namespace polylora {

// One job at a time on its own thread: run() hands it over, wait() returns when it is done (rethrowing
// what it threw).
class ModelRunner::MaskWorker {
 public:
  MaskWorker() : thread_([this] { loop(); }) {}
  ~MaskWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      CHECK_MSG(!job_ && !busy_, "MaskWorker: a job is already running");
      job_ = std::move(job);
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_ && !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      busy_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      error_ = error;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

ModelRunner::ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, int64_t max_step_tokens,
                         std::unique_ptr<DeviceSampler> device_sampler, DType kv_dtype)
    : model_(model),
      kv_(model.kv_config(), model.backend(), num_blocks, block_size, kv_dtype),
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
  mask_worker_.reset();
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
    argmax &= !p.needs_host_masks() && !s->sampling->grammar;  // grammar masks: either sampler
  }
  return argmax && !device ? Sampling::kArgmax : device ? Sampling::kDevice : Sampling::kHost;
}

void ModelRunner::launch_device_sampler(const BatchBuilder::Step& step, InFlight& f,
                                        const std::vector<std::vector<uint32_t>>& masks) {
  sample_rows_.clear();
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const BatchBuilder::Row& o = step.rows[i];
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
      r.grammar_mask = masks[i];
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
  CHECK_MSG(!deferred_, "launch() before finish_launch() of the previous launch");
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
  // Structured output: the sampled rows' masks, filled on the worker thread while the forward pass is
  // queued and runs (the matchers are not touched elsewhere until this step is completed).
  std::vector<std::vector<uint32_t>> masks(step_.rows.size());
  std::vector<std::pair<size_t, const structured::GrammarMatcher*>> jobs;
  bool waits_for_token = false;
  for (size_t i = 0; i < step_.rows.size(); ++i) {
    const BatchBuilder::Row& o = step_.rows[i];
    const BatchBuilder::RequestState& s = *builder_.find(o.id);
    if (!o.sample || !s.sampling->grammar) continue;
    waits_for_token |= s.pending_row >= 0;
    masks[i].resize(structured::mask_words(model_.config().vocab_size));
    jobs.emplace_back(i, s.sampling->grammar.get());
  }
  if (waits_for_token) {
    // The step in flight is still sampling a constrained row's previous token: queue the forward pass
    // now, the masks and the sampling in finish_launch().
    model_.launch(b, kv_.views(), step_.adapters, step_.feed);
    deferred_ = true;
    return;
  }
  struct JoinMasks {
    MaskWorker* worker;
    ~JoinMasks() {
      if (!worker) return;
      try {
        worker->wait();
      } catch (...) {  // unwinding already: the forward pass's error is the one reported
      }
    }
  } join{nullptr};
  if (!jobs.empty()) {
    if (!mask_worker_) mask_worker_ = std::make_unique<MaskWorker>();
    mask_worker_->run([&masks, &jobs] {
      for (const auto& [i, matcher] : jobs) matcher->fill_mask(masks[i]);
    });
    join.worker = mask_worker_.get();
  }
  model_.launch(b, kv_.views(), step_.adapters, step_.feed);
  if (join.worker) {
    join.worker = nullptr;
    mask_worker_->wait();
  }
  queue_sampling(std::move(masks));
}

void ModelRunner::finish_launch() {
  if (!deferred_) return;
  std::vector<std::vector<uint32_t>> masks(step_.rows.size());
  for (size_t i = 0; i < step_.rows.size(); ++i) {
    const BatchBuilder::Row& o = step_.rows[i];
    const BatchBuilder::RequestState& s = *builder_.find(o.id);
    if (!o.sample || !s.sampling->grammar) continue;
    CHECK_MSG(s.pending_row < 0, "finish_launch(): collect() (and complete) the step in flight first");
    masks[i].resize(structured::mask_words(model_.config().vocab_size));
    s.sampling->grammar->fill_mask(masks[i]);
  }
  deferred_ = false;
  queue_sampling(std::move(masks));
}

void ModelRunner::queue_sampling(std::vector<std::vector<uint32_t>> masks) {
  Backend& be = model_.backend();
  const auto R = static_cast<int64_t>(step_.batch.logits_rows.size());
  const bool grammar = std::any_of(masks.begin(), masks.end(), [](const auto& m) { return !m.empty(); });
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
      launch_device_sampler(step_, f, masks);
      break;
    case Sampling::kHost:
      f.on_host = true;
      if (grammar) f.masks = std::move(masks);
      break;
  }
  model_.end_step();
  be.record_event(done_[static_cast<size_t>(f.slot)]);
  builder_.advance(step_);
  inflight_.push_back(std::move(f));
}

StepResult ModelRunner::collect() {
  CHECK_MSG(!inflight_.empty() || !deferred_, "collect() of a launch that waits for finish_launch()");
  CHECK_MSG(!inflight_.empty(), "collect() with no step in flight");
  InFlight f = std::move(inflight_.front());
  inflight_.pop_front();
  Backend& be = model_.backend();
  be.wait_event(done_[static_cast<size_t>(f.slot)]);
  model_.step_completed();
  StepResult result;
  if (f.on_host) {
    sample_on_host(f.rows, f.masks, result);
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

void ModelRunner::sample_on_host(const std::vector<BatchBuilder::Row>& rows,
                                 const std::vector<std::vector<uint32_t>>& masks, StepResult& result) {
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
      // Structured output: the mask launch() filled from the row's matcher (empty: none).
      if (r < masks.size()) sr.grammar_mask = masks[r];
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
