// The kvtier tool's subcommands. Each returns the process exit code: 0 on success, 1 when the
// work failed, 2 for bad arguments.
#ifndef KVTIER_EXAMPLES_KVTIER_COMMANDS_H_
#define KVTIER_EXAMPLES_KVTIER_COMMANDS_H_

#include <optional>

namespace kvtier::tool {

// For a command that takes no options (argv[1..argc)): nullopt when there are none; else its
// usage line ("usage: kvtier COMMAND" and `what`) and 0 after --help or -h, or 2 after anything
// else (named on stderr).
std::optional<int> RefuseOptions(const char* command, const char* what, int argc, char** argv);

int RunDemo(int argc, char** argv);
int RunFormats(int argc, char** argv);
int RunSimulate(int argc, char** argv);
int RunRecall(int argc, char** argv);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_COMMANDS_H_
