// tests/unit/runtime/safetensors_test.cc: the safetensors reader and checkpoint directories.
// Owns: malformed files built byte by byte (each must throw polylora::Error naming the file and the
// tensor), reading the fixture checkpoints, sharded checkpoints and value round trips.
// Must not: depend on a GPU or on any model code.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/utf8.h"
#include "runtime/safetensors.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const fs::path kModels = fs::path(POLYLORA_TEST_DATA) / "models";

// 8-byte little-endian header length, the header, then the data section.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Runs `fn`, expecting a polylora::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected polylora::Error";
  } catch (const Error& e) {
    std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
  }
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    path_ = fs::temp_directory_path() / ("polylora_st_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---- malformed files --------------------------------------------------------------------------------

struct MalformedCase {
  std::string label;                  // test name suffix and file stem
  std::string header;                 // header JSON (ignored when `bytes` is set)
  std::string data;                   // data section
  std::vector<std::string> expected;  // substrings of the message besides the file name
  std::string bytes;                  // when non-empty: the whole file, verbatim
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

std::string one(const std::string& name, const std::string& body) {
  return "{\"" + name + "\":" + body + "}";
}

const std::string kEight(8, '\x01');
const std::string kTensor = "blk.0.weight";

std::vector<MalformedCase> malformed_cases() {
  auto t = [](const std::string& body) { return one(kTensor, body); };
  std::string len_1000 = safetensors_bytes(std::string(20, ' '), "");
  len_1000[0] = static_cast<char>(0xe8);  // 1000 = 0x3e8
  len_1000[1] = 0x03;
  std::string len_huge = safetensors_bytes("{}", "");
  len_huge[5] = 0x01;  // 2^40
  return {
      {"too_short", "", "", {"fewer than the 8-byte"}, std::string("\x02\0\0\0\0", 5)},
      {"header_past_end", "", "", {"header length 1000", "past the end"}, len_1000},
      {"header_absurd", "", "", {"header length 1099511627778", "limit"}, len_huge},
      {"bad_json", "{\"a\": [1, 2", "", {"not valid JSON"}, ""},
      {"not_object", "[1, 2]", "", {"not a JSON object"}, ""},
      {"metadata_not_object", R"({"__metadata__": "pt"})", "", {"'__metadata__' is not a JSON object"}, ""},
      {"metadata_value_not_string",
       R"({"__metadata__": {"format": 1}})",
       "",
       {"'format'", "not a string"},
       ""},
      {"entry_not_object", t("5"), "", {kTensor, "not a JSON object"}, ""},
      {"missing_dtype", t(R"({"shape":[2],"data_offsets":[0,8]})"), kEight, {kTensor, "no 'dtype'"}, ""},
      {"missing_shape", t(R"({"dtype":"F32","data_offsets":[0,8]})"), kEight, {kTensor, "no 'shape'"}, ""},
      {"missing_offsets", t(R"({"dtype":"F32","shape":[2]})"), kEight, {kTensor, "no 'data_offsets'"}, ""},
      {"dtype_not_string", t(entry("3", "[2]", "[0,8]")), kEight, {kTensor, "'dtype' is not a string"}, ""},
      {"dtype_i8",
       t(entry("\"I8\"", "[8]", "[0,8]")),
       kEight,
       {"tensor '" + kTensor + "' in", "has dtype I8, which is not supported (supported: F32, F16, BF16)"},
       ""},
      {"dtype_i32_not_default", t(entry("\"I32\"", "[2]", "[0,8]")), kEight, {kTensor, "dtype I32"}, ""},
      {"dtype_f8", t(entry("\"F8_E4M3\"", "[8]", "[0,8]")), kEight, {kTensor, "dtype F8_E4M3"}, ""},
      {"dtype_bool", t(entry("\"BOOL\"", "[8]", "[0,8]")), kEight, {kTensor, "dtype BOOL"}, ""},
      {"shape_not_array",
       t(entry("\"F32\"", "2", "[0,8]")),
       kEight,
       {kTensor, "'shape' is not an array"},
       ""},
      {"shape_float", t(entry("\"F32\"", "[2.0]", "[0,8]")), kEight, {kTensor, "not an integer"}, ""},
      {"shape_string", t(entry("\"F32\"", "[\"2\"]", "[0,8]")), kEight, {kTensor, "not an integer"}, ""},
      {"shape_negative", t(entry("\"F32\"", "[-2, -1]", "[0,8]")), kEight, {kTensor, "negative"}, ""},
      {"shape_overflow",
       t(entry("\"F32\"", "[4294967296, 4294967296, 4]", "[0,8]")),
       kEight,
       {kTensor, "more elements than fit"},
       ""},
      {"shape_bytes_overflow",
       t(entry("\"F32\"", "[4611686018427387904]", "[0,8]")),
       kEight,
       {kTensor, "needs 4611686018427387904 x 4 bytes"},
       ""},
      {"offsets_not_array", t(entry("\"F32\"", "[2]", "0")), kEight, {kTensor, "not an array of two"}, ""},
      {"offsets_one", t(entry("\"F32\"", "[2]", "[8]")), kEight, {kTensor, "not an array of two"}, ""},
      {"offsets_three", t(entry("\"F32\"", "[2]", "[0,8,8]")), kEight, {kTensor, "not an array of two"}, ""},
      {"offsets_negative", t(entry("\"F32\"", "[2]", "[-8,0]")), kEight, {kTensor, "non-negative"}, ""},
      {"offsets_float",
       t(entry("\"F32\"", "[2]", "[0.0,8.0]")),
       kEight,
       {kTensor, "non-negative integers"},
       ""},
      {"offsets_huge",
       t(entry("\"F32\"", "[2]", "[0,99999999999999999999]")),
       kEight,
       {kTensor, "non-negative integers"},
       ""},
      {"offsets_reversed",
       t(entry("\"F32\"", "[0]", "[8,0]")),
       kEight,
       {kTensor, "end before they begin"},
       ""},
      {"offsets_past_end",
       t(entry("\"F32\"", "[4]", "[0,16]")),
       kEight,
       {kTensor, "past the end of the data"},
       ""},
      {"size_mismatch",
       t(entry("\"F32\"", "[3]", "[0,8]")),
       kEight,
       {kTensor, "needs 3 x 4 bytes", "span 8"},
       ""},
      {"overlap",
       "{\"first\":" + entry("\"F32\"", "[2]", "[0,8]") + ",\"second\":" + entry("\"F32\"", "[2]", "[4,12]") +
           "}",
       std::string(12, '\0'),
       {"tensor 'second'", "overlaps tensor 'first'"},
       ""},
      {"overlap_unordered",
       "{\"second\":" + entry("\"F32\"", "[2]", "[4,12]") + ",\"first\":" + entry("\"F32\"", "[2]", "[0,8]") +
           "}",
       std::string(12, '\0'),
       {"tensor 'second'", "overlaps tensor 'first'"},
       ""},
      {"overlap_same_range",
       "{\"a\":" + entry("\"F32\"", "[2]", "[0,8]") + ",\"b\":" + entry("\"F16\"", "[4]", "[0,8]") + "}",
       kEight,
       {"overlaps"},
       ""},
      {"duplicate_name",
       "{\"" + kTensor + "\":" + entry("\"F32\"", "[1]", "[0,4]") + ",\"" + kTensor +
           "\":" + entry("\"F32\"", "[1]", "[4,8]") + "}",
       kEight,
       {"tensor '" + kTensor + "' appears twice"},
       ""},
      {"duplicate_key_in_entry",
       t(R"({"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]})"),
       kEight,
       {"'dtype' appears twice", kTensor},
       ""},
  };
}

void PrintTo(const MalformedCase& c, std::ostream* os) {
  *os << c.label;
}

class SafetensorsMalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(SafetensorsMalformedTest, ThrowsNamingFileAndTensor) {
  const MalformedCase& c = GetParam();
  TempDir dir;
  std::string file_name = c.label + ".safetensors";
  fs::path path = dir.path() / file_name;
  std::string bytes = c.bytes.empty() ? safetensors_bytes(c.header, c.data) : c.bytes;
  write_bytes(path, bytes);
  std::vector<std::string> parts = c.expected;
  parts.push_back(file_name);
  expect_error([&] { SafetensorsFile::open(path.string()); }, parts);
  // The same validation over in-memory bytes, named as given.
  parts.back() = "memory:" + c.label;
  expect_error(
      [&] {
        SafetensorsFile::parse(std::as_bytes(std::span(bytes.data(), bytes.size())), "memory:" + c.label);
      },
      parts);
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsMalformedTest, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return info.param.label;
                         });

TEST(SafetensorsTest, EmptyFileIsAnErrorNotACrash) {
  TempDir dir;
  fs::path path = dir.path() / "empty.safetensors";
  write_bytes(path, "");
  expect_error([&] { SafetensorsFile::open(path.string()); }, {"empty.safetensors", "0 bytes"});
}

TEST(SafetensorsTest, MissingFileAndDirectoryAreErrors) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open((dir.path() / "nope.safetensors").string()); },
               {"nope.safetensors", "cannot open"});
  expect_error([&] { MappedFile m(dir.path().string()); }, {dir.path().string(), "not a regular file"});
}

TEST(SafetensorsTest, DeeplyNestedHeaderIsAnErrorNotAStackOverflow) {
  TempDir dir;
  const size_t kDepth = 1'000'000;
  std::string nested = std::string(kDepth, '[') + std::string(kDepth, ']');
  fs::path path = dir.path() / "deep.safetensors";
  write_bytes(path, safetensors_bytes(one(kTensor, entry("\"F32\"", nested, "[0,8]")), kEight));
  expect_error([&] { SafetensorsFile::open(path.string()); },
               {"deep.safetensors", "nests objects and arrays deeper than 64 levels"});
  write_bytes(path, safetensors_bytes(R"({"__metadata__": {"k": )" + nested + "}}", ""));
  expect_error([&] { SafetensorsFile::open(path.string()); }, {"deep.safetensors", "deeper than 64 levels"});
  // Nesting within the bound reaches the field checks, which never dump the whole value.
  std::string shallow = std::string(40, '[') + std::string(40, ']');
  write_bytes(path, safetensors_bytes(one(kTensor, entry("\"F32\"", shallow, "[0,8]")), kEight));
  expect_error([&] { SafetensorsFile::open(path.string()); },
               {"deep.safetensors", kTensor, "not an integer"});
  write_bytes(path, safetensors_bytes(R"({"__metadata__": {"k": )" + shallow + "}}", ""));
  expect_error([&] { SafetensorsFile::open(path.string()); }, {"deep.safetensors", "'k'", "not a string"});
}

// ---- well-formed files ------------------------------------------------------------------------------

TEST(SafetensorsTest, ReadsLlamaTinyModel) {
  std::string path = (kModels / "llama-tiny" / "model.safetensors").string();
  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->path(), path);
  const TensorInfo* embed = file->find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, DType::kBF16);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{1024, 128}));
  EXPECT_EQ(embed->shape_string(), "[1024, 128]");
  EXPECT_EQ(embed->numel(), 1024 * 128);
  EXPECT_EQ(embed->num_bytes, 1024u * 128u * 2u);
  EXPECT_EQ(embed->file, path);
  const TensorInfo* head = file->find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->dtype, DType::kBF16);
  EXPECT_EQ(head->shape, (std::vector<int64_t>{1024, 128}));
  EXPECT_EQ(file->find("model.no_such.weight"), nullptr);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  // Every tensor lies inside the file, and the embedding values are finite and not all zero.
  auto size = static_cast<uintmax_t>(fs::file_size(path));
  for (const TensorInfo& t : file->tensors()) EXPECT_GT(t.num_bytes, 0u) << t.name;
  float sum_abs = 0;
  const auto* bf16 = static_cast<const uint16_t*>(embed->data);
  for (int64_t i = 0; i < embed->numel(); ++i) {
    float v = bf16_to_f32(bf16[i]);
    ASSERT_TRUE(std::isfinite(v));
    sum_abs += std::fabs(v);
  }
  EXPECT_GT(sum_abs, 0.0f);
  EXPECT_LT(embed->num_bytes, size);
}

TEST(SafetensorsTest, RoundTripsValuesInHeaderOrder) {
  TempDir dir;
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> bf16, f16;
  for (float v : {0.5f, -1.0f, 2.0f}) bf16.push_back(f32_to_bf16(v));
  for (float v : {0.25f, 8.0f}) f16.push_back(f32_to_f16(v));
  std::vector<int32_t> i32 = {7, -9};
  // Header order differs from both alphabetical and offset order.
  std::string data = raw(f32) + raw(bf16) + raw(f16) + raw(i32);
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}, {"note", "hello"}};
  header["z.f32"] = {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}};
  header["m.bf16"] = {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {24, 30}}};
  header["a.f16"] = {{"dtype", "F16"}, {"shape", {2, 1}}, {"data_offsets", {30, 34}}};
  header["b.i32"] = {{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {34, 42}}};
  // nlohmann::json sorts keys, so build the header text in the order we want by hand.
  std::string text = "{\"__metadata__\":" + header["__metadata__"].dump();
  for (const char* name : {"z.f32", "m.bf16", "a.f16", "b.i32"}) {
    text += std::string(",\"") + name + "\":" + header[name].dump();
  }
  text += "}";
  fs::path path = dir.path() / "values.safetensors";
  write_bytes(path, safetensors_bytes(text, data));

  const DType allowed[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI32};
  auto file = SafetensorsFile::open(path.string(), allowed);
  ASSERT_EQ(file->tensors().size(), 4u);
  EXPECT_EQ(file->tensors()[0].name, "z.f32");
  EXPECT_EQ(file->tensors()[1].name, "m.bf16");
  EXPECT_EQ(file->tensors()[2].name, "a.f16");
  EXPECT_EQ(file->tensors()[3].name, "b.i32");
  EXPECT_EQ(file->metadata().size(), 2u);
  EXPECT_EQ(file->metadata().at("note"), "hello");

  const TensorInfo* t = file->find("z.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape_string(), "[2, 3]");
  std::vector<float> back(6);
  std::memcpy(back.data(), t->data, t->num_bytes);
  EXPECT_EQ(back, f32);

  t = file->find("m.bf16");
  ASSERT_NE(t, nullptr);
  std::vector<float> conv(3);
  convert_to_f32(t->data, t->dtype, 3, conv.data());
  EXPECT_EQ(conv, (std::vector<float>{0.5f, -1.0f, 2.0f}));

  t = file->find("a.f16");
  ASSERT_NE(t, nullptr);
  conv.resize(2);
  convert_to_f32(t->data, t->dtype, 2, conv.data());
  EXPECT_EQ(conv, (std::vector<float>{0.25f, 8.0f}));

  t = file->find("b.i32");
  ASSERT_NE(t, nullptr);
  int32_t ints[2];
  std::memcpy(ints, t->data, sizeof(ints));
  EXPECT_EQ(ints[0], 7);
  EXPECT_EQ(ints[1], -9);

  // Without I32 in the allowed list the same file is rejected, naming the tensor.
  expect_error([&] { SafetensorsFile::open(path.string()); }, {"b.i32", "values.safetensors", "I32"});
}

TEST(SafetensorsTest, AcceptsScalarsEmptyTensorsGapsAndUnorderedRanges) {
  TempDir dir;
  std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
  std::string text = "{\"late\":" + entry("\"F32\"", "[2]", "[8,16]") +
                     ",\"early\":" + entry("\"F32\"", "[]", "[0,4]") +
                     ",\"empty\":" + entry("\"F16\"", "[0, 5]", "[4,4]") + "}";
  fs::path path = dir.path() / "gaps.safetensors";
  write_bytes(path, safetensors_bytes(text, raw(values)));  // bytes 4..8 are a gap
  auto file = SafetensorsFile::open(path.string());
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_TRUE(file->metadata().empty());
  const TensorInfo* early = file->find("early");
  ASSERT_NE(early, nullptr);
  EXPECT_TRUE(early->shape.empty());
  EXPECT_EQ(early->numel(), 1);
  EXPECT_EQ(early->shape_string(), "[]");
  EXPECT_EQ(*static_cast<const float*>(early->data), 1.0f);
  const TensorInfo* late = file->find("late");
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(static_cast<const float*>(late->data)[1], 4.0f);
  const TensorInfo* empty = file->find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->num_bytes, 0u);
}

TEST(SafetensorsTest, HeaderOnlyFileHasNoTensors) {
  auto bytes = safetensors_bytes("{}        ", "");  // padded with spaces, as writers align to 8
  auto file = SafetensorsFile::parse(std::as_bytes(std::span(bytes.data(), bytes.size())), "mem");
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_EQ(file->path(), "mem");
}

TEST(SafetensorsTest, I32AllowedOnlyWhenRequested) {
  std::string path = (kModels / "llama-tiny" / "reference.safetensors").string();
  expect_error([&] { SafetensorsFile::open(path); }, {"reference.safetensors", "tensor '", "dtype I32"});
  const DType allowed[] = {DType::kF32, DType::kI32};
  auto file = SafetensorsFile::open(path, allowed);
  const TensorInfo* prompt = file->find("prompt.0");
  ASSERT_NE(prompt, nullptr);
  EXPECT_EQ(prompt->dtype, DType::kI32);
  EXPECT_EQ(prompt->shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(prompt->num_bytes, 4u);
}

// ---- checkpoints ------------------------------------------------------------------------------------

TEST(SafetensorsCheckpointTest, OpensModelDirectory) {
  std::string dir = (kModels / "llama-tiny").string();
  Checkpoint ckpt = Checkpoint::open_dir(dir);
  EXPECT_EQ(ckpt.location(), dir);
  const TensorInfo& embed = ckpt.get("model.embed_tokens.weight");
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{1024, 128}));
  EXPECT_NE(ckpt.find("lm_head.weight"), nullptr);
  std::vector<std::string> names = ckpt.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
  expect_error([&] { ckpt.get("model.missing"); }, {"checkpoint " + dir + " has no tensor 'model.missing'"});
}

TEST(SafetensorsCheckpointTest, OpensAdapterFileAndDirectory) {
  fs::path dir = kModels / "llama-tiny" / "adapters" / "qv-r4-rslora";
  Checkpoint by_file = Checkpoint::open_file((dir / "adapter_model.safetensors").string());
  Checkpoint by_dir = Checkpoint::open_dir(dir.string());
  EXPECT_FALSE(by_file.names().empty());
  EXPECT_EQ(by_file.names(), by_dir.names());
}

// Writes a two-shard checkpoint: a.0/a.1 in shard 1, b.0 in shard 2.
class SafetensorsShardedTest : public ::testing::Test {
 protected:
  void write_shard(const std::string& file,
                   const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
    std::string text = "{";
    std::string data;
    for (const auto& [name, values] : tensors) {
      if (text.size() > 1) text += ",";
      text += "\"" + name + "\":" +
              entry("\"F32\"", "[" + std::to_string(values.size()) + "]",
                    "[" + std::to_string(data.size()) + "," +
                        std::to_string(data.size() + 4 * values.size()) + "]");
      data += raw(values);
    }
    write_bytes(dir_.path() / file, safetensors_bytes(text + "}", data));
  }
  void write_index(const Json& weight_map) {
    Json index = {{"metadata", {{"total_size", 20}}}, {"weight_map", weight_map}};
    write_bytes(dir_.path() / "model.safetensors.index.json", index.dump());
  }
  void write_default() {
    write_shard(kShard1, {{"a.0", {1.0f, 2.0f}}, {"a.1", {3.0f}}});
    write_shard(kShard2, {{"b.0", {4.0f, 5.0f}}});
    write_index({{"a.0", kShard1}, {"a.1", kShard1}, {"b.0", kShard2}});
  }
  std::string dir() const { return dir_.path().string(); }

  static constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
  static constexpr const char* kShard2 = "model-00002-of-00002.safetensors";
  TempDir dir_;
};

TEST_F(SafetensorsShardedTest, ReadsTwoShards) {
  write_default();
  Checkpoint ckpt = Checkpoint::open_dir(dir());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a.0", "a.1", "b.0"}));
  const TensorInfo& a0 = ckpt.get("a.0");
  EXPECT_NE(a0.file.find(kShard1), std::string::npos);
  EXPECT_EQ(static_cast<const float*>(a0.data)[1], 2.0f);
  const TensorInfo& b0 = ckpt.get("b.0");
  EXPECT_NE(b0.file.find(kShard2), std::string::npos);
  EXPECT_EQ(static_cast<const float*>(b0.data)[0], 4.0f);
  EXPECT_EQ(static_cast<const float*>(b0.data)[1], 5.0f);
  // Copies share the mappings.
  Checkpoint copy = ckpt;
  EXPECT_EQ(copy.get("a.1").data, ckpt.get("a.1").data);
}

TEST_F(SafetensorsShardedTest, MissingShardIsNamed) {
  write_default();
  fs::remove(dir_.path() / kShard2);
  expect_error([&] { Checkpoint::open_dir(dir()); }, {kShard2, "b.0", "does not exist"});
}

TEST_F(SafetensorsShardedTest, TensorMissingFromItsShard) {
  write_default();
  write_index({{"a.0", kShard1}, {"a.1", kShard1}, {"b.0", kShard2}, {"c.0", kShard2}});
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"'c.0'", kShard2, "no such tensor"});
}

TEST_F(SafetensorsShardedTest, TensorInTheWrongShard) {
  write_default();
  write_index({{"a.0", kShard1}, {"a.1", kShard2}, {"b.0", kShard2}});
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"'a.1'", kShard2, "but it is in", kShard1});
}

TEST_F(SafetensorsShardedTest, NameInTwoShards) {
  write_default();
  write_shard(kShard2, {{"b.0", {4.0f, 5.0f}}, {"a.1", {3.0f}}});
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"'a.1'", "appears in both", kShard1, kShard2});
}

TEST_F(SafetensorsShardedTest, BadShardIsReportedWithItsName) {
  write_default();
  write_bytes(dir_.path() / kShard2, "short");
  expect_error([&] { Checkpoint::open_dir(dir()); }, {kShard2, "fewer than the 8-byte"});
}

TEST_F(SafetensorsShardedTest, BadIndex) {
  write_default();
  write_bytes(dir_.path() / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(dir_.path() / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"model.safetensors.index.json", "no 'weight_map'"});
  write_bytes(dir_.path() / "model.safetensors.index.json", R"({"weight_map": {"a.0": 3}})");
  expect_error([&] { Checkpoint::open_dir(dir()); },
               {"model.safetensors.index.json", "'a.0'", "not a string"});
  write_bytes(dir_.path() / "model.safetensors.index.json", R"({"weight_map": {"a.0": "../x.safetensors"}})");
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"'../x.safetensors'", "not a file name inside"});
  std::string dup =
      std::string(R"({"weight_map": {"a.0": ")") + kShard1 + R"(", "a.0": ")" + kShard2 + "\"}}";
  write_bytes(dir_.path() / "model.safetensors.index.json", dup);
  expect_error([&] { Checkpoint::open_dir(dir()); }, {"model.safetensors.index.json", "'a.0' appears twice"});
}

TEST(SafetensorsCheckpointTest, EmptyOrMissingDirectory) {
  TempDir dir;
  expect_error([&] { Checkpoint::open_dir(dir.path().string()); }, {"no checkpoint in", dir.path().string()});
  std::string missing = (dir.path() / "missing").string();
  expect_error([&] { Checkpoint::open_dir(missing); }, {missing, "does not exist"});
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// Messages quote untrusted bytes; they must stay valid UTF-8 (the server puts them into JSON bodies).
void expect_utf8(const std::string& message) {
  EXPECT_NO_THROW((void)Json(message).dump()) << "not valid UTF-8: " << message;
}

template <typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsHostileTest, Utf8Safe) {
  EXPECT_EQ(sanitize_utf8("plain"), "plain");
  EXPECT_EQ(sanitize_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(sanitize_utf8("a\xff"
                          "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(sanitize_utf8("\xc3"), "\xef\xbf\xbd");                                  // truncated
  EXPECT_EQ(sanitize_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xf4\x90\x80\x80").find("\xef\xbf\xbd"), 0u);             // above U+10FFFF
  expect_utf8(sanitize_utf8(std::string("\x80\xbf\xfe\xf8\x88\x80\x80\x80", 8)));
  // append_utf8 (Jinja and pythonic-tool escapes): every length, and U+FFFD for what UTF-8 cannot hold.
  std::string out;
  for (uint32_t cp : {0x41u, 0xE9u, 0x20ACu, 0x1F600u, 0xD800u, 0x110000u}) append_utf8(out, cp);
  EXPECT_EQ(out, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(SafetensorsHostileTest, HeaderNestingIsBounded) {
  std::string deep = R"({"t": {"dtype": "F32", "shape": )" + std::string(100000, '[');
  std::string m =
      message_of([&] { SafetensorsFile::parse(bytes_of(safetensors_bytes(deep, "")), "deep.st"); });
  EXPECT_NE(m.find("header of deep.st nests objects and arrays deeper than 64 levels"), std::string::npos)
      << m;
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += R"({"a":)";
  m = message_of([&] { SafetensorsFile::parse(bytes_of(safetensors_bytes(deep_objects, "")), "deep.st"); });
  EXPECT_NE(m.find("deeper than 64 levels"), std::string::npos) << m;
}

TEST(SafetensorsHostileTest, MessagesAreUtf8) {
  std::string bad_json = "{\"t\xff\xfe\": 1}";
  std::string m =
      message_of([&] { SafetensorsFile::parse(bytes_of(safetensors_bytes(bad_json, "")), "u.st"); });
  EXPECT_NE(m.find("is not valid JSON"), std::string::npos) << m;
  expect_utf8(m);
  std::string accents;
  for (int i = 0; i < 40; ++i) accents += "\xc3\xa9";  // a 64-byte cut falls inside a character
  std::string dtype = R"({"t": {"dtype": ")" + accents + R"(", "shape": [1], "data_offsets": [0, 4]}})";
  m = message_of([&] { SafetensorsFile::parse(bytes_of(safetensors_bytes(dtype, "1234")), "u.st"); });
  EXPECT_NE(m.find("which is not supported"), std::string::npos) << m;
  expect_utf8(m);
}

TEST(SafetensorsHostileTest, OpenFd) {
  fs::path dir = fs::temp_directory_path() / ("polylora-st-fd-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string header = R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  write_bytes(dir / "a.safetensors", safetensors_bytes(header, raw(std::vector<float>{1.5f, -2.0f})));
  int fd = ::open((dir / "a.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Checkpoint ckpt = Checkpoint::open_fd(fd, "shown-name", 1 << 20);
  ::close(fd);  // the checkpoint owns a copy of the bytes
  fs::remove(dir / "a.safetensors");
  const TensorInfo& t = ckpt.get("t");
  EXPECT_EQ(t.file, "shown-name");
  EXPECT_EQ(static_cast<const float*>(t.data)[1], -2.0f);
  EXPECT_EQ(ckpt.location(), "shown-name");

  write_bytes(dir / "b.safetensors", safetensors_bytes(header, raw(std::vector<float>{1.5f, -2.0f})));
  fd = ::open((dir / "b.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  std::string m = message_of([&] { SafetensorsFile::open_fd(fd, "b", 10); });
  EXPECT_NE(m.find("b is larger than 10 bytes"), std::string::npos) << m;
  ::close(fd);
  fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  m = message_of([&] { SafetensorsFile::open_fd(fd, "dir", 1 << 20); });
  EXPECT_NE(m.find("dir is not a regular file"), std::string::npos) << m;
  ::close(fd);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polylora
