// tests/engine/engine_async_test.cc: asynchronous scheduling (a step queued while the previous one runs,
// its pending tokens fed on the device) gives every request the same result as synchronous steps: a mixed
// workload of greedy and seeded sampling, logprobs and prompt logprobs, penalties (which need the whole
// history on the host, so the engine waits for the step in flight), stop strings and stop ids, EOS with
// min_tokens, max_tokens, n > 2, adapters, requests arriving while others run, preemptions in a KV cache
// too small for all of them, and an abort. The scheduler's invariants hold after every step, the tokens
// the queued step computed for a request that had already stopped are never counted or returned, and
// every KV block is free at the end.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <variant>

#include "engine/engine.h"
#include "golden/golden_fixture.h"
#include "tokenizer/tokenizer.h"

namespace polylora::golden {
namespace {

struct SeqResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<LogprobEntry> logprobs;
  std::optional<FinishReason> finish;
  std::optional<StopReason> stop_reason;
  int64_t num_output_tokens = 0;
};
struct ReqResult {
  std::vector<SeqResult> seqs;
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;
  bool finished = false;
};

class EngineAsyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new Fixture("qwen3-moe-tiny");
    model_ = new std::shared_ptr<Model>(std::move(fixture_->model));
    ModelLoadOptions tp;
    tp.tensor_parallel_size = 2;
    model_tp2_ = new std::shared_ptr<Model>(Model::load(fixture_->dir, tp));
    tokenizer_ = new std::shared_ptr<const tokenizer::Tokenizer>(
        std::make_shared<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(fixture_->dir)));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_tp2_;
    delete model_;
    delete fixture_;
  }

  struct Workload {
    std::vector<EngineRequest> first;  // added before the first step
    std::vector<EngineRequest> later;  // one added after every second step
    std::string abort_id;              // aborted once it has 3 output tokens
  };

  // greedy_only: only the cases that sample on the device (every step queued ahead, tokens fed there).
  Workload workload(bool greedy_only = false) const {
    const tokenizer::Tokenizer& tok = **tokenizer_;
    Workload w;
    const std::vector<std::string> texts = {"Hello world, this is", "The quick brown fox", "Once upon a time",
                                            "In a hole in the ground there lived", "1, 2, 3, 4,"};
    int next = 0;
    auto make = [&](size_t text, const std::string& adapter) {
      EngineRequest r;
      r.request_id = "r" + std::to_string(next++);
      r.prompt_ids = tok.encode(texts[text % texts.size()], false);
      r.adapter = adapter;
      r.sampling.max_tokens = 12 + static_cast<int64_t>(text % 7);
      return r;
    };
    const std::vector<std::string> adapters = {"", fixture_->adapters.at(0)->name,
                                               fixture_->adapters.size() > 1 ? fixture_->adapters[1]->name : ""};
    for (int i = 0; i < 18; ++i) {
      EngineRequest r = make(static_cast<size_t>(i), adapters[static_cast<size_t>(i) % adapters.size()]);
      SamplingParams& sp = r.sampling;
      const int kind = greedy_only ? std::array<int, 4>{0, 3, 6, 7}[static_cast<size_t>(i) % 4] : i % 9;
      if (greedy_only) r.request_id = "r" + std::to_string(i * 9 + kind);  // keeps id % 9 == kind
      switch (kind) {
        case 0:  // greedy: the device path, fed tokens
          sp.temperature = 0;
          sp.ignore_eos = true;
          break;
        case 1:  // seeded sampling with logprobs
          sp.temperature = 0.8;
          sp.top_p = 0.9;
          sp.top_k = 40;
          sp.seed = 1234 + i;
          sp.logprobs = 3;
          break;
        case 2:  // penalties: the whole history is needed on the host
          sp.temperature = 0;
          sp.repetition_penalty = 1.3;
          sp.frequency_penalty = 0.5;
          sp.presence_penalty = 0.2;
          break;
        case 3:  // a stop string in the greedy continuation, kept in the output
          sp.temperature = 0;
          sp.stop = {"can"};
          sp.include_stop_str_in_output = true;
          break;
        case 4:  // n > 1, seeded
          sp.n = 3;
          sp.temperature = 1.0;
          sp.seed = 99;
          break;
        case 5:  // prompt logprobs and min_p
          sp.temperature = 0.7;
          sp.min_p = 0.05;
          sp.seed = 7;
          sp.prompt_logprobs = 2;
          break;
        case 6:  // a stop id that greedy decoding produces early (found by a first greedy pass below)
          sp.temperature = 0;
          sp.ignore_eos = true;
          break;
        case 7:  // EOS held back by min_tokens, then allowed
          sp.temperature = 0;
          sp.min_tokens = 4;
          sp.max_tokens = 6;
          break;
        case 8:  // logit bias forcing a token for a while via min_tokens-free bias
          sp.temperature = 0;
          sp.logit_bias = {{11, 5.0}};
          break;
      }
      (i < 10 ? w.first : w.later).push_back(std::move(r));
    }
    w.abort_id = w.first.at(0).request_id;
    return w;
  }

  // Runs the workload to the end on an engine with `async` scheduling.
  std::map<std::string, ReqResult> run(bool async, const Workload& w, int64_t num_kv_blocks,
                                       int64_t* preemptions = nullptr) {
    EngineConfig ec;
    ec.cache.block_size = 4;
    ec.cache.num_kv_blocks = num_kv_blocks;
    ec.scheduler.max_num_seqs = 16;
    ec.scheduler.max_num_batched_tokens = 64;
    ec.execution.async_scheduling = async;
    ec.execution.device_sampling = device_sampling_;
    Engine engine(tp2_ ? *model_tp2_ : *model_, ec, *tokenizer_);
    EXPECT_TRUE(engine.model_config().vocab_size > 11);
    for (const auto& a : fixture_->adapters) engine.add_adapter(a);
    std::map<std::string, ReqResult> out;
    auto add = [&](const EngineRequest& r) {
      out[r.request_id].seqs.resize(static_cast<size_t>(r.sampling.n));
      engine.add_request(r);
    };
    for (const auto& r : w.first) add(r);
    size_t next_later = 0;
    bool aborted = false;
    int64_t returned_tokens = 0;
    for (int step = 0; engine.has_unfinished() || next_later < w.later.size(); ++step) {
      EXPECT_LT(step, 5000);
      if (step >= 5000) break;
      if (step % 2 == 1 && next_later < w.later.size()) add(w.later[next_later++]);
      for (auto& o : engine.step()) {
        ReqResult& rr = out.at(o.request_id);
        EXPECT_FALSE(rr.finished) << o.request_id << ": output after it finished";
        if (!o.prompt_logprobs.empty()) rr.prompt_logprobs = o.prompt_logprobs;
        for (auto& s : o.sequences) {
          SeqResult& q = rr.seqs.at(static_cast<size_t>(s.index));
          EXPECT_FALSE(q.finish.has_value()) << o.request_id << "/" << s.index << ": output after its finish";
          q.tokens.insert(q.tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
          q.logprobs.insert(q.logprobs.end(), s.new_logprobs.begin(), s.new_logprobs.end());
          q.text += s.new_text;
          q.finish = s.finish_reason;
          q.stop_reason = s.stop_reason;
          q.num_output_tokens = s.num_output_tokens;
          EXPECT_EQ(static_cast<int64_t>(q.tokens.size()), q.num_output_tokens);
          returned_tokens += static_cast<int64_t>(s.new_token_ids.size());
        }
        rr.finished = o.finished;
      }
      EXPECT_EQ(engine.check_invariants(), "") << "step " << step;
      if (!aborted && out.count(w.abort_id) && out.at(w.abort_id).seqs[0].tokens.size() >= 3) {
        engine.abort(w.abort_id);
        aborted = true;
      }
    }
    EXPECT_TRUE(aborted);
    EngineStats st = engine.stats();
    EXPECT_EQ(st.generation_tokens, returned_tokens) << "tokens computed after a stop were counted";
    EXPECT_EQ(st.kv_usage, 0.0);
    EXPECT_EQ(st.num_running, 0);
    if (preemptions) *preemptions = st.num_preemptions;
    return out;
  }

  static void expect_same(const std::map<std::string, ReqResult>& a, const std::map<std::string, ReqResult>& b,
                          const std::string& abort_id) {
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [id, ra] : a) {
      const ReqResult& rb = b.at(id);
      EXPECT_TRUE(ra.finished && rb.finished) << id;
      ASSERT_EQ(ra.seqs.size(), rb.seqs.size()) << id;
      for (size_t s = 0; s < ra.seqs.size(); ++s) {
        const SeqResult &x = ra.seqs[s], &y = rb.seqs[s];
        if (id == abort_id) {  // aborted at a step that depends on the mode: a shared prefix
          EXPECT_EQ(x.finish, FinishReason::kAbort);
          EXPECT_EQ(y.finish, FinishReason::kAbort);
          size_t n = std::min(x.tokens.size(), y.tokens.size());
          EXPECT_GE(n, 3u);
          EXPECT_TRUE(std::equal(x.tokens.begin(), x.tokens.begin() + static_cast<long>(n), y.tokens.begin()));
          continue;
        }
        EXPECT_EQ(x.tokens, y.tokens) << id << "/" << s;
        EXPECT_EQ(x.text, y.text) << id << "/" << s;
        EXPECT_EQ(x.finish, y.finish) << id << "/" << s;
        EXPECT_EQ(x.stop_reason, y.stop_reason) << id << "/" << s;
        ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << id << "/" << s;
        for (size_t t = 0; t < x.logprobs.size(); ++t) {
          EXPECT_EQ(x.logprobs[t].id, y.logprobs[t].id);
          EXPECT_NEAR(x.logprobs[t].logprob, y.logprobs[t].logprob, 1e-4);
          EXPECT_EQ(x.logprobs[t].top.size(), y.logprobs[t].top.size());
        }
      }
      ASSERT_EQ(ra.prompt_logprobs.size(), rb.prompt_logprobs.size()) << id;
      for (size_t p = 0; p < ra.prompt_logprobs.size(); ++p) {
        ASSERT_EQ(ra.prompt_logprobs[p].has_value(), rb.prompt_logprobs[p].has_value());
        if (ra.prompt_logprobs[p]) EXPECT_NEAR(ra.prompt_logprobs[p]->logprob, rb.prompt_logprobs[p]->logprob, 1e-4);
      }
    }
  }

  bool device_sampling_ = false;  // the device sampler (its host version here) instead of the CPU one
  bool tp2_ = false;              // the model split over 2 tensor-parallel ranks
  static Fixture* fixture_;
  static std::shared_ptr<Model>* model_;
  static std::shared_ptr<Model>* model_tp2_;
  static std::shared_ptr<const tokenizer::Tokenizer>* tokenizer_;
};

Fixture* EngineAsyncTest::fixture_ = nullptr;
std::shared_ptr<Model>* EngineAsyncTest::model_ = nullptr;
std::shared_ptr<Model>* EngineAsyncTest::model_tp2_ = nullptr;
std::shared_ptr<const tokenizer::Tokenizer>* EngineAsyncTest::tokenizer_ = nullptr;

TEST_F(EngineAsyncTest, SameResultsAsSynchronousSteps) {
  for (bool device : {false, true})
  for (bool greedy_only : {false, true}) {
  device_sampling_ = device;
  Workload w = workload(greedy_only);
  // A stop id from the greedy continuation of case 6 (its third token), so that it really stops there.
  auto sync_probe = run(false, w, 1024);
  for (auto* list : {&w.first, &w.later})
    for (auto& r : *list)
      if (std::stoi(r.request_id.substr(1)) % 9 == 6) {
        const auto& t = sync_probe.at(r.request_id).seqs[0].tokens;
        ASSERT_GE(t.size(), 3u);
        r.sampling.stop_token_ids = {t[2]};
      }
  auto sync = run(false, w, 1024);
  auto async = run(true, w, 1024);
  expect_same(sync, async, w.abort_id);
  // The stop id and the stop string really ended their requests early.
  int stopped = 0;
  for (const auto& [id, r] : async)
    for (const auto& s : r.seqs) stopped += s.finish == FinishReason::kStop && s.stop_reason.has_value();
  EXPECT_GE(stopped, 2);
  }
}

TEST_F(EngineAsyncTest, SameResultsUnderPreemption) {
  for (bool device : {false, true})
  for (bool greedy_only : {false, true}) {
  device_sampling_ = device;
  Workload w = workload(greedy_only);
  int64_t pre_sync = 0, pre_async = 0;
  // 40 blocks of 4 tokens: far fewer than 18 requests (some n = 3) of ~10-30 tokens need together.
  auto sync = run(false, w, 40, &pre_sync);
  auto async = run(true, w, 40, &pre_async);
  EXPECT_GT(pre_sync, 0);
  EXPECT_GT(pre_async, 0);
  expect_same(sync, async, w.abort_id);
  }
}

// Asynchronous steps on a model split over 2 ranks: the tokens the previous step sampled (the device
// sampler's ids on rank 0, fed without a trip through the host) are broadcast to the other rank before each
// step, so the split model's asynchronous run gives the unsplit model's synchronous results (tokens, stops,
// log-probs within 1e-4), with the host sampler and with the device sampler.
TEST_F(EngineAsyncTest, TensorParallelRanksGetTheFedTokens) {
  for (bool device : {false, true}) {
    device_sampling_ = device;
    const Workload w = workload(false);
    tp2_ = false;
    auto whole = run(false, w, 1024);
    tp2_ = true;
    auto split = run(true, w, 1024);
    tp2_ = false;
    expect_same(whole, split, w.abort_id);
  }
}

}  // namespace
}  // namespace polylora::golden
