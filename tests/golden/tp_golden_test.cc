// tests/golden/tp_golden_test.cc: tensor parallelism on the CPU (ModelLoadOptions::tensor_parallel_size,
// docs/tensor-parallel.md). Every fixture model split over 2 and 4 ranks (4 heads, 2 KV heads: at -tp 4
// the KV heads are replicated) gives the numbers of the unsplit model:
// - Model::forward on one batch of every variant × prompt (adapters interleaved, all logits rows), then a
//   decode step over the KV cache it wrote: every logit within 1e-4 of -tp 1;
// - the Engine (greedy, top-20 logprobs and prompt logprobs): each variant alone and all in one mixed
//   batch equal -tp 1 within 1e-4 with the same tokens, and match the Hugging Face reference.
// With --enable-expert-parallel (ModelLoadOptions::enable_expert_parallel) every MoE fixture at -tp 2 and 4
// (8 experts: 4 or 2 whole experts per rank, their LoRA with them) gives the same numbers through both,
// and so does every fixture with --fully-sharded-loras (ModelLoadOptions::fully_sharded_loras: LoRA A's rank
// rows of q/k/v/gate/up and B's output rows of o/down split too), also with expert parallelism, and an
// adapter whose rank no size divides.
// And splits the model does not allow are clear errors.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "golden/golden_fixture.h"
#include "golden/tp_batch.h"
#include "worker/kv_storage.h"

namespace polylora::golden {
namespace {

constexpr double kTpTolerance = 1e-4;

ModelLoadOptions tp_options(int tp, bool ep = false, bool fs = false, bool mask = false) {
  ModelLoadOptions o;
  o.tensor_parallel_size = tp;
  o.enable_expert_parallel = ep;
  o.fully_sharded_loras = fs;
  o.expert_parallel_by_mask = mask;
  return o;
}

struct TpCase {
  std::string model;
  int tp = 2;
  bool ep = false;  // --enable-expert-parallel
  bool fs = false;  // --fully-sharded-loras
  bool mask =
      false;  // -ep by masking (each rank's experts over every token, as on GPUs) instead of all-to-all
};

void PrintTo(const TpCase& c, std::ostream* os) {
  *os << c.model << " -tp " << c.tp << (c.ep ? " -ep" : "") << (c.fs ? " --fully-sharded-loras" : "")
      << (c.mask ? " (by masking)" : "");
}

class TpGoldenTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpGoldenTest, ForwardLogitsOfAMixedBatchEqualTp1) {
  const TpCase& c = GetParam();
  Fixture one(c.model), split(c.model, nullptr, tp_options(c.tp, c.ep, c.fs, c.mask));
  ASSERT_EQ(split.model->tensor_parallel_size(), c.tp);
  ASSERT_EQ(split.model->expert_parallel(), c.ep);
  ASSERT_EQ(split.model->fully_sharded_loras(), c.fs);
  MixedBatch mb(one);
  std::vector<int32_t> next;
  TwoSteps ref = run_two_steps(*one.model, mb, nullptr, &next);
  TwoSteps got = run_two_steps(*split.model, MixedBatch(split), &next, nullptr);
  const double dp = max_abs_diff(ref.prefill, got.prefill), dd = max_abs_diff(ref.decode, got.decode);
  EXPECT_LE(dp, kTpTolerance) << "prefill logits";
  EXPECT_LE(dd, kTpTolerance) << "decode logits";
  // The adapters change the logits (so they are compared, not only the base model).
  const int64_t V = one.vocab_size(), len = mb.prompt_lens[0];
  double adapter_effect = 0;
  for (int64_t j = 0; j < len * V; ++j)
    adapter_effect = std::max(adapter_effect, std::fabs(double(ref.prefill[j]) - ref.prefill[len * V + j]));
  EXPECT_GT(adapter_effect, 1e-2);
  std::printf("[tp-golden] %s -tp %d%s%s: %ld sequences, max |Δ logit| prefill %.2e, decode %.2e\n",
              c.model.c_str(), c.tp, c.ep ? " -ep" : "", c.fs ? " -fs" : "",
              static_cast<long>(mb.b.num_seqs()), dp, dd);
}

TEST_P(TpGoldenTest, EngineAloneAndMixedEqualTp1AndReference) {
  const TpCase& c = GetParam();
  Fixture one(c.model), split(c.model, nullptr, tp_options(c.tp, c.ep, c.fs, c.mask));
  std::vector<EngineRequest> reqs;
  std::vector<std::pair<std::string, size_t>> owner;
  for (size_t i = 0; i < one.num_prompts(); ++i)
    for (const std::string& variant : one.variants) {
      reqs.push_back(one.request(variant, i));
      owner.emplace_back(variant, i);
    }
  auto mixed = split.run(reqs);
  double worst = 0;
  for (size_t j = 0; j < reqs.size(); ++j) {
    const auto& [variant, i] = owner[j];
    EngineRun ref = one.run(reqs[j]);
    EngineRun alone = split.run(reqs[j]);
    const double da = max_run_diff(ref, alone), dm = max_run_diff(ref, mixed[j]);
    EXPECT_LE(da, kTpTolerance) << variant << " prompt " << i << ": -tp " << c.tp
                                << " alone differs from -tp 1";
    EXPECT_LE(dm, kTpTolerance) << variant << " prompt " << i << ": -tp " << c.tp
                                << " mixed differs from -tp 1";
    EXPECT_EQ(ref.output, alone.output) << variant << " prompt " << i;
    EXPECT_EQ(ref.output, mixed[j].output) << variant << " prompt " << i;
    check_against_reference(split, variant, i, alone, 1e-3, 1e-3);
    worst = std::max({worst, da, dm});
  }
  std::printf("[tp-golden] %s -tp %d%s%s: %zu requests, max |Δ logprob| vs -tp 1 = %.2e\n", c.model.c_str(),
              c.tp, c.ep ? " -ep" : "", c.fs ? " -fs" : "", reqs.size(), worst);
}

// --quantization int8: the split copies the codes and keeps each row's scale, so the numbers stay those of
// the INT8 model at -tp 1.
TEST(TensorParallel, Int8ModelsSplitToo) {
  for (const std::string model : {"llama-tiny", "qwen3-moe-tiny"}) {
    ModelLoadOptions q;
    q.quantization = WeightQuantization::kInt8;
    ModelLoadOptions q2 = q;
    q2.tensor_parallel_size = 2;
    Fixture one(model, nullptr, q), split(model, nullptr, q2);
    ASSERT_TRUE(split.model->weights().layers[0].attn.o.w.int8());
    MixedBatch mb(one);
    std::vector<int32_t> next;
    TwoSteps ref = run_two_steps(*one.model, mb, nullptr, &next);
    TwoSteps got = run_two_steps(*split.model, MixedBatch(split), &next, nullptr);
    EXPECT_LE(max_abs_diff(ref.prefill, got.prefill), kTpTolerance) << model;
    EXPECT_LE(max_abs_diff(ref.decode, got.decode), kTpTolerance) << model;
  }
}

// Adapters copied into the slots on the upload thread while steps run (--max-loras 1: every variant change
// swaps the slot), on every rank: the numbers of -tp 1.
TEST(TensorParallel, AsynchronousAdapterUploadsReachEveryRank) {
  Fixture one("qwen3-moe-tiny"), split("qwen3-moe-tiny", nullptr, tp_options(2));
  EngineConfig ec = testing_util::test_engine_config();
  ec.lora.max_loras = 1;
  ec.lora.async_uploads = true;
  split.model->set_upload_delay_for_tests(5);
  Engine engine(split.model, ec, nullptr);
  for (const auto& a : split.adapters) engine.add_adapter(a);
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < one.num_prompts(); ++i)
    for (const std::string& variant : one.variants) reqs.push_back(one.request(variant, i));
  auto runs = testing_util::run_to_completion(engine, reqs);
  for (size_t j = 0; j < reqs.size(); ++j) {
    EngineRun ref = one.run(reqs[j]);
    EXPECT_LE(max_run_diff(ref, runs[j]), kTpTolerance) << "request " << j << " (" << reqs[j].adapter << ")";
    EXPECT_EQ(ref.output, runs[j].output) << "request " << j;
  }
  EXPECT_GT(split.model->upload_timing().count, 0) << "the copies ran on the upload thread";
}

// A dummy Llama with tied embeddings and a vocabulary no size divides (1027 = 2·514 - 1 = 4·257 - 1): the
// last rank's embedding and LM-head rows are fewer; the logits of every row, for tokens of every rank's
// rows (the last id included), equal -tp 1's.
TEST(TensorParallel, TiedEmbeddingsAndAnUnevenVocabulary) {
  namespace fs = std::filesystem;
  const std::string llama = std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny";
  const fs::path dir = fs::temp_directory_path() / ("polylora-tp-tied-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(llama + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["vocab_size"] = 1027;
  cfg["tie_word_embeddings"] = true;
  std::ofstream(dir / "config.json") << cfg.dump();
  auto logits_of = [&](int tp) {
    ModelLoadOptions o = tp_options(tp);
    o.load_format = LoadFormat::kDummy;
    o.seed = 7;
    auto m = Model::load(dir.string(), o);
    KvStorage kv(m->kv_config(), m->backend(), 1, 16);
    ForwardBatch b;
    b.token_ids = {1026, 0, 513, 514, 770, 771, 1025, 5};
    for (int32_t t = 0; t < 8; ++t) {
      b.positions.push_back(t);
      b.slot_mapping.push_back(t);
      b.logits_rows.push_back(t);
    }
    b.query_start = {0, 8};
    b.context_lens = {8};
    b.max_blocks_per_seq = 1;
    b.block_tables = {0};
    b.adapter_slots = {-1};
    std::vector<float> logits(8 * 1027);
    m->forward(b, kv.views(), {}, logits.data());
    return logits;
  };
  const std::vector<float> one = logits_of(1);
  for (int tp : {2, 4}) EXPECT_LE(max_abs_diff(one, logits_of(tp)), kTpTolerance) << "-tp " << tp;
  // The other ranks' tokens read the zero row: the last id's logits are not the first id's.
  EXPECT_GT(std::fabs(one[0] - one[1027]), 1e-6);
  fs::remove_all(dir);
}

// A step that fails on one rank only (an adapter whose q_proj B has the rows of rank 0's heads alone: rank 1
// cannot take its share) is an Error naming that rank, while rank 0 waits in a collective: no hang. The
// model stays failed. A KV cache laid out for the whole model's heads is refused before any rank runs.
TEST(TensorParallel, AFailureOnOneRankIsAClearErrorNotAHang) {
  const std::string llama = std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny";
  auto forward_error = [](Model& m, std::span<const kernels::KvCacheView> kv, const LoraAdapter* adapter) {
    ForwardBatch b;
    b.token_ids = {1, 5, 9, 2};
    b.positions = {0, 1, 2, 3};
    b.query_start = {0, 4};
    b.context_lens = {4};
    b.max_blocks_per_seq = 1;
    b.block_tables = {0};
    b.slot_mapping = {0, 1, 2, 3};
    b.adapter_slots = {adapter ? 0 : -1};
    b.logits_rows = {3};
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
    const LoraAdapter* adapters[] = {adapter};
    try {
      m.forward(
          b, kv,
          adapter ? std::span<const LoraAdapter* const>(adapters) : std::span<const LoraAdapter* const>(),
          logits.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto m = Model::load(llama, tp_options(2));
  const ModelConfig& c = m->config();
  LoraAdapter bad;
  bad.name = "bad";
  bad.max_rank = 8;
  bad.layers.resize(static_cast<size_t>(c.num_layers));
  bad.layers[0].modules[static_cast<size_t>(LoraModule::kQ)] =
      LoraMatrix{.rank = 8,
                 .in = c.hidden_size,
                 .out = c.q_size() / 2,
                 .scale = 1.0f,
                 .a = std::vector<float>(static_cast<size_t>(8 * c.hidden_size), 0.01f),
                 .b = std::vector<float>(static_cast<size_t>(c.q_size() / 2 * 8), 0.01f)};
  KvStorage kv(m->kv_config(), m->backend(), 1, 16);
  const std::string e = forward_error(*m, kv.views(), &bad);
  EXPECT_EQ(e.rfind("tensor-parallel rank 1 of 2 failed: ", 0), 0u) << e;
  std::printf("[tp-golden] %s\n", e.c_str());
  EXPECT_EQ(forward_error(*m, kv.views(), nullptr), e) << "later steps fail the same way";

  auto fresh = Model::load(llama, tp_options(2));
  KvStorage whole(fresh->config(), fresh->backend(), 1, 16);
  EXPECT_NE(
      forward_error(*fresh, whole.views(), nullptr)
          .find("the KV cache has 2 KV heads per layer, but each of the 2 tensor-parallel ranks holds 1"),
      std::string::npos);
  EXPECT_EQ(forward_error(*fresh, KvStorage(fresh->kv_config(), fresh->backend(), 1, 16).views(), nullptr),
            "");
}

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> cases;
  for (const std::string& m : fixture_models())
    for (int tp : {2, 4}) cases.push_back({m, tp});
  for (const std::string& m : fixture_models())  // expert parallelism: the MoE models
    if (m != "llama-tiny")
      for (int tp : {2, 4}) cases.push_back({m, tp, true});
  for (const std::string& m : fixture_models())  // fully sharded LoRA: every model, and with -ep once
    for (int tp : {2, 4}) cases.push_back({m, tp, false, true});
  cases.push_back({"qwen3-moe-tiny", 2, true, true});
  for (const std::string& m : fixture_models())  // expert parallelism by masking (the GPUs' way)
    if (m != "llama-tiny")
      for (int tp : {2, 4}) cases.push_back({m, tp, true, false, true});
  cases.push_back({"qwen3-moe-tiny", 2, true, true, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, TpGoldenTest, ::testing::ValuesIn(tp_cases()), [](const auto& info) {
  std::string n = info.param.model + "_tp" + std::to_string(info.param.tp) + (info.param.ep ? "_ep" : "") +
                  (info.param.fs ? "_fs" : "") + (info.param.mask ? "_mask" : "");
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

// The logits of every row of one 9-token prompt (no adapter) over a fresh one-block KV cache (9 tokens: the
// ranks' blocks of tokens are uneven under expert parallelism's all-to-all).
std::vector<float> prompt_logits(Model& m) {
  KvStorage kv(m.kv_config(), m.backend(), 1, 16);
  ForwardBatch b;
  b.token_ids = {3, 14, 15, 92, 65, 35, 89, 79, 323};
  for (int32_t t = 0; t < 9; ++t) {
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
    b.logits_rows.push_back(t);
  }
  b.query_start = {0, 9};
  b.context_lens = {9};
  b.max_blocks_per_seq = 1;
  b.block_tables = {0};
  b.adapter_slots = {-1};
  std::vector<float> logits(static_cast<size_t>(9 * m.config().vocab_size));
  m.forward(b, kv.views(), {}, logits.data());
  return logits;
}

std::string error_of(const std::string& dir, const ModelLoadOptions& o) {
  try {
    Model::load(dir, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallel, SplitsTheHeadsDoNotAllowAreClearErrors) {
  const std::string llama = std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny";
  std::string e = error_of(llama, tp_options(3));
  EXPECT_NE(e.find("--tensor-parallel-size 3: the model's 4 attention heads do not split over 3 ranks"),
            std::string::npos)
      << e;
  e = error_of(llama, tp_options(8));
  EXPECT_NE(e.find("--tensor-parallel-size 8: the model's 4 attention heads"), std::string::npos) << e;
  // 6 heads split over 2 ranks, but 3 KV heads neither divide by 2 nor divide 2.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("polylora-tp-kv-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(llama + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["num_attention_heads"] = 6;
  cfg["num_key_value_heads"] = 3;
  cfg["head_dim"] = 32;
  cfg["intermediate_size"] = 384;  // splits over 2 and 3
  std::ofstream(dir / "config.json") << cfg.dump();
  ModelLoadOptions o = tp_options(2);
  o.load_format = LoadFormat::kDummy;
  e = error_of(dir.string(), o);
  EXPECT_NE(e.find("--tensor-parallel-size 2: the model's 3 KV heads do not split over 2 ranks"),
            std::string::npos)
      << e;
  o.tensor_parallel_size = 3;  // 6 heads and 3 KV heads over 3 ranks: allowed
  EXPECT_EQ(error_of(dir.string(), o), "");
  o.tensor_parallel_size = 0;
  EXPECT_NE(error_of(dir.string(), o).find("at least 1"), std::string::npos);
  cfg["vocab_size"] = 2;  // 3 ranks of ceil(2 / 3) = 1 row each: the last would have none
  std::ofstream(dir / "config.json") << cfg.dump();
  o.tensor_parallel_size = 3;
  e = error_of(dir.string(), o);
  EXPECT_NE(e.find("the vocabulary of 2 tokens is too small to give each of 3 ranks some of it"),
            std::string::npos)
      << e;
  fs::remove_all(dir);
}

// Expert parallelism: the experts must spread evenly (a clear error naming the counts otherwise), and since
// each rank holds whole experts their intermediate size need not divide by the ranks (it must without it).
// A dummy Qwen3-MoE of 6 experts with an expert intermediate size of 66: -tp 2 -ep equals -tp 1; -tp 4 -ep
// is refused (6 experts over 4 ranks), and so is -tp 4 without -ep (66 columns over 4 ranks).
TEST(TensorParallel, ExpertParallelNeedsEvenlySpreadExpertsNotEvenlySplitOnes) {
  namespace fs = std::filesystem;
  const std::string qwen = std::string(POLYLORA_TEST_DATA) + "/models/qwen3-moe-tiny";
  const fs::path dir = fs::temp_directory_path() / ("polylora-tp-ep-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(qwen + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["num_experts"] = 6;
  cfg["moe_intermediate_size"] = 66;
  std::ofstream(dir / "config.json") << cfg.dump();
  auto options = [](int tp, bool ep) {
    ModelLoadOptions o = tp_options(tp, ep);
    o.load_format = LoadFormat::kDummy;
    o.seed = 11;
    return o;
  };
  std::string e = error_of(dir.string(), options(4, true));
  EXPECT_NE(
      e.find("--tensor-parallel-size 4 with --enable-expert-parallel: the model's 6 experts do not spread "
             "over 4 ranks"),
      std::string::npos)
      << e;
  e = error_of(dir.string(), options(4, false));
  EXPECT_NE(e.find("the experts' intermediate size 66 does not split over 4 ranks"), std::string::npos) << e;
  auto logits_of = [&](int tp, bool ep) {
    auto m = Model::load(dir.string(), options(tp, ep));
    EXPECT_EQ(m->expert_parallel(), ep && tp > 1);
    return prompt_logits(*m);
  };
  const std::vector<float> one = logits_of(1, false);
  EXPECT_LE(max_abs_diff(one, logits_of(2, true)), kTpTolerance);
  EXPECT_LE(max_abs_diff(one, logits_of(1, true)), 0.0) << "-ep alone changes nothing";
  fs::remove_all(dir);
}

// MXFP4 experts split in whole 32-column blocks, as evenly as they go (GPT-OSS's 2880 over 4 ranks: 736, 736,
// 704, 704): an MXFP4 GPT-OSS of expert intermediate size 160 (5 blocks) over 2 ranks (96 + 64 columns) and 4
// (64 + 32 + 32 + 32) gives the logits of -tp 1 (dummy weights, the same seed); 8 ranks (more than the 5
// blocks) are refused naming the blocks.
TEST(TensorParallel, Mxfp4ExpertsSplitInWholeBlocks) {
  namespace fs = std::filesystem;
  const std::string oss = std::string(POLYLORA_TEST_DATA) + "/models/gpt-oss-mxfp4-tiny";
  const fs::path dir = fs::temp_directory_path() / ("polylora-tp-mxfp4-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(oss + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["intermediate_size"] = 160;
  cfg["num_attention_heads"] = 8;
  cfg["num_key_value_heads"] = 8;
  std::ofstream(dir / "config.json") << cfg.dump();
  auto options = [](int tp) {
    ModelLoadOptions o = tp_options(tp);
    o.load_format = LoadFormat::kDummy;
    o.seed = 5;
    return o;
  };
  const ModelConfig c = ModelConfig::from_file((dir / "config.json").string());
  ASSERT_EQ(c.moe_intermediate_size, 160);
  std::vector<int64_t> counts;
  for (int r = 0; r < 4; ++r) counts.push_back(make_tp_shard(c, r, {.size = 4}).moe_inter_count);
  EXPECT_EQ(counts, (std::vector<int64_t>{64, 32, 32, 32}));
  EXPECT_EQ(make_tp_shard(c, 3, {.size = 4}).moe_inter_begin, 128);
  auto logits_of = [&](int tp) {
    auto m = Model::load(dir.string(), options(tp));
    return prompt_logits(*m);
  };
  const std::vector<float> one = logits_of(1);
  EXPECT_LE(max_abs_diff(one, logits_of(2)), kTpTolerance);
  EXPECT_LE(max_abs_diff(one, logits_of(4)), kTpTolerance);
  const std::string e = error_of(dir.string(), options(8));
  EXPECT_NE(
      e.find("the MXFP4 experts' intermediate size 160 has 5 blocks of 32 columns, fewer than the 8 ranks"),
      std::string::npos)
      << e;
  fs::remove_all(dir);
}

// --fully-sharded-loras with an adapter whose rank (5) no size divides (each rank shrinks ⌈5 / N⌉ rows of A,
// the last ones zero) on every dense module of llama-tiny: the logits of -tp 2 and -tp 4 equal -tp 1's (and
// the adapter changes them); a hidden size the ranks do not divide is refused naming the flag.
TEST(TensorParallel, FullyShardedLorasWithARankNoSizeDivides) {
  const std::string llama = std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny";
  auto logits_of = [&](int tp, bool with_adapter) {
    auto m = Model::load(llama, tp_options(tp, false, true));
    const ModelConfig& c = m->config();
    LoraAdapter ad;
    ad.name = "rank5";
    ad.max_rank = 5;
    ad.layers.resize(static_cast<size_t>(c.num_layers));
    uint32_t seed = 12345;
    auto next = [&] {
      seed = seed * 1664525u + 1013904223u;
      return static_cast<float>(static_cast<int32_t>(seed >> 8) % 2001 - 1000) * 2e-5f;
    };
    auto matrix = [&](int64_t in, int64_t out) {
      LoraMatrix mat{.rank = 5, .in = in, .out = out, .scale = 2.0f, .a = {}, .b = {}};
      for (int64_t i = 0; i < 5 * in; ++i) mat.a.push_back(next());
      for (int64_t i = 0; i < out * 5; ++i) mat.b.push_back(next() * 10);
      return mat;
    };
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    for (auto& layer : ad.layers) {
      layer.modules[static_cast<size_t>(LoraModule::kQ)] = matrix(H, c.q_size());
      layer.modules[static_cast<size_t>(LoraModule::kV)] = matrix(H, c.kv_size());
      layer.modules[static_cast<size_t>(LoraModule::kO)] = matrix(c.q_size(), H);
      layer.modules[static_cast<size_t>(LoraModule::kUp)] = matrix(H, I);
      layer.modules[static_cast<size_t>(LoraModule::kDown)] = matrix(I, H);
    }
    KvStorage kv(m->kv_config(), m->backend(), 2, 16);
    ForwardBatch b;  // two sequences: the adapter's, then the base model's
    b.token_ids = {1, 5, 9, 2, 77, 1, 5, 9, 2, 77};
    for (int32_t t = 0; t < 10; ++t) {
      b.positions.push_back(t % 5);
      b.slot_mapping.push_back(t < 5 ? t : 16 + t - 5);
      b.logits_rows.push_back(t);
    }
    b.query_start = {0, 5, 10};
    b.context_lens = {5, 5};
    b.max_blocks_per_seq = 1;
    b.block_tables = {0, 1};
    b.adapter_slots = {with_adapter ? 0 : -1, -1};
    std::vector<float> logits(static_cast<size_t>(10 * c.vocab_size));
    const LoraAdapter* adapters[] = {&ad};
    m->forward(b, kv.views(), adapters, logits.data());
    return logits;
  };
  const std::vector<float> one = logits_of(1, true);
  EXPECT_GT(max_abs_diff(one, logits_of(1, false)), 1e-2) << "the adapter changes the logits";
  for (int tp : {2, 4}) EXPECT_LE(max_abs_diff(one, logits_of(tp, true)), kTpTolerance) << "-tp " << tp;

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("polylora-tp-fs-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(llama + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["hidden_size"] = 130;  // 4 heads of 32: q_size 128, hidden 130 (not a multiple of 4)
  cfg["head_dim"] = 32;
  std::ofstream(dir / "config.json") << cfg.dump();
  ModelLoadOptions o = tp_options(4, false, true);
  o.load_format = LoadFormat::kDummy;
  const std::string e = error_of(dir.string(), o);
  EXPECT_NE(
      e.find("--tensor-parallel-size 4 with --fully-sharded-loras: the hidden size 130 does not split over 4 "
             "ranks"),
      std::string::npos)
      << e;
  o.fully_sharded_loras = false;
  EXPECT_EQ(error_of(dir.string(), o), "") << "without the flag the hidden size need not divide";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polylora::golden
