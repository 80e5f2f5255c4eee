// tests/fuzz/replay_main.cc: runs a libFuzzer target without libFuzzer, so every fuzz target is built
// and exercised by ctest: the files of tests/fuzz/corpus/<target>/ (when present), then N random inputs
// (mutations of those files and random bytes), deterministic by seed. A crash fails the test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 1000;
  std::vector<std::vector<uint8_t>> seeds;
  std::string self = std::filesystem::path(argv[0]).filename().string();
  std::string target = self.substr(self.find('_') + 1);  // replay_<target>
  std::filesystem::path corpus = std::filesystem::path(POLYLORA_FUZZ_CORPUS) / target;
  if (std::filesystem::is_directory(corpus)) {
    for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
      std::ifstream in(entry.path(), std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
  std::mt19937_64 rng(12345);
  for (int i = 0; i < iterations; ++i) {
    std::vector<uint8_t> input;
    if (!seeds.empty() && (rng() % 4) != 0) {
      input = seeds[rng() % seeds.size()];
      int edits = 1 + static_cast<int>(rng() % 8);
      for (int e = 0; e < edits && !input.empty(); ++e) {
        size_t pos = rng() % input.size();
        switch (rng() % 4) {
          case 0:
            input[pos] = static_cast<uint8_t>(rng());
            break;
          case 1:
            input.erase(input.begin() + static_cast<long>(pos));
            break;
          case 2:
            input.insert(input.begin() + static_cast<long>(pos), static_cast<uint8_t>(rng()));
            break;
          default:
            input.resize(pos);
            break;
        }
      }
    } else {
      input.resize(rng() % 256);
      for (auto& b : input) b = static_cast<uint8_t>(rng());
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("%s: %zu corpus inputs and %d random inputs ran without a crash\n", target.c_str(),
              seeds.size(), iterations);
  return 0;
}
