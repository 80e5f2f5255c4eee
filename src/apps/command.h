// apps/command.h: registry of the `polylora <subcommand>` entry points.
// Each cmd_*.cc file registers one subcommand with a static Registrar; main() dispatches.
// Must not: hold logic beyond turning flags into calls of the layers below.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace polylora::apps {

// argv[0] is the subcommand name; returns the process exit code.
using CommandFn = std::function<int(int argc, char** argv)>;

struct Command {
  std::string name;
  std::string help;
  CommandFn run;
};

std::vector<Command>& commands();

struct Registrar {
  Registrar(std::string name, std::string help, CommandFn run) {
    commands().push_back({std::move(name), std::move(help), std::move(run)});
  }
};

}  // namespace polylora::apps
