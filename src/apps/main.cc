// apps/main.cc: the `polylora` binary; dispatches to the registered subcommands.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "apps/command.h"
#include "common/error.h"
#include "common/log.h"

namespace polylora::apps {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace polylora::apps

static void print_usage() {
  auto cmds = polylora::apps::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: polylora <command> [options]\n\ncommands:\n");
  for (const auto& c : cmds) std::fprintf(stderr, "  %-15s %s\n", c.name.c_str(), c.help.c_str());
  std::fprintf(stderr, "\n`polylora <command> --help` lists a command's options.\n");
}

int main(int argc, char** argv) {
  polylora::init_logging();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("polylora %s\n", POLYLORA_VERSION);
    return 0;
  }
  for (const auto& cmd : polylora::apps::commands()) {
    if (cmd.name == argv[1]) {
      try {
        return cmd.run(argc - 1, argv + 1);
      } catch (const polylora::Error& e) {
        std::fprintf(stderr, "polylora %s: error: %s\n", argv[1], e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "polylora %s: unexpected error: %s\n", argv[1], e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "polylora: unknown command '%s'\n\n", argv[1]);
  print_usage();
  return 2;
}
