// tests/unit/model/mxfp4_load_test.cc: MXFP4 GPT-OSS checkpoints (tests/data/models/gpt-oss-mxfp4-tiny, the
// layout openai/gpt-oss-20b ships): the experts stay MXFP4 views into the mapped checkpoint and decode as
// Hugging Face does; sharded checkpoints load the same; malformed MXFP4 tensors (scales missing, blocks and
// scales that disagree in shape, blocks stored as BF16, U8 outside the experts) and config mismatches are
// errors naming the tensor; modules_to_not_convert follows transformers' matching; --load-format dummy on
// an MXFP4 config makes MXFP4 experts.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "config/model_config.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path mxfp4_dir() {
  return fs::path(data_dir()) / "models/gpt-oss-mxfp4-tiny";
}

std::map<std::string, RawTensor> fixture_tensors() {
  auto file = SafetensorsFile::open((mxfp4_dir() / "model.safetensors").string(), kModelCheckpointDTypes);
  std::map<std::string, RawTensor> out;
  for (const TensorInfo& t : file->tensors()) {
    const auto* b = static_cast<const uint8_t*>(t.data);
    out[t.name] = RawTensor{std::string(dtype_name(t.dtype)), t.shape, {b, b + t.num_bytes}};
  }
  return out;
}

// A model dir with the fixture's config (edited) and its tensors (edited).
fs::path variant(const std::string& tag, const std::function<void(std::map<std::string, RawTensor>&)>& edit,
                 const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
  fs::path dir = make_temp_dir(tag);
  nlohmann::json cfg = read_json(mxfp4_dir() / "config.json");
  if (edit_config) edit_config(cfg);
  write_json(dir / "config.json", cfg);
  auto tensors = fixture_tensors();
  if (edit) edit(tensors);
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

std::string load_error(const fs::path& dir) {
  try {
    Model::load(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& err, std::initializer_list<const char*> parts) {
  EXPECT_FALSE(err.empty()) << "no error";
  for (const char* p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
}

constexpr const char* kGateUp = "model.layers.1.mlp.experts.gate_up_proj";

TEST(Mxfp4Load, ExpertsAreZeroCopyViewsDecodedAsHuggingFace) {
  auto model = Model::load(mxfp4_dir().string());
  const Checkpoint& file = *model->weights().checkpoint;  // the model's own mapping
  const TensorInfo& blocks = file.get(std::string(kGateUp) + "_blocks");  // [E, 2I, H/32, 16]
  const TensorInfo& scales = file.get(std::string(kGateUp) + "_scales");  // [E, 2I, H/32]
  const int64_t E = blocks.shape[0], out = blocks.shape[1], nb = blocks.shape[2], in = nb * 32;
  static const float kTable[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int64_t e : {int64_t{0}, E - 1}) {
    const kernels::WeightView& v = model->weights().layers[1].moe.experts[static_cast<size_t>(e)].gate_up;
    ASSERT_TRUE(v.mxfp4());
    ASSERT_EQ(v.rows, out);
    ASSERT_EQ(v.cols, in);
    const auto* b = static_cast<const uint8_t*>(blocks.data) + e * out * nb * 16;
    const auto* s = static_cast<const uint8_t*>(scales.data) + e * out * nb;
    EXPECT_EQ(v.data, b);  // zero-copy: the view points into the mapping
    EXPECT_EQ(v.scales, s);
    // HF: value (e, o, i) = table[nibble] · 2^(scale − 127), element 2j the low nibble of byte j of the
    // block of i / 32, then transposed to (E, in, out): our row o is HF's column o.
    for (int64_t o : {int64_t{0}, int64_t{1}, out - 1}) {
      for (int64_t i = 0; i < in; ++i) {
        const uint8_t byte = b[(o * nb + i / 32) * 16 + (i % 32) / 2];
        const int code = i % 2 == 0 ? byte & 0xf : byte >> 4;
        const float want = std::ldexp(kTable[code], static_cast<int>(s[o * nb + i / 32]) - 127);
        ASSERT_EQ(v.at(o, i), want) << e << " " << o << " " << i;
      }
    }
  }
  // Counted as MXFP4 bytes (codes + scales), not as a decoded copy.
  const kernels::WeightView& v = model->weights().layers[0].moe.experts[0].gate_up;
  EXPECT_EQ(v.num_bytes(), static_cast<size_t>(out * in / 2 + out * in / 32));
}

TEST(Mxfp4Load, ShardedCheckpointGivesTheSameTokens) {
  fs::path dir = make_temp_dir("mxfp4-shards");
  fs::copy_file(mxfp4_dir() / "config.json", dir / "config.json");
  std::map<std::string, RawTensor> shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (auto& [name, t] : fixture_tensors()) {
    const int s = i++ % 2;  // a blocks tensor and its scales land in different shards
    shard[s][name] = t;
    index["weight_map"][name] = s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", shard[0]);
  write_safetensors(dir / "model-00002-of-00002.safetensors", shard[1]);
  write_json(dir / "model.safetensors.index.json", index);
  std::shared_ptr<Model> sharded = Model::load(dir.string());
  std::shared_ptr<Model> single = Model::load(mxfp4_dir().string());
  const std::vector<int32_t> prompt = {57, 417, 817, 65, 967, 181, 656, 374, 116};
  Engine e1(sharded, test_engine_config(), nullptr), e2(single, test_engine_config(), nullptr);
  auto a = run_one(e1, greedy_request(prompt, 8)).output;
  auto b = run_one(e2, greedy_request(prompt, 8)).output;
  EXPECT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  fs::remove_all(dir);
}

TEST(Mxfp4Load, ScalesMissingIsNamed) {
  auto dir = variant("mxfp4-noscales", [](auto& t) { t.erase(std::string(kGateUp) + "_scales"); });
  expect_has(load_error(dir), {"'model.layers.1.mlp.experts.gate_up_proj_blocks' has no scales",
                               "'model.layers.1.mlp.experts.gate_up_proj_scales'", "missing"});
  fs::remove_all(dir);
}

TEST(Mxfp4Load, BlocksAndScalesDisagreeingInShapeAreNamed) {
  auto dir = variant("mxfp4-shape", [](auto& t) {
    RawTensor& s = t[std::string(kGateUp) + "_scales"];  // [8, 256, 4] -> [8, 256, 2]
    s.shape[2] = 2;
    s.bytes.resize(s.bytes.size() / 2);
  });
  expect_has(load_error(dir), {"'model.layers.1.mlp.experts.gate_up_proj_blocks' [8, 256, 4, 16]",
                               "'model.layers.1.mlp.experts.gate_up_proj_scales' [8, 256, 2]", "disagree"});
  fs::remove_all(dir);
  // Both consistent but not the config's shape: named against the config.
  dir = variant("mxfp4-cfg", [](auto& t) {
    for (const char* part : {"_blocks", "_scales"}) {
      RawTensor& r = t[std::string(kGateUp) + part];
      r.shape[1] = 128;
      r.bytes.resize(r.bytes.size() / 2);
    }
  });
  expect_has(load_error(dir), {"'model.layers.1.mlp.experts.gate_up_proj_blocks' has shape [8, 128, 4, 16]",
                               "expected [8, 256, 4, 16]"});
  fs::remove_all(dir);
  // Blocks whose last dimension is not 16 bytes.
  dir = variant("mxfp4-block", [](auto& t) {
    RawTensor& r = t[std::string(kGateUp) + "_blocks"];
    r.shape = {8, 256, 8, 8};
  });
  expect_has(load_error(dir), {"'model.layers.1.mlp.experts.gate_up_proj_blocks' has shape [8, 256, 8, 8]",
                               "[experts, out, in / 32, 16]"});
  fs::remove_all(dir);
}

TEST(Mxfp4Load, BlocksStoredAsBf16AreNamed) {
  auto dir = variant("mxfp4-bf16", [](auto& t) {
    RawTensor& r = t[std::string(kGateUp) + "_blocks"];
    r.dtype = "BF16";
    r.bytes.resize(r.bytes.size() * 2);
  });
  expect_has(load_error(dir), {"'model.layers.1.mlp.experts.gate_up_proj_blocks' has dtype BF16", "U8"});
  fs::remove_all(dir);
}

TEST(Mxfp4Load, U8OutsideTheExpertsIsNamed) {
  auto dir = variant("mxfp4-u8q", [](auto& t) {
    RawTensor& r = t["model.layers.0.self_attn.q_proj.weight"];
    r.dtype = "U8";
    r.shape = {128, 256};
  });
  expect_has(load_error(dir), {"'model.layers.0.self_attn.q_proj.weight' has dtype U8"});
  fs::remove_all(dir);
}

TEST(Mxfp4Load, ConfigAndCheckpointMustAgree) {
  // MXFP4 tensors but no quantization_config.
  auto dir = variant("mxfp4-noq", nullptr, [](nlohmann::json& c) { c.erase("quantization_config"); });
  expect_has(load_error(dir), {"model.layers.0.mlp.experts.gate_up_proj_blocks", "quant_method"});
  fs::remove_all(dir);
  // modules_to_not_convert naming layer 2's experts: layer 2 must then be bf16.
  dir = variant("mxfp4-notconv", nullptr, [](nlohmann::json& c) {
    c["quantization_config"]["modules_to_not_convert"].push_back("model.layers.2.mlp.experts");
  });
  expect_has(load_error(dir), {"model.layers.2.mlp.experts.gate_up_proj_blocks", "modules_to_not_convert"});
  fs::remove_all(dir);
  // An unsupported method.
  dir = variant("mxfp4-awq", nullptr, [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; });
  expect_has(load_error(dir), {"quant_method 'awq' is not supported"});
  fs::remove_all(dir);
}

TEST(Mxfp4Load, ModulesToNotConvertMatchLikeTransformers) {
  nlohmann::json cfg = read_json(mxfp4_dir() / "config.json");
  cfg["quantization_config"]["modules_to_not_convert"] = {"model.layers.*.self_attn", "model.layers.1.mlp",
                                                          "layers.3.mlp.experts"};
  ModelConfig c = ModelConfig::from_json(cfg.dump(), "config.json");
  EXPECT_EQ(c.quant_method, QuantMethod::kMxfp4);
  EXPECT_EQ(c.mxfp4_experts, (std::vector<bool>{true, false, true, false}));  // prefix + dot; suffix
  EXPECT_FALSE(c.quantizes_module("model.layers.0.self_attn"));              // regex prefix
  EXPECT_TRUE(c.quantizes_module("model.layers.10.mlp.experts"));            // "layers.1.mlp" + "0": no dot
  EXPECT_FALSE(c.quantizes_module("model.layers.1.mlp.experts"));
  cfg["quantization_config"]["modules_to_not_convert"] = {"model.layers.(1"};
  EXPECT_THROW(ModelConfig::from_json(cfg.dump(), "config.json"), Error);
}

TEST(Mxfp4Load, DummyWeightsOnAnMxfp4ConfigAreMxfp4) {
  fs::path dir = make_temp_dir("mxfp4-dummy");
  fs::copy_file(mxfp4_dir() / "config.json", dir / "config.json");
  ModelLoadOptions opts;
  opts.load_format = LoadFormat::kDummy;
  std::shared_ptr<Model> model = Model::load(dir.string(), opts);
  const kernels::ExpertView& ex = model->weights().layers[3].moe.experts[5];
  ASSERT_TRUE(ex.gate_up.mxfp4() && ex.down.mxfp4());
  EXPECT_EQ(ex.gate_up.rows, 256);
  EXPECT_EQ(ex.gate_up.cols, 128);
  // Random codes at scale 2^-7: values within ±6/128, about 0.023 standard deviation.
  double sum_sq = 0;
  for (int64_t c = 0; c < 128; ++c) {
    const float v = ex.down.at(7, c);
    EXPECT_LE(std::fabs(v), 6.0f / 128.0f);
    sum_sq += double(v) * v;
  }
  EXPECT_NEAR(std::sqrt(sum_sq / 128), 0.023, 0.008);
  Engine engine(model, test_engine_config(), nullptr);
  EngineRequest req = greedy_request({1, 2, 3, 4, 5}, 4);
  req.sampling.logprobs = 5;
  EngineRun r = run_one(engine, std::move(req));
  ASSERT_EQ(r.output.size(), 4u);
  for (const LogprobEntry& e : r.logprobs) EXPECT_TRUE(std::isfinite(e.logprob));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polylora
