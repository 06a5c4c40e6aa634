// kvtier: the command-line tool. Subcommands:
//   kvtier simulate    replay a serving workload under a policy (the default)
//   kvtier recall      find where recall degrades, per format and policy
//   kvtier formats     measured error and bits per element of every format
//   kvtier demo        an end-to-end tour of the public API on the CPU backend
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "examples/kvtier/commands.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kvtier <command> [options]\n"
               "commands:\n"
               "  simulate  replay a serving workload under a precision policy (default)\n"
               "  recall    find where recall degrades, per format and policy\n"
               "  formats   measured error and bits per element of every format (Markdown)\n"
               "  demo      an end-to-end tour of the public API on the CPU backend\n"
               "  help      this text\n"
               "Run 'kvtier <command> --help' for a command's options.\n");
}

}  // namespace

namespace kvtier::tool {

std::optional<int> RefuseOptions(const char* command, const char* what, int argc, char** argv) {
  if (argc <= 1) return std::nullopt;
  const std::string first = argv[1];
  const bool help = first == "--help" || first == "-h";
  if (!help) std::fprintf(stderr, "kvtier %s: unknown option '%s'\n", command, first.c_str());
  std::fprintf(help ? stdout : stderr, "usage: kvtier %s\n  %s (no options)\n", command, what);
  return help ? 0 : 2;
}

}  // namespace kvtier::tool

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "simulate";
  if (command == "simulate") return kvtier::tool::RunSimulate(argc - 1, argv + 1);
  const bool option = command.size() > 1 && command[0] == '-' && command != "--help" &&
                      command != "-h";
  if (option) return kvtier::tool::RunSimulate(argc, argv);  // the default command's options
  if (command == "demo") return kvtier::tool::RunDemo(argc - 1, argv + 1);
  if (command == "formats") return kvtier::tool::RunFormats(argc - 1, argv + 1);
  if (command == "recall") return kvtier::tool::RunRecall(argc - 1, argv + 1);
  if (command == "help" || command == "--help" || command == "-h") {
    Usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "kvtier: unknown command '%s'\n", command.c_str());
  Usage(stderr);
  return 2;
}
