// bench/main.cc: the `polylora_bench` binary; dispatches to the registered benchmark subcommands.
// Must not: hold benchmark logic.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "bench_command.h"

namespace polylora::bench {
std::vector<BenchCommand>& bench_commands() {
  static std::vector<BenchCommand> all;
  return all;
}
}  // namespace polylora::bench

static void print_usage() {
  auto cmds = polylora::bench::bench_commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: polylora_bench <benchmark> [--json]\n\nbenchmarks:\n");
  for (const auto& c : cmds) std::fprintf(stderr, "  %-12s %s\n", c.name.c_str(), c.help.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& cmd : polylora::bench::bench_commands()) {
    if (cmd.name == argv[1]) {
      try {
        return cmd.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "polylora_bench %s: error: %s\n", argv[1], e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "polylora_bench: unknown benchmark '%s'\n\n", argv[1]);
  print_usage();
  return 2;
}
