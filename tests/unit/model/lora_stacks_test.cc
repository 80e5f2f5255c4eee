// Tests of model/lora_stacks: asynchronous uploads out of host images (an adapter leaving a slot asks for
// its image: the adapter converted once into host memory in the slot layout; its later uploads only copy
// it) write exactly what the staging path writes, images are made on eviction only, reused, bounded by
// their budget, dropped with their adapter, and evicted least recently used first.
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

// An asynchronous upload, then the image it asked for (if any: the slot's previous adapter's) built.
void upload(LoraStacks& st, int32_t slot, std::shared_ptr<const LoraAdapter> a) {
  st.begin_upload(slot, std::move(a));
  st.finish_upload(slot);
  st.wait_host_images();
}

int64_t from_image(const LoraStacks& st) {
  return st.upload_timing().from_image;
}

class LoraStacksImages : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraStacksImages, ImageUploadsEqualTheStagingPath) {
  Fixture f = load_fixture(GetParam());
  ASSERT_GE(f.adapters.size(), 2u);
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraStacks st(*be, f.config);
  EXPECT_EQ(st.host_image_budget(), 0u) << "images are off by default where the stacks are host memory";
  st.reserve(4, 16);  // rank-8 adapters take the padded path, rank-16 ones the whole-matrix one
  // Takes slot 1 from each adapter in turn (a separate object: never imaged, it leaves with images off).
  std::shared_ptr<LoraAdapter> filler = load_fixture(GetParam()).adapters.back();
  for (const auto& a : f.adapters) {
    SCOPED_TRACE(a->name);
    st.set_host_image_budget(0);
    upload(st, 0, a);  // the staging path
    upload(st, 1, a);  // the staging path (no image is made on a first upload)
    st.set_host_image_budget(size_t{1} << 40);
    const int64_t images = st.host_images(), copies = from_image(st);
    upload(st, 1, filler);  // `a` leaves slot 1: its image is built
    EXPECT_EQ(st.host_images(), images + 1);
    EXPECT_EQ(from_image(st), copies);
    upload(st, 2, a);  // out of the image
    EXPECT_EQ(from_image(st), copies + 1);
    EXPECT_EQ(st.host_images(), images + 1);
    const std::vector<unsigned char> s0 = slot_bytes(st, f.config, 0);
    ASSERT_EQ(slot_bytes(st, f.config, 2), s0);
    bool nonzero = false;
    for (unsigned char b : s0) nonzero = nonzero || b != 0;
    EXPECT_TRUE(nonzero) << "the slot holds the adapter's weights";
    st.set_host_image_budget(0);
    upload(st, 1, a);  // the filler leaves with images off: never imaged
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
  const std::vector<unsigned char> staged = slot_bytes(st, f.config, 3);
  const int64_t copies = from_image(st);
  // The same adapter's image (an existing image is used whatever the budget, other than 0) writes the same;
  // `fresh` leaves the slot and gets no image (over the budget).
  upload(st, 3, f.adapters.front());
  EXPECT_EQ(from_image(st), copies + 1);
  EXPECT_EQ(slot_bytes(st, f.config, 3), staged);
  EXPECT_EQ(st.host_images(), static_cast<int64_t>(f.adapters.size()));
  EXPECT_EQ(st.host_image_bytes(), held);
  upload(st, 2, fresh);
  EXPECT_EQ(from_image(st), copies + 1) << "no image of the adapter over the budget";
}

TEST_P(LoraStacksImages, NoImageWhileAdaptersKeepTheirSlots) {
  Fixture f = load_fixture(GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraStacks st(*be, f.config);
  st.reserve(static_cast<int64_t>(f.adapters.size()), 16);
  st.set_host_image_budget(size_t{1} << 40);
  for (size_t i = 0; i < f.adapters.size(); ++i) upload(st, static_cast<int32_t>(i), f.adapters[i]);
  // The same adapter into its own slot again (a reload) is not an eviction either.
  upload(st, 0, f.adapters[0]);
  EXPECT_EQ(st.host_images(), 0);
  EXPECT_EQ(st.host_image_bytes(), 0u);
  // A slot freed (AdapterSlots::free_slot before another adapter's upload takes it) is an eviction.
  ASSERT_GE(f.adapters.size(), 2u);
  const int64_t copies = st.upload_timing().from_image;
  const std::vector<unsigned char> staged = slot_bytes(st, f.config, 0);
  st.clear(0);
  st.wait_host_images();
  EXPECT_EQ(st.host_images(), 1);
  upload(st, 0, f.adapters[1]);  // slot 0 as slot 1: adapter 1's weights
  ASSERT_NE(slot_bytes(st, f.config, 0), staged);
  upload(st, 0, f.adapters[0]);  // out of its image
  EXPECT_EQ(st.upload_timing().from_image, copies + 1);
  // The same adapter over the same previous one by the staging path (images off) writes the same bytes
  // (regions an adapter does not adapt keep the previous weights either way: its scales are 0 there).
  st.set_host_image_budget(0);
  upload(st, 1, f.adapters[0]);
  EXPECT_EQ(st.upload_timing().from_image, copies + 1);
  EXPECT_EQ(slot_bytes(st, f.config, 0), slot_bytes(st, f.config, 1));
}

TEST_P(LoraStacksImages, ImagesGoWithTheirAdapterAndLeastRecentlyUsedFirst) {
  Fixture f = load_fixture(GetParam());
  ASSERT_GE(f.adapters.size(), 2u);
  std::shared_ptr<LoraAdapter> front = f.adapters.front(), back = f.adapters.back();
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoraStacks st(*be, f.config);
  st.reserve(2, 16);
  st.set_host_image_budget(size_t{1} << 40);
  std::shared_ptr<LoraAdapter> a = load_fixture(GetParam()).adapters.front();
  upload(st, 0, a);
  upload(st, 0, front);  // `a` leaves: imaged
  ASSERT_EQ(st.host_images(), 1);
  ASSERT_GT(st.host_image_bytes(), 0u);
  // The adapter object is gone (unloaded, out of the host tier): its image is freed by the next upload.
  a.reset();
  upload(st, 1, back);
  EXPECT_EQ(st.host_images(), 0);
  EXPECT_EQ(st.host_image_bytes(), 0u);
  // A budget for the largest image: the least recently uploaded goes.
  size_t largest = 0;
  for (const auto& ad : f.adapters) {
    LoraStacks probe(*be, f.config);
    probe.reserve(1, 16);
    probe.set_host_image_budget(size_t{1} << 40);
    upload(probe, 0, ad);
    upload(probe, 0, load_fixture(GetParam()).adapters.front());
    largest = std::max(largest, probe.host_image_bytes());
  }
  st.set_host_image_budget(largest);  // room for one image
  upload(st, 0, back);                // `front` leaves slot 0: imaged
  EXPECT_EQ(st.host_images(), 1);
  const int64_t copies = from_image(st);
  upload(st, 1, front);  // out of its image; `back` leaves slot 1: imaged, `front`'s image makes room
  EXPECT_EQ(from_image(st), copies + 1);
  EXPECT_EQ(st.host_images(), 1);
  EXPECT_LE(st.host_image_bytes(), largest);
  const std::vector<unsigned char> staged_back = slot_bytes(st, f.config, 0);  // `back` by the staging path
  upload(st, 0, front);  // no image of `front` any more: the staging path; `back` leaves slot 0
  EXPECT_EQ(from_image(st), copies + 1);
  upload(st, 1, back);  // out of `back`'s image
  EXPECT_EQ(from_image(st), copies + 2);
  EXPECT_EQ(slot_bytes(st, f.config, 1), staged_back);
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
