// runtime/cuda/device_query.cu: how many CUDA devices the driver reports (0 when none or no driver).
#include <cuda_runtime.h>

namespace polylora {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

}  // namespace polylora
