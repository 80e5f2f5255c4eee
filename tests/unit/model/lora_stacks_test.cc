// Tests of model/lora_stacks: asynchronous uploads out of host images (an adapter's first upload goes
// through the staging buffers and asks for its image: the adapter converted once into a host buffer in
// the slot layout; later uploads only copy it) write exactly what the staging path writes, images are
// reused, bounded by their budget, dropped with their adapter, and evicted least recently used first.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/dtype.h"
#include "config/model_config.h"
#include "lora/adapter.h"
#include "model/lora_stacks.h"
#include "unit/model/lora_stacks_test_util.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using testing_util::data_dir;

struct Fixture {
  ModelConfig config;
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
};

Fixture load_fixture(const std::string& model) {
  const fs::path dir = fs::path(data_dir()) / "models" / model;
  Fixture f{ModelConfig::from_file((dir / "config.json").string()), {}};
  LoraLimits limits;
  for (const auto& entry : fs::directory_iterator(dir / "adapters"))
    f.adapters.push_back(
        load_peft_adapter(entry.path().string(), entry.path().filename().string(), f.config, limits));
  return f;
}

std::vector<unsigned char> slot_bytes(const LoraStacks& st, const ModelConfig& c, int32_t slot) {
  return testing_util::lora_slot_bytes(
      st, c, slot, [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); });
}

// An asynchronous upload, then the image it asked for (if any) built.
void upload(LoraStacks& st, int32_t slot, std::shared_ptr<const LoraAdapter> a) {
  st.begin_upload(slot, std::move(a));
  st.finish_upload(slot);
  st.wait_host_images();
}

class LoraStacksImages : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraStacksImages, ImageUploadsEqualTheStagingPath) {
  Fixture f = load_fixture(GetParam());
  ASSERT_GE(f.adapters.size(), 2u);
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraStacks st(*be, f.config);
  EXPECT_EQ(st.host_image_budget(), 0u) << "images are off by default where the stacks are host memory";
  st.reserve(4, 16);  // rank-8 adapters take the padded path, rank-16 ones the whole-matrix one
  for (const auto& a : f.adapters) {
    SCOPED_TRACE(a->name);
    st.set_host_image_budget(0);
    upload(st, 0, a);  // the staging path
    st.set_host_image_budget(size_t{1} << 40);
    const int64_t images = st.host_images();
    upload(st, 1, a);  // through the staging buffers, then builds the image
    EXPECT_EQ(st.host_images(), images + 1);
    upload(st, 2, a);  // out of the image
    EXPECT_EQ(st.host_images(), images + 1);
    const std::vector<unsigned char> s0 = slot_bytes(st, f.config, 0);
    ASSERT_EQ(slot_bytes(st, f.config, 1), s0);
    ASSERT_EQ(slot_bytes(st, f.config, 2), s0);
    bool nonzero = false;
    for (unsigned char b : s0) nonzero = nonzero || b != 0;
    EXPECT_TRUE(nonzero) << "the slot holds the adapter's weights";
  }
  // Slot 3 never written: the comparison above is not between empty regions.
  const std::vector<unsigned char> empty = slot_bytes(st, f.config, 3);
  EXPECT_NE(slot_bytes(st, f.config, 0), empty);
  EXPECT_EQ(st.host_images(), static_cast<int64_t>(f.adapters.size()));
  EXPECT_GT(st.host_image_bytes(), 0u);

  // An adapter over the budget takes the staging path, leaving the images as they are.
  const size_t held = st.host_image_bytes();
  st.set_host_image_budget(1);
  std::shared_ptr<LoraAdapter> fresh = load_fixture(GetParam()).adapters.front();
  upload(st, 3, fresh);
  EXPECT_EQ(st.host_images(), static_cast<int64_t>(f.adapters.size()));
  EXPECT_EQ(st.host_image_bytes(), held);
  const std::vector<unsigned char> staged = slot_bytes(st, f.config, 3);
  // The same adapter's image (an existing image is used whatever the budget, other than 0) writes the same.
  upload(st, 3, f.adapters.front());
  EXPECT_EQ(slot_bytes(st, f.config, 3), staged);
  EXPECT_EQ(st.host_images(), static_cast<int64_t>(f.adapters.size()));
}

TEST_P(LoraStacksImages, ImagesGoWithTheirAdapterAndLeastRecentlyUsedFirst) {
  Fixture f = load_fixture(GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraStacks st(*be, f.config);
  st.reserve(2, 16);
  st.set_host_image_budget(size_t{1} << 40);
  std::shared_ptr<LoraAdapter> a = load_fixture(GetParam()).adapters.front();
  upload(st, 0, a);
  const size_t one = st.host_image_bytes();
  ASSERT_EQ(st.host_images(), 1);
  // The adapter object is gone (unloaded, out of the host tier): its image is freed by the next upload.
  a.reset();
  upload(st, 1, f.adapters.front());
  EXPECT_EQ(st.host_images(), 1);
  // A budget for the two largest images at most: the least recently uploaded goes.
  size_t largest = 0;
  for (const auto& ad : f.adapters) {
    LoraStacks probe(*be, f.config);
    probe.reserve(1, 16);
    probe.set_host_image_budget(size_t{1} << 40);
    upload(probe, 0, ad);
    largest = std::max(largest, probe.host_image_bytes());
  }
  ASSERT_GT(one, 0u);
  st.set_host_image_budget(largest);  // room for one image
  upload(st, 0, f.adapters.back());
  EXPECT_EQ(st.host_images(), 1);
  EXPECT_LE(st.host_image_bytes(), largest);
  const std::vector<unsigned char> want = slot_bytes(st, f.config, 0);
  st.set_host_image_budget(0);
  upload(st, 1, f.adapters.back());
  EXPECT_EQ(slot_bytes(st, f.config, 1), want);
  // A new reservation frees the images (their regions were the old stacks').
  st.reserve(2, 16);
  EXPECT_EQ(st.host_images(), 0);
  EXPECT_EQ(st.host_image_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, LoraStacksImages, ::testing::Values("gpt-oss-tiny", "qwen3-moe-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace polylora
