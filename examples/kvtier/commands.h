// The kvtier tool's subcommands. Each returns the process exit code: 0 on success, 1 when the
// work failed, 2 for bad arguments.
#ifndef KVTIER_EXAMPLES_KVTIER_COMMANDS_H_
#define KVTIER_EXAMPLES_KVTIER_COMMANDS_H_

namespace kvtier::tool {

int RunDemo(int argc, char** argv);
int RunFormats(int argc, char** argv);
int RunSimulate(int argc, char** argv);
int RunRecall(int argc, char** argv);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_COMMANDS_H_
