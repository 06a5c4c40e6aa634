// kvtier: the command-line tool. Subcommands:
//   kvtier demo        an end-to-end tour of the public API on the CPU backend
#include <cstdio>
#include <cstring>
#include <string>

#include "examples/kvtier/commands.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kvtier <command> [options]\n"
               "commands:\n"
               "  demo     an end-to-end tour of the public API on the CPU backend\n"
               "  help     this text\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "demo";
  if (command == "demo") return kvtier::tool::RunDemo(argc - 1, argv + 1);
  if (command == "help" || command == "--help" || command == "-h") {
    Usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "kvtier: unknown command '%s'\n", command.c_str());
  Usage(stderr);
  return 2;
}
