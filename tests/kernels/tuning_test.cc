// tests/kernels/tuning_test.cc: the tuned-parameter files (kernels/tuning.h): the shipped H200 file, parsing
// and its errors, resolution by device and shape, round trips through the writer, the process-wide values
// with an override, and the tuner's choice of a bound from measurements.
#include "kernels/tuning.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"

namespace polylora::kernels {
namespace {

TEST(Tuning, ShippedH200FileParsesAndSetsTheBounds) {
  const std::vector<TuningFile>& files = builtin_tuning_files();
  const TuningFile* h200 = nullptr;
  for (const TuningFile& f : files)
    if (f.device == "NVIDIA H200") h200 = &f;
  ASSERT_NE(h200, nullptr);
  EXPECT_FALSE(h200->source.empty());
  const KernelTuning t = resolve_tuning(files, "NVIDIA H200", {.hidden = 2880, .inter = 2880, .experts = 32});
  EXPECT_EQ(t.mxfp4_mma_per_expert, 256);
  EXPECT_EQ(t.mxfp4_tc_min_per_expert, 0);
  EXPECT_EQ(t.moe_tc_max_per_expert, 31);
  EXPECT_EQ(t.lora_dense_gemv_shrink_rows, 64);
}

// The H100 file (polylora_bench tune on an H100 80GB HBM3) applies to that device name and GPT-OSS-20B's
// expert shape only; another shape on the same device keeps the defaults.
TEST(Tuning, ShippedH100FileAppliesToItsDeviceAndShape) {
  const std::vector<TuningFile>& files = builtin_tuning_files();
  const KernelTuning t =
      resolve_tuning(files, "NVIDIA H100 80GB HBM3", {.hidden = 2880, .inter = 2880, .experts = 32});
  EXPECT_EQ(t.moe_tc_min_per_expert, 4);
  EXPECT_EQ(t.mxfp4_mma_per_expert, 64);
  EXPECT_EQ(t.moe_wgmma_per_expert, 16);
  const KernelTuning d;
  const KernelTuning other =
      resolve_tuning(files, "NVIDIA H100 80GB HBM3", {.hidden = 2048, .inter = 768, .experts = 128});
  EXPECT_EQ(other.moe_tc_min_per_expert, d.moe_tc_min_per_expert);
  EXPECT_EQ(other.mxfp4_mma_per_expert, d.mxfp4_mma_per_expert);
}

TEST(Tuning, UnknownDeviceGetsTheDefaults) {
  const std::vector<TuningFile> files = {parse_tuning_file(
      R"({"device": "GPU A", "entries": [{"mxfp4_mma_per_expert": 3, "moe_small_pairs": 100}]})", "a")};
  const KernelTuning d;
  const KernelTuning t = resolve_tuning(files, "GPU B", {.hidden = 64, .inter = 32, .experts = 4});
  for (const std::string& name : tuning_field_names())
    EXPECT_EQ(get_tuning_field(t, name), get_tuning_field(d, name)) << name;
  const KernelTuning a = resolve_tuning(files, "GPU A", {.hidden = 64, .inter = 32, .experts = 4});
  EXPECT_EQ(a.mxfp4_mma_per_expert, 3);
  EXPECT_EQ(a.moe_small_pairs, 100);
  EXPECT_EQ(a.moe_tc_max_per_expert, d.moe_tc_max_per_expert);  // not in the entry: the default
}

TEST(Tuning, TheMostSpecificMatchingEntryWinsAndLaterFilesWinTies) {
  const std::vector<TuningFile> files = {
      parse_tuning_file(R"({"device": "G", "entries": [
          {"moe_tc_max_per_expert": 10},
          {"hidden": 2880, "moe_tc_max_per_expert": 11},
          {"hidden": 2880, "inter": 2880, "experts": 32, "moe_tc_max_per_expert": 12},
          {"hidden": 4096, "inter": 1536, "experts": 128, "moe_tc_max_per_expert": 13}]})",
                        "first"),
      parse_tuning_file(R"({"device": "G", "entries": [{"hidden": 2880, "moe_tc_max_per_expert": 21}]})",
                        "second"),
  };
  EXPECT_EQ(resolve_tuning(files, "G", {.hidden = 2880, .inter = 2880, .experts = 32}).moe_tc_max_per_expert,
            12);
  EXPECT_EQ(resolve_tuning(files, "G", {.hidden = 2880, .inter = 5760, .experts = 32}).moe_tc_max_per_expert,
            21);
  EXPECT_EQ(resolve_tuning(files, "G", {.hidden = 4096, .inter = 1536, .experts = 128}).moe_tc_max_per_expert,
            13);
  EXPECT_EQ(resolve_tuning(files, "G", {.hidden = 4096, .inter = 768, .experts = 128}).moe_tc_max_per_expert,
            10);
  EXPECT_EQ(resolve_tuning(files, "G", {}).moe_tc_max_per_expert, 10);  // dense ops: the generic entry
}

void expect_parse_error(const std::string& json, const std::string& needle) {
  try {
    parse_tuning_file(json, "t.json");
    ADD_FAILURE() << "no error for " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
  }
}

TEST(Tuning, BadFilesAreClearErrors) {
  expect_parse_error("{", "not valid JSON");
  expect_parse_error(R"({"entries": []})", "\"device\"");
  expect_parse_error(R"({"device": "G", "entries": [{"mxfp4_mma_per_expert": 2.5}]})",
                     "entries[0].mxfp4_mma_per_expert must be an integer");
  expect_parse_error(R"({"device": "G", "entries": [{"mxfp4_mma_per_exprt": 2}]})",
                     "unknown field \"mxfp4_mma_per_exprt\"");
  expect_parse_error(R"({"device": "G", "entries": [{"hidden": -1}]})", "entries[0].hidden must be >= 0");
  expect_parse_error(R"({"device": "G", "entrys": []})", "unknown key \"entrys\"");
  expect_parse_error(R"({"device": "G", "entries": {}})", "\"entries\" must be an array");
}

TEST(Tuning, WriterRoundTrips) {
  TuningFile f{.device = "NVIDIA H200", .source = "polylora_bench tune, 2026-12-03", .entries = {}};
  f.entries.push_back({.shape = {.hidden = 2880, .inter = 2880, .experts = 32},
                       .values = {{"mxfp4_mma_per_expert", 6}, {"moe_small_pairs", 700}}});
  f.entries.push_back({.shape = {}, .values = {{"lora_dense_gemv_shrink_rows", 48}}});
  const TuningFile g = parse_tuning_file(tuning_file_json(f), "round trip");
  EXPECT_EQ(g.device, f.device);
  EXPECT_EQ(g.source, f.source);
  ASSERT_EQ(g.entries.size(), 2u);
  EXPECT_EQ(g.entries[0].shape.hidden, 2880);
  EXPECT_EQ(g.entries[0].shape.experts, 32);
  EXPECT_EQ(g.entries[0].values, f.entries[0].values);
  EXPECT_EQ(g.entries[1].shape.hidden, 0);
  EXPECT_EQ(g.entries[1].values, f.entries[1].values);
}

TEST(Tuning, FolderFilesLoadByNameAndBadOnesNameTheFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("polylora_tuning_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "b.json") << R"({"device": "G", "entries": [{"moe_tc_max_per_expert": 2}]})";
  std::ofstream(dir / "a.json") << R"({"device": "G", "entries": [{"moe_tc_max_per_expert": 1}]})";
  std::ofstream(dir / "notes.txt") << "not a tuning file";
  const std::vector<TuningFile> files = load_tuning_folder(dir.string());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(resolve_tuning(files, "G", {}).moe_tc_max_per_expert, 2);  // b.json is later
  std::ofstream(dir / "c.json") << R"({"device": "G", "entries": [{"bogus": 1}]})";
  try {
    load_tuning_folder(dir.string());
    ADD_FAILURE() << "no error for c.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_tuning_folder((dir / "missing").string()), Error);
  fs::remove_all(dir);
}

TEST(Tuning, ProcessValuesFollowTheDeviceAndTheOverride) {
  set_tuning_device("NVIDIA H200");
  const TuningShape shape{.hidden = 2880, .inter = 2880, .experts = 32};
  const KernelTuning h200 = resolve_tuning(builtin_tuning_files(), "NVIDIA H200", shape);
  // (POLYLORA_* variables would override single fields; the test environment sets none.)
  EXPECT_EQ(kernel_tuning(shape).mxfp4_mma_per_expert, h200.mxfp4_mma_per_expert);
  KernelTuning o;
  o.mxfp4_mma_per_expert = 1234;
  override_kernel_tuning(o);
  EXPECT_EQ(kernel_tuning(shape).mxfp4_mma_per_expert, 1234);
  EXPECT_EQ(kernel_tuning({}).mxfp4_mma_per_expert, 1234);  // every shape
  override_kernel_tuning(std::nullopt);
  EXPECT_EQ(kernel_tuning(shape).mxfp4_mma_per_expert, h200.mxfp4_mma_per_expert);
  set_tuning_device("Some Other GPU");
  EXPECT_EQ(kernel_tuning(shape).mxfp4_mma_per_expert, KernelTuning{}.mxfp4_mma_per_expert);
  set_tuning_device("");
}

TEST(Tuning, CrossoverIsWhereTheSecondPathStaysFaster) {
  // The second path wins from x = 64 on (its one win at 8 is noise: it loses again at 16 and 32).
  const std::vector<TunePoint> p = {{1, 1.0, 2.0},  {4, 1.0, 1.5},  {8, 1.0, 0.9},  {16, 1.0, 1.1},
                                    {32, 1.0, 1.2}, {64, 2.0, 1.0}, {128, 4.0, 1.5}};
  EXPECT_EQ(pick_crossover(p, -1), 64);
  // Never faster: none; always faster: the first point.
  EXPECT_EQ(pick_crossover({{1, 1.0, 2.0}, {2, 1.0, 2.0}}, 999), 999);
  EXPECT_EQ(pick_crossover({{1, 2.0, 1.0}, {2, 2.0, 1.0}}, 999), 1);
  // Slower at the largest point: none, whatever happened below.
  EXPECT_EQ(pick_crossover({{1, 2.0, 1.0}, {2, 1.0, 3.0}}, 7), 7);
  EXPECT_EQ(pick_crossover({}, 5), 5);
}

// docs/tuning.md is where users look up a knob: every field has its row ("| `name` | ... |") naming the
// environment variable that overrides it (POLYLORA_*; one variable may set related fields, as
// POLYLORA_LORA_GEMV_SHRINK_ROWS sets the dense and the expert shrink bounds).
TEST(Tuning, EveryFieldIsDocumentedWithItsVariable) {
  std::ifstream in(std::string(POLYLORA_TEST_DATA) + "/../../docs/tuning.md");
  ASSERT_TRUE(in.good()) << "docs/tuning.md not found";
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| `", 0) == 0) rows.push_back(line);
  const std::vector<std::string>& fields = tuning_field_names();
  ASSERT_GT(fields.size(), 30u);
  EXPECT_TRUE(tuning_field_env("no_such_field").empty());
  for (const std::string& name : fields) {
    const std::string_view env = tuning_field_env(name);
    EXPECT_EQ(env.rfind("POLYLORA_", 0), 0u) << name << ": " << env;
    const std::string head = "| `" + name + "` |";
    const std::string var = "`" + std::string(env) + "`";
    bool found = false;
    for (const std::string& r : rows)
      if (r.rfind(head, 0) == 0) {
        found = true;
        EXPECT_NE(r.find(var), std::string::npos) << name << "'s row does not name " << env;
      }
    EXPECT_TRUE(found) << "docs/tuning.md has no row for " << name;
  }
}

}  // namespace
}  // namespace polylora::kernels
