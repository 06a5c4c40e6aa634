// kvtier: the command-line tool. Subcommands:
//   kvtier demo        an end-to-end tour of the public API on the CPU backend
//   kvtier formats     measured error and bits per element of every format
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
               "  formats  measured error and bits per element of every format (Markdown)\n"
               "  help     this text\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "demo";
  if (command == "demo") return kvtier::tool::RunDemo(argc - 1, argv + 1);
  if (command == "formats") return kvtier::tool::RunFormats(argc - 1, argv + 1);
  if (command == "help" || command == "--help" || command == "-h") {
    Usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "kvtier: unknown command '%s'\n", command.c_str());
  Usage(stderr);
  return 2;
}
