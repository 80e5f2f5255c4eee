// apps/backend_flags.h: turns the --device and --dtype flags into BackendOptions (shared by subcommands).
#pragma once

#include <string>

#include "backend/backend.h"
#include "common/error.h"

namespace polylora::apps {

// device: auto | cpu | cuda (auto: cuda when a GPU is present); dtype: auto | bfloat16 | float32.
inline BackendOptions backend_options(const std::string& device, const std::string& dtype) {
  BackendOptions o;
  if (device == "cpu")
    o.device = DeviceKind::kCpu;
  else if (device == "cuda")
    o.device = DeviceKind::kCuda;
  else if (device == "auto")
    o.device = cuda_device_count() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  else
    fail("--device '{}': expected cpu, cuda or auto", device);
  if (dtype == "float32")
    o.weight_dtype = DType::kF32;
  else if (dtype == "bfloat16" || dtype == "auto")
    o.weight_dtype = DType::kBF16;
  else
    fail("--dtype '{}': expected auto, bfloat16 or float32", dtype);
  return o;
}

}  // namespace polylora::apps
