// GPU test of model/lora_stacks' host images: on a BF16 CUDA backend an adapter copied out of its
// page-locked image (its second asynchronous upload with images on) leaves the same bytes in the device
// stacks as the staging path, for every adapter of a GPT-OSS and a Qwen3-MoE fixture.
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
    for (const auto& entry : fs::directory_iterator(dir / "adapters")) {
      std::shared_ptr<const LoraAdapter> a =
          load_peft_adapter(entry.path().string(), entry.path().filename().string(), config, LoraLimits{});
      SCOPED_TRACE(a->name);
      st.set_host_image_budget(0);
      st.begin_upload(0, a);
      st.finish_upload(0);
      st.set_host_image_budget(size_t{1} << 36);
      const int64_t images = st.host_images();
      st.begin_upload(1, a);  // through the staging buffers; asks for the image
      st.finish_upload(1);
      st.wait_host_images();
      EXPECT_EQ(st.host_images(), images + 1);
      st.begin_upload(2, a);  // out of the page-locked image
      st.finish_upload(2);
      EXPECT_EQ(st.host_images(), images + 1);
      const std::vector<unsigned char> s0 = device_slot_bytes(be, st, config, 0);
      EXPECT_EQ(device_slot_bytes(be, st, config, 1), s0);
      EXPECT_EQ(device_slot_bytes(be, st, config, 2), s0);
      EXPECT_NE(device_slot_bytes(be, st, config, 3), s0) << "slot 3, never written, differs";
    }
  }
}

}  // namespace
}  // namespace polylora
