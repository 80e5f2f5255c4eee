// lora/peft_loader.cc: reads PEFT LoRA adapters (three layouts) and validates them against the model.
// Layouts: per-module targets (self_attn.q_proj, mlp.gate_proj, ...), per-expert modules
// (mlp.experts.{e}.gate_proj, Mixtral block_sparse_moe.experts.{e}.w1/w2/w3), and PEFT
// target_parameters on fused 3-D expert tensors (mlp.experts.gate_up_proj / down_proj), whose A is
// (E, r, in) expert-major and whose B is (out, r, E) expert-minor (see the fixtures README).
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "lora/adapter.h"
#include "runtime/safetensors.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::atomic<uint64_t> g_generation{0};

struct PeftConfig {
  int64_t r = 8;
  double alpha = 8;
  bool rslora = false;
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  std::vector<std::string> target_parameters;
};

bool pattern_matches(const std::string& pattern, const std::string& module) {
  // PEFT matches pattern keys as a regex on the full module name, or as its suffix after a dot.
  try {
    return std::regex_match(module, std::regex("(.*\\.)?" + pattern + "$"));
  } catch (const std::regex_error&) {
    return module == pattern ||
           (module.size() > pattern.size() &&
            module.compare(module.size() - pattern.size(), pattern.size(), pattern) == 0 &&
            module[module.size() - pattern.size() - 1] == '.');
  }
}

PeftConfig read_config(const fs::path& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) fail("adapter '{}': {} is missing", name, path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("adapter '{}': {} is not valid JSON: {}", name, path.string(), e.what());
  }
  if (!j.is_object()) fail("adapter '{}': {} must hold a JSON object", name, path.string());
  auto bad = [&](const std::string& what) { fail("adapter '{}': {}: {}", name, path.string(), what); };
  std::string peft_type = j.value("peft_type", std::string("LORA"));
  if (peft_type != "LORA") bad("peft_type is '" + peft_type + "'; only LORA adapters are supported");
  if (j.contains("use_dora") && j["use_dora"].is_boolean() && j["use_dora"].get<bool>())
    bad("DoRA adapters (use_dora: true) are not supported");
  if (j.contains("bias") && j["bias"].is_string() && j["bias"].get<std::string>() != "none")
    bad("LoRA bias '" + j["bias"].get<std::string>() + "' is not supported (only \"none\")");
  if (j.contains("lora_bias") && j["lora_bias"].is_boolean() && j["lora_bias"].get<bool>())
    bad("lora_bias is not supported");
  if (j.contains("modules_to_save") && j["modules_to_save"].is_array() && !j["modules_to_save"].empty())
    bad("modules_to_save is not supported (the adapter would replace whole modules)");
  if (j.contains("fan_in_fan_out") && j["fan_in_fan_out"].is_boolean() && j["fan_in_fan_out"].get<bool>())
    bad("fan_in_fan_out adapters are not supported");
  PeftConfig c;
  try {
    c.r = j.value("r", int64_t{8});
    c.alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<double>()
                                                                      : static_cast<double>(c.r);
    c.rslora = j.value("use_rslora", false);
    if (j.contains("rank_pattern") && j["rank_pattern"].is_object())
      for (auto& [k, v] : j["rank_pattern"].items()) c.rank_pattern.emplace_back(k, v.get<int64_t>());
    if (j.contains("alpha_pattern") && j["alpha_pattern"].is_object())
      for (auto& [k, v] : j["alpha_pattern"].items()) c.alpha_pattern.emplace_back(k, v.get<double>());
    if (j.contains("target_parameters") && j["target_parameters"].is_array())
      for (auto& v : j["target_parameters"]) c.target_parameters.push_back(v.get<std::string>());
  } catch (const json::exception& e) {
    bad(std::string("a field has the wrong type: ") + e.what());
  }
  if (c.r <= 0) bad("r must be positive");
  return c;
}

struct Pair {
  const TensorInfo* a = nullptr;
  const TensorInfo* b = nullptr;
};

std::vector<float> to_f32(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, v.size(), v.data());
  return v;
}

enum class ExpertPart { kGateUp, kDown };

}  // namespace

const char* lora_module_name(LoraModule module) {
  switch (module) {
    case LoraModule::kQ:
      return "q_proj";
    case LoraModule::kK:
      return "k_proj";
    case LoraModule::kV:
      return "v_proj";
    case LoraModule::kO:
      return "o_proj";
    case LoraModule::kGate:
      return "gate_proj";
    case LoraModule::kUp:
      return "up_proj";
    case LoraModule::kDown:
      return "down_proj";
  }
  return "?";
}

size_t LoraAdapter::num_bytes() const {
  size_t total = 0;
  auto add = [&](const std::optional<LoraMatrix>& m) {
    if (m) total += (m->a.size() + m->b.size()) * sizeof(float);
  };
  for (const auto& layer : layers) {
    for (const auto& m : layer.modules) add(m);
    for (const auto& e : layer.experts) {
      add(e.gate_up);
      add(e.gate);
      add(e.up);
      add(e.down);
    }
  }
  return total;
}

std::shared_ptr<LoraAdapter> load_peft_adapter(const std::string& dir, const std::string& name,
                                               const ModelConfig& cfg, const LoraLimits& limits) {
  fs::path root(dir);
  if (!fs::is_directory(root)) fail("adapter '{}': directory {} does not exist", name, dir);
  PeftConfig pc = read_config(root / "adapter_config.json", name);
  fs::path weights = root / "adapter_model.safetensors";
  if (!fs::exists(weights)) {
    if (fs::exists(root / "adapter_model.bin"))
      fail(
          "adapter '{}': only adapter_model.bin found in {}; PyTorch pickle adapters are not supported, "
          "save the adapter with safetensors",
          name, dir);
    fail("adapter '{}': {} is missing", name, weights.string());
  }
  Checkpoint ckpt = Checkpoint::open_file(weights.string());
  std::string file = weights.string();

  // Group lora_A / lora_B tensors by module path.
  std::map<std::string, Pair> modules;
  for (const std::string& key : ckpt.names()) {
    std::string path = key;
    const std::string prefix = "base_model.model.";
    if (path.rfind(prefix, 0) == 0) path = path.substr(prefix.size());
    bool is_a = false;
    auto ends_with = [&](const std::string& s) {
      return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with(".lora_A.weight")) {
      is_a = true;
      path.resize(path.size() - std::string(".lora_A.weight").size());
    } else if (ends_with(".lora_B.weight")) {
      path.resize(path.size() - std::string(".lora_B.weight").size());
    } else if (key.find("lora_embedding") != std::string::npos) {
      fail("adapter '{}': {}: tensor '{}': LoRA on embeddings is not supported", name, file, key);
    } else if (key.find("lora_magnitude_vector") != std::string::npos) {
      fail("adapter '{}': {}: tensor '{}': DoRA adapters are not supported", name, file, key);
    } else {
      fail(
          "adapter '{}': {}: tensor '{}' is not a LoRA weight (expected ...lora_A.weight or "
          "...lora_B.weight)",
          name, file, key);
    }
    (is_a ? modules[path].a : modules[path].b) = &ckpt.get(key);
  }
  if (modules.empty()) fail("adapter '{}': {} holds no LoRA tensors", name, file);

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->path = dir;
  adapter->generation = ++g_generation;
  adapter->layers.resize(static_cast<size_t>(cfg.num_layers));

  auto scale_for = [&](const std::string& module, int64_t rank) {
    double alpha = pc.alpha;
    for (const auto& [pattern, a] : pc.alpha_pattern)
      if (pattern_matches(pattern, module)) alpha = a;
    return static_cast<float>(pc.rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                        : alpha / static_cast<double>(rank));
  };
  auto check_rank = [&](const std::string& module, int64_t rank) {
    int64_t expected = pc.r;
    for (const auto& [pattern, r] : pc.rank_pattern)
      if (pattern_matches(pattern, module)) expected = r;
    if (rank != expected)
      fail("adapter '{}': module '{}' has rank {} in {}, but adapter_config.json says r = {}", name, module,
           rank, file, expected);
    if (rank > limits.max_lora_rank)
      fail("adapter '{}': module '{}' has rank {}, above the maximum LoRA rank {} (raise --max-lora-rank)",
           name, module, rank, limits.max_lora_rank);
  };
  // A dense-style matrix: A [r, in], B [out, r].
  auto make_matrix = [&](const std::string& module, const Pair& p, int64_t in, int64_t out) {
    const TensorInfo& a = *p.a;
    const TensorInfo& b = *p.b;
    if (a.shape.size() != 2 || b.shape.size() != 2)
      fail("adapter '{}': module '{}': lora_A and lora_B must be 2-D (got {} and {})", name, module,
           a.shape_string(), b.shape_string());
    int64_t rank = a.shape[0];
    check_rank(module, rank);
    if (a.shape[1] != in || b.shape[0] != out || b.shape[1] != rank)
      fail(
          "adapter '{}': module '{}' does not fit the model: lora_A is {} and lora_B is {}, expected [r, {}] "
          "and [{}, r]",
          name, module, a.shape_string(), b.shape_string(), in, out);
    LoraMatrix m;
    m.rank = rank;
    m.in = in;
    m.out = out;
    m.scale = scale_for(module, rank);
    m.a = to_f32(a);
    m.b = to_f32(b);
    adapter->max_rank = std::max(adapter->max_rank, rank);
    return m;
  };

  const int64_t H = cfg.hidden_size;
  const int64_t E = cfg.num_experts;
  const int64_t moe_i = cfg.moe_intermediate_size;
  // target_parameters that address the fused expert tensors, outermost wrapper last.
  std::vector<ExpertPart> fused_order;
  for (const std::string& t : pc.target_parameters) {
    auto ends = [&](const std::string& s) {
      return t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("experts.gate_up_proj"))
      fused_order.push_back(ExpertPart::kGateUp);
    else if (ends("experts.down_proj"))
      fused_order.push_back(ExpertPart::kDown);
    else
      fail(
          "adapter '{}': target_parameters entry '{}' is not supported (supported: mlp.experts.gate_up_proj, "
          "mlp.experts.down_proj)",
          name, t);
  }

  static const std::regex layer_re(R"(^model\.layers\.(\d+)\.(.+)$)");
  static const std::regex expert_re(
      R"(^(mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)$)");
  static const std::regex fused_re(R"(^(mlp|block_sparse_moe)\.experts((\.base_layer)*)$)");
  for (const auto& [module, pair] : modules) {
    if (!pair.a || !pair.b)
      fail("adapter '{}': {}: module '{}' has {} but no {}", name, file, module, pair.a ? "lora_A" : "lora_B",
           pair.a ? "lora_B" : "lora_A");
    std::smatch m;
    if (!std::regex_match(module, m, layer_re))
      fail(
          "adapter '{}': target '{}' is not supported by polylora (LoRA applies to attention, MLP and expert "
          "layers)",
          name, module);
    int64_t layer = std::stoll(m[1].str());
    std::string rest = m[2].str();
    if (layer >= cfg.num_layers)
      fail("adapter '{}': target '{}' names layer {}, but the model has {} layers", name, module, layer,
           cfg.num_layers);
    LoraLayer& ll = adapter->layers[static_cast<size_t>(layer)];
    bool moe_layer = cfg.moe_layers[static_cast<size_t>(layer)];
    auto set_dense = [&](LoraModule which, int64_t in, int64_t out) {
      ll.modules[static_cast<size_t>(which)] = make_matrix(module, pair, in, out);
    };
    std::smatch em;
    if (rest == "self_attn.q_proj")
      set_dense(LoraModule::kQ, H, cfg.q_size());
    else if (rest == "self_attn.k_proj")
      set_dense(LoraModule::kK, H, cfg.kv_size());
    else if (rest == "self_attn.v_proj")
      set_dense(LoraModule::kV, H, cfg.kv_size());
    else if (rest == "self_attn.o_proj")
      set_dense(LoraModule::kO, cfg.q_size(), H);
    else if (!moe_layer && rest == "mlp.gate_proj")
      set_dense(LoraModule::kGate, H, cfg.intermediate_size);
    else if (!moe_layer && rest == "mlp.up_proj")
      set_dense(LoraModule::kUp, H, cfg.intermediate_size);
    else if (!moe_layer && rest == "mlp.down_proj")
      set_dense(LoraModule::kDown, cfg.intermediate_size, H);
    else if (moe_layer && std::regex_match(rest, em, expert_re)) {
      bool mixtral_names = em[1].str() == "block_sparse_moe";
      if (mixtral_names != (cfg.arch == Architecture::kMixtral))
        fail("adapter '{}': target '{}' is not a module of this {} model", name, module, cfg.model_type);
      if (cfg.expert_activation == ExpertActivation::kGptOssClampedSwiglu)
        fail("adapter '{}': target '{}': GPT-OSS experts are fused; use target_parameters", name, module);
      int64_t e = std::stoll(em[2].str());
      if (e >= E)
        fail("adapter '{}': target '{}' names expert {}, but the model has {} experts", name, module, e, E);
      if (ll.experts.empty()) ll.experts.resize(static_cast<size_t>(E));
      LoraExpert& le = ll.experts[static_cast<size_t>(e)];
      std::string proj = em[3].str();
      if (proj == "gate_proj" || proj == "w1")
        le.gate = make_matrix(module, pair, H, moe_i);
      else if (proj == "up_proj" || proj == "w3")
        le.up = make_matrix(module, pair, H, moe_i);
      else
        le.down = make_matrix(module, pair, moe_i, H);
      adapter->has_expert_lora = true;
    } else if (moe_layer && std::regex_match(rest, em, fused_re)) {
      if ((em[1].str() == "block_sparse_moe") != (cfg.arch == Architecture::kMixtral))
        fail("adapter '{}': target '{}' is not a module of this {} model", name, module, cfg.model_type);
      int64_t depth = static_cast<int64_t>(em[2].str().size() / std::string(".base_layer").size());
      const TensorInfo& a = *pair.a;
      const TensorInfo& b = *pair.b;
      if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] % E != 0 || b.shape[1] != a.shape[0])
        fail(
            "adapter '{}': fused expert LoRA '{}' has lora_A {} and lora_B {}; expected [r·{}, in] and "
            "[out, r·{}]",
            name, module, a.shape_string(), b.shape_string(), E, E);
      int64_t rank = a.shape[0] / E;
      auto fits = [&](ExpertPart part) {
        int64_t in = part == ExpertPart::kGateUp ? H : moe_i;
        int64_t out = part == ExpertPart::kGateUp ? 2 * moe_i : H;
        return a.shape[1] == in && b.shape[0] == out;
      };
      ExpertPart part;
      bool gu = fits(ExpertPart::kGateUp), dn = fits(ExpertPart::kDown);
      if (gu != dn) {
        part = gu ? ExpertPart::kGateUp : ExpertPart::kDown;
      } else if (gu && depth < static_cast<int64_t>(fused_order.size())) {
        part = fused_order[fused_order.size() - 1 - static_cast<size_t>(depth)];  // PEFT nests in list order
      } else {
        fail(
            "adapter '{}': fused expert LoRA '{}' (lora_A {}, lora_B {}) fits neither gate_up_proj "
            "([r·E, {}] / [{}, r·E]) nor down_proj ([r·E, {}] / [{}, r·E])",
            name, module, a.shape_string(), b.shape_string(), H, 2 * moe_i, moe_i, H);
      }
      check_rank(module, rank);
      int64_t in = a.shape[1], out = b.shape[0];
      std::vector<float> fa = to_f32(a), fb = to_f32(b);
      if (ll.experts.empty()) ll.experts.resize(static_cast<size_t>(E));
      std::string param = part == ExpertPart::kGateUp ? "experts.gate_up_proj" : "experts.down_proj";
      for (int64_t e = 0; e < E; ++e) {
        LoraMatrix mat;
        mat.rank = rank;
        mat.in = in;
        mat.out = out;
        mat.scale = scale_for(module.substr(0, module.find(".experts")) + "." + param, rank);
        mat.a.assign(fa.begin() + e * rank * in, fa.begin() + (e + 1) * rank * in);  // rows e·r .. e·r+r
        mat.b.resize(static_cast<size_t>(out * rank));
        for (int64_t o = 0; o < out; ++o)
          for (int64_t k = 0; k < rank; ++k)
            mat.b[o * rank + k] = fb[o * rank * E + k * E + e];  // column k·E+e
        LoraExpert& le = ll.experts[static_cast<size_t>(e)];
        (part == ExpertPart::kGateUp ? le.gate_up : le.down) = std::move(mat);
      }
      adapter->max_rank = std::max(adapter->max_rank, rank);
      adapter->has_expert_lora = true;
    } else {
      fail("adapter '{}': target '{}' is not a module of this {} model{}", name, module, cfg.model_type,
           moe_layer && rest.rfind("mlp.", 0) == 0 ? " (layer " + std::to_string(layer) + " is a MoE layer)"
                                                   : "");
    }
  }
  return adapter;
}

}  // namespace polylora
