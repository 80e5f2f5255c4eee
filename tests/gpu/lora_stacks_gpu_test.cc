// GPU test of model/lora_stacks' host images: on a BF16 CUDA backend an adapter copied out of its host
// image (made when it left a slot) leaves the same bytes in the device stacks as the staging path, for
// every adapter of a GPT-OSS and a Qwen3-MoE fixture.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/dtype.h"
#include "config/model_config.h"
#include "gpu/gpu_test_util.h"
#include "lora/adapter.h"
#include "model/lora_stacks.h"
#include "unit/model/lora_stacks_test_util.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;

std::vector<unsigned char> device_slot_bytes(Backend& be, const LoraStacks& st, const ModelConfig& c,
                                             int32_t slot) {
  return testing_util::lora_slot_bytes(
      st, c, slot, [&](void* dst, const void* src, size_t n) { be.copy_to_host(dst, src, n); });
}

TEST(LoraStacksGpu, ImageUploadsEqualTheStagingPath) {
  SKIP_WITHOUT_GPU();
  Backend& be = gpu_test::backend(DType::kBF16);
  for (const std::string model : {"gpt-oss-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(model);
    const fs::path dir = fs::path(testing_util::data_dir()) / "models" / model;
    const ModelConfig config = ModelConfig::from_file((dir / "config.json").string());
    LoraStacks st(be, config);
    EXPECT_GT(st.host_image_budget(), 0u) << "images are on by default on CUDA";
    ASSERT_EQ(st.dtype(), DType::kBF16);
    st.reserve(4, 16);
    auto load = [&](const fs::path& path) {
      return std::shared_ptr<const LoraAdapter>(
          load_peft_adapter(path.string(), path.filename().string(), config, LoraLimits{}));
    };
    // Takes slot 1 from each adapter in turn (never imaged: it leaves with images off).
    std::shared_ptr<const LoraAdapter> filler = load(fs::directory_iterator(dir / "adapters")->path());
    auto upload = [&](int32_t slot, std::shared_ptr<const LoraAdapter> a) {
      st.begin_upload(slot, std::move(a));
      st.finish_upload(slot);
      st.wait_host_images();
    };
    for (const auto& entry : fs::directory_iterator(dir / "adapters")) {
      std::shared_ptr<const LoraAdapter> a = load(entry.path());
      SCOPED_TRACE(a->name);
      st.set_host_image_budget(0);
      upload(0, a);  // the staging path
      upload(1, a);
      st.set_host_image_budget(size_t{1} << 36);
      const int64_t images = st.host_images(), copies = st.upload_timing().from_image;
      upload(1, filler);  // `a` leaves slot 1: its image is built
      EXPECT_EQ(st.host_images(), images + 1);
      upload(2, a);  // out of the image
      EXPECT_EQ(st.upload_timing().from_image, copies + 1);
      const std::vector<unsigned char> s0 = device_slot_bytes(be, st, config, 0);
      EXPECT_EQ(device_slot_bytes(be, st, config, 2), s0);
      EXPECT_NE(device_slot_bytes(be, st, config, 3), s0) << "slot 3, never written, differs";
      st.set_host_image_budget(0);
      upload(1, a);  // the filler leaves with images off
    }
  }
}

}  // namespace
}  // namespace polylora
