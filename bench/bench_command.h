// bench/bench_command.h: registry of the `polylora_bench <subcommand>` entry points (kernels, model, ...).
// Each *_bench.cc registers its subcommand with a static BenchRegistrar; bench/main.cc dispatches.
// Must not: hold benchmark logic.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace polylora::bench {

// argv[0] is the subcommand name; returns the process exit code.
using BenchFn = std::function<int(int argc, char** argv)>;

struct BenchCommand {
  std::string name;
  std::string help;
  BenchFn run;
};

std::vector<BenchCommand>& bench_commands();

struct BenchRegistrar {
  BenchRegistrar(std::string name, std::string help, BenchFn run) {
    bench_commands().push_back({std::move(name), std::move(help), std::move(run)});
  }
};

}  // namespace polylora::bench
