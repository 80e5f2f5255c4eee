// tests/unit/lora/confined_load_test.cc: run-time adapter loads confined to --lora-allowed-dirs.
// Owns: hostile adapter directories built in a temp dir (symbolic links at every level, '..' escapes,
// absolute paths outside, /dev/zero, FIFOs, oversize files, huge layer / expert indices) and a race that
// swaps a directory for a symbolic link during 200 loads; each case runs with openat2 and with the
// O_NOFOLLOW walk used where openat2 is missing.
// Must not: depend on a GPU or on the server.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "common/error.h"
#include "config/model_config.h"
#include "lora/adapter.h"
#include "lora/adapter_files.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path model_dir(const std::string& name) {
  return fs::path(data_dir()) / "models" / name;
}

ModelConfig model_config(const std::string& name) {
  return ModelConfig::from_file((model_dir(name) / "config.json").string());
}

const std::string kPre = "base_model.model.model.layers.";

// A q_proj adapter on layer 0 with rank `r` and lora_alpha `alpha`; lora_A holds `value`.
void write_adapter(const fs::path& dir, int r, double alpha, float value = 0.01f) {
  fs::create_directories(dir);
  write_json(dir / "adapter_config.json",
             {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", alpha}, {"target_modules", {"q_proj"}}});
  write_safetensors(dir / "adapter_model.safetensors",
                    {{kPre + "0.self_attn.q_proj.lora_A.weight", f32_tensor({r, 128}, value)},
                     {kPre + "0.self_attn.q_proj.lora_B.weight", f32_tensor({128, r}, value)}});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const LoraMatrix& q_of(const LoraAdapter& a) {
  return *a.layers[0].modules[static_cast<size_t>(LoraModule::kQ)];
}

class ConfinedLoadTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    set_openat2_disabled_for_testing(GetParam());
    cfg_ = model_config("llama-tiny");
    tmp_ = make_temp_dir("confined");
    allowed_ = tmp_ / "allowed";
    outside_ = tmp_ / "outside";
    fs::create_directories(allowed_);
    write_adapter(outside_ / "evil", 8, 64);  // rank 8: never to be loaded through allowed_
  }
  void TearDown() override {
    set_openat2_disabled_for_testing(false);
    fs::remove_all(tmp_);
  }
  std::shared_ptr<LoraAdapter> load(const std::string& path, LoraLimits limits = {}) {
    return load_peft_adapter_confined({allowed_.string()}, path, "x", cfg_, limits);
  }
  std::string error_of(const std::string& path, LoraLimits limits = {},
                       ErrorKind kind = ErrorKind::kInvalid) {
    try {
      load(path, limits);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      return e.what();
    }
    return "";
  }
  // A path with no adapter directory: a not-found error (HTTP 404, as vLLM's "No adapter found").
  std::string missing_error_of(const std::string& path) { return error_of(path, {}, ErrorKind::kNotFound); }
  ModelConfig cfg_;
  fs::path tmp_, allowed_, outside_;
};

TEST_P(ConfinedLoadTest, GoodAdapterLoadsByAbsoluteAndRelativePath) {
  fs::path fixture = model_dir("llama-tiny") / "adapters/qv-r4-rslora";
  fs::create_directories(allowed_ / "team");
  fs::copy(fixture, allowed_ / "team/qv");
  auto trusted = load_peft_adapter(fixture.string(), "x", cfg_, {});
  for (const std::string& path :
       {(allowed_ / "team/qv").string(), std::string("team/qv"), std::string("./team/../team/qv/"),
        (allowed_ / "team/./x/../qv").string()}) {
    auto a = load(path);
    EXPECT_EQ(a->path, path);
    ASSERT_EQ(a->layers.size(), trusted->layers.size());
    for (size_t l = 0; l < a->layers.size(); ++l) {
      for (size_t m = 0; m < kNumLoraModules; ++m) {
        const auto& x = a->layers[l].modules[m];
        const auto& y = trusted->layers[l].modules[m];
        ASSERT_EQ(x.has_value(), y.has_value()) << path;
        if (!x) continue;
        EXPECT_EQ(x->a, y->a);
        EXPECT_EQ(x->b, y->b);
        EXPECT_EQ(x->scale, y->scale);
      }
    }
  }
  // A second allowed directory is searched for relative paths, and the allowed directory may be the
  // adapter directory itself.
  fs::create_directories(tmp_ / "second");
  write_adapter(tmp_ / "second/mine", 2, 4);
  auto b = load_peft_adapter_confined({allowed_.string(), (tmp_ / "second").string()}, "mine", "y", cfg_, {});
  EXPECT_EQ(b->max_rank, 2);
  auto c = load_peft_adapter_confined({(tmp_ / "second/mine").string()}, (tmp_ / "second/mine").string(), "z",
                                      cfg_, {});
  EXPECT_EQ(c->max_rank, 2);
}

TEST_P(ConfinedLoadTest, SymlinksAreRefused) {
  fs::create_directory_symlink(outside_ / "evil", allowed_ / "link");
  std::string e1 = error_of((allowed_ / "link").string());
  EXPECT_NE(e1.find("link is a symbolic link; adapters must be regular files inside --lora-allowed-dirs"),
            std::string::npos)
      << e1;
  EXPECT_NE(error_of("link").find("is a symbolic link"), std::string::npos);
  // A link on the way to the adapter directory.
  fs::create_directory_symlink(outside_, allowed_ / "up");
  std::string e2 = error_of("up/evil");
  EXPECT_NE(e2.find("up is a symbolic link"), std::string::npos) << e2;

  write_adapter(allowed_ / "cfglink", 4, 8);
  fs::remove(allowed_ / "cfglink/adapter_config.json");
  fs::create_symlink(outside_ / "evil/adapter_config.json", allowed_ / "cfglink/adapter_config.json");
  std::string e3 = error_of("cfglink");
  EXPECT_NE(e3.find("cfglink/adapter_config.json is a symbolic link"), std::string::npos) << e3;

  write_adapter(allowed_ / "weightlink", 8, 8);
  fs::remove(allowed_ / "weightlink/adapter_model.safetensors");
  fs::create_symlink(outside_ / "evil/adapter_model.safetensors",
                     allowed_ / "weightlink/adapter_model.safetensors");
  std::string e4 = error_of("weightlink");
  EXPECT_NE(e4.find("weightlink/adapter_model.safetensors is a symbolic link"), std::string::npos) << e4;

  fs::create_directories(allowed_ / "zero");
  fs::create_symlink("/dev/zero", allowed_ / "zero/adapter_config.json");
  EXPECT_NE(error_of("zero").find("adapter_config.json is a symbolic link"), std::string::npos);
}

TEST_P(ConfinedLoadTest, PathsOutsideAreRefused) {
  const std::string outside_msg = "is outside the directories allowed by --lora-allowed-dirs";
  for (const std::string& path :
       {(allowed_ / "../outside/evil").string(), std::string("../outside/evil"),
        std::string("a/../../outside/evil"), (outside_ / "evil").string(), std::string("/etc"),
        std::string("/"), std::string("/../../etc"), (tmp_ / "allowedX/evil").string()}) {
    std::string e = error_of(path);
    EXPECT_NE(e.find(outside_msg), std::string::npos) << path << ": " << e;
  }
}

TEST_P(ConfinedLoadTest, NotAnAdapterDirectory) {
  EXPECT_NE(missing_error_of("missing").find("does not exist in any of the directories allowed"),
            std::string::npos);
  EXPECT_NE(missing_error_of((allowed_ / "missing").string()).find("No adapter found"), std::string::npos);
  write_file(allowed_ / "plain", "x");
  EXPECT_NE(error_of("plain").find("is not a directory"), std::string::npos) << error_of("plain");
  EXPECT_NE(error_of("").find("the adapter path is empty"), std::string::npos);
  EXPECT_NE(error_of(std::string("a\0b", 3)).find("NUL byte"), std::string::npos);
  try {
    load_peft_adapter_confined({}, "x", "x", cfg_, {});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs --lora-allowed-dirs"), std::string::npos);
  }
  fs::create_directories(allowed_ / "empty");
  EXPECT_NE(error_of("empty").find("empty/adapter_config.json is missing"), std::string::npos);
}

TEST_P(ConfinedLoadTest, FifoAndDevicesAreNotRead) {
  fs::create_directories(allowed_ / "fifo");
  ASSERT_EQ(::mkfifo((allowed_ / "fifo/adapter_config.json").c_str(), 0600), 0);
  auto start = std::chrono::steady_clock::now();
  std::string e1 = error_of("fifo");
  EXPECT_NE(e1.find("adapter_config.json is not a regular file"), std::string::npos) << e1;
  write_adapter(allowed_ / "fifo2", 4, 8);
  fs::remove(allowed_ / "fifo2/adapter_model.safetensors");
  ASSERT_EQ(::mkfifo((allowed_ / "fifo2/adapter_model.safetensors").c_str(), 0600), 0);
  std::string e2 = error_of("fifo2");
  EXPECT_NE(e2.find("adapter_model.safetensors is not a regular file"), std::string::npos) << e2;
  // Trusted loads follow links but still read only regular files.
  std::string e3;
  try {
    load_peft_adapter((allowed_ / "fifo").string(), "x", cfg_, {});
  } catch (const Error& e) {
    e3 = e.what();
  }
  EXPECT_NE(e3.find("is not a regular file"), std::string::npos) << e3;
  std::string e4;
  fs::create_directories(allowed_ / "zero");
  fs::create_symlink("/dev/zero", allowed_ / "zero/adapter_config.json");
  try {
    load_peft_adapter((allowed_ / "zero").string(), "x", cfg_, {});
  } catch (const Error& e) {
    e4 = e.what();
  }
  EXPECT_NE(e4.find("adapter_config.json is not a regular file"), std::string::npos) << e4;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST_P(ConfinedLoadTest, SizesAreCapped) {
  write_adapter(allowed_ / "bigcfg", 4, 8);
  write_file(allowed_ / "bigcfg/adapter_config.json", "{}" + std::string(size_t{1} << 20, ' '));
  std::string e1 = error_of("bigcfg");
  EXPECT_NE(e1.find("adapter_config.json is larger than 1048576 bytes"), std::string::npos) << e1;
  write_adapter(allowed_ / "bigweights", 4, 8);
  LoraLimits small;
  small.max_adapter_bytes = 1000;
  std::string e2 = error_of("bigweights", small);
  EXPECT_NE(e2.find("adapter_model.safetensors is larger than 1000 bytes"), std::string::npos) << e2;
}

TEST_P(ConfinedLoadTest, HostileConfigs) {
  write_adapter(allowed_ / "a", 4, 8);
  std::string file = (allowed_ / "a/adapter_config.json").string();
  write_file(file, R"({"r": 16.5})");
  EXPECT_EQ(error_of("a"), "adapter 'x': " + (fs::path("a") / "adapter_config.json").string() +
                               ": 'r' must be a positive integer, got 16.5");
  write_file(file, R"({"r": 4, "lora_alpha": "x"})");
  EXPECT_NE(error_of("a").find("'lora_alpha' must be a number, got \"x\""), std::string::npos);
  write_file(file, std::string(100000, '['));
  EXPECT_NE(error_of("a").find("nests objects and arrays deeper than 64 levels"), std::string::npos);
  write_file(file, "{\"r\": 4, \"bias\": \"\xff\xfe\"}");
  std::string e = error_of("a");
  EXPECT_NE(e.find("is not valid JSON"), std::string::npos) << e;
  EXPECT_NO_THROW((void)nlohmann::json(e).dump());
  write_file(file, R"({"r": 4, "rank_pattern": {")" + std::string(50000, '(') + R"(": 4}})");
  EXPECT_NE(error_of("a").find("rank_pattern key '((((("), std::string::npos);
}

TEST_P(ConfinedLoadTest, SwappingADirectoryForASymlinkNeverLoadsOutside) {
  write_adapter(allowed_ / "swap", 4, 8);
  fs::create_directory_symlink(outside_ / "evil", allowed_ / "swap_alt");
  // A config file swapped with a link to a config whose lora_alpha (32) would change the scale.
  write_adapter(allowed_ / "fswap", 4, 8);
  write_json(outside_ / "alpha32.json",
             {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 32}, {"target_modules", {"q_proj"}}});
  fs::create_symlink(outside_ / "alpha32.json", allowed_ / "fswap/cfg_alt");

  std::string swap = (allowed_ / "swap").string(), swap_alt = (allowed_ / "swap_alt").string();
  std::string cfg = (allowed_ / "fswap/adapter_config.json").string();
  std::string cfg_alt = (allowed_ / "fswap/cfg_alt").string();
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    bool exchange = true;
    while (!stop) {
      if (exchange && ::renameat2(AT_FDCWD, swap.c_str(), AT_FDCWD, swap_alt.c_str(), RENAME_EXCHANGE) == 0 &&
          ::renameat2(AT_FDCWD, cfg.c_str(), AT_FDCWD, cfg_alt.c_str(), RENAME_EXCHANGE) == 0) {
        ++swaps;
        continue;
      }
      exchange = false;  // no RENAME_EXCHANGE here: move the real entry aside and the link in, and back
      std::string parked = swap + ".parked", link_parked = swap_alt + ".parked";
      ::rename(swap.c_str(), parked.c_str());
      ::rename(swap_alt.c_str(), swap.c_str());
      ::rename(swap.c_str(), swap_alt.c_str());
      ::rename(parked.c_str(), swap.c_str());
      ++swaps;
    }
  });
  int loaded = 0, refused = 0;
  for (int i = 0; i < 200; ++i) {
    for (const std::string& path : {std::string(i % 2 ? "swap" : swap), std::string("fswap")}) {
      try {
        auto a = load(path);
        EXPECT_EQ(a->max_rank, 4) << "loaded the adapter outside the allowed directory";
        EXPECT_FLOAT_EQ(q_of(*a).scale, 2.0f) << "read the config outside the allowed directory";
        ++loaded;
      } catch (const Error& e) {
        std::string message = e.what();
        EXPECT_TRUE(message.find("symbolic link") != std::string::npos ||
                    message.find("does not exist") != std::string::npos ||
                    message.find("is missing") != std::string::npos)
            << message;
        ++refused;
      }
    }
  }
  stop = true;
  swapper.join();
  EXPECT_GT(swaps.load(), 0);
  std::printf("race: %d loads, %d refused, %d swaps\n", loaded, refused, swaps.load());
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, ConfinedLoadTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("OnofollowWalk") : std::string("Openat2");
                         });

// Tensor names with indices that do not fit any integer type are clear errors naming the tensor.
TEST(HostileTensorNamesTest, HugeLayerAndExpertIndices) {
  fs::path tmp = make_temp_dir("tensor-names");
  auto error_of = [&](const std::string& model, const std::map<std::string, RawTensor>& tensors) {
    fs::path dir = tmp / std::to_string(tensors.size()) / model;
    fs::create_directories(dir);
    write_json(dir / "adapter_config.json", {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8}});
    write_safetensors(dir / "adapter_model.safetensors", tensors);
    try {
      load_peft_adapter(dir.string(), "x", model_config(model), {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string huge = "99999999999999999999";
  std::string e1 =
      error_of("llama-tiny", {{kPre + huge + ".self_attn.q_proj.lora_A.weight", f32_tensor({4, 128})},
                              {kPre + huge + ".self_attn.q_proj.lora_B.weight", f32_tensor({128, 4})}});
  EXPECT_NE(e1.find("(tensor 'base_model.model.model.layers." + huge +
                    ".self_attn.q_proj.lora_A.weight') names layer " + huge + ", but the model has 2 layers"),
            std::string::npos)
      << e1;
  std::string e2 =
      error_of("qwen3-moe-tiny",
               {{kPre + "0.mlp.experts." + huge + huge + ".gate_proj.lora_A.weight", f32_tensor({4, 64})},
                {kPre + "0.mlp.experts." + huge + huge + ".gate_proj.lora_B.weight", f32_tensor({32, 4})}});
  EXPECT_NE(e2.find("names expert " + huge + huge + ", but the model has 8 experts"), std::string::npos)
      << e2;
  std::string e3 =
      error_of("llama-tiny", {{kPre + "-1.self_attn.q_proj.lora_A.weight", f32_tensor({4, 128})},
                              {kPre + "-1.self_attn.q_proj.lora_B.weight", f32_tensor({128, 4})}});
  EXPECT_NE(e3.find("is not supported by polylora"), std::string::npos) << e3;
  std::string e4 =
      error_of("llama-tiny", {{kPre + "0.self_attn.q_proj\xc3\xa9.lora_A.weight", f32_tensor({4, 128})},
                              {kPre + "0.self_attn.q_proj\xc3\xa9.lora_B.weight", f32_tensor({128, 4})}});
  EXPECT_NE(e4.find("is not a module of this llama model"), std::string::npos) << e4;
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace polylora
