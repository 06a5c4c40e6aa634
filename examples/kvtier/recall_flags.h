// The command line of `kvtier recall`: its flags (`kvtier recall --help` lists them) parsed
// into sweep options, with the defaults of a full or a --quick sweep applied.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_FLAGS_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_FLAGS_H_

#include <optional>
#include <string>

#include "examples/kvtier/recall_sweep.h"

namespace kvtier::tool {

struct RecallFlags {
  // The sweep asked for: the chosen arms (default: all), and contexts, trials and bisection
  // steps resolved (given, else the --quick or the full sweep's defaults). The generator's
  // dump and queries are not set: the caller loads the files named below.
  SweepOptions sweep;
  bool contexts_given = false;  // --contexts was given (else a dump may shorten the grid)
  bool arms_given = false;      // --arm or --policy was given (else the standard arms)
  std::string json_path;        // "": no JSON
  std::string plots_dir;        // "": no plots
  std::string k_npy, v_npy;     // both or neither; "": the synthetic haystack
  std::string queries_npy;      // "": synthetic queries; only with k_npy and v_npy
  int npy_layer = 0;            // only with k_npy and v_npy
};

// Parses argv[1..argc) into `flags`. Returns the exit code when the command ends here: 0 after
// --help or --list-arms (printed on stdout), 2 after a bad flag (see RecallBadFlag); nullopt
// when the sweep should run.
std::optional<int> ParseRecallFlags(int argc, char** argv, RecallFlags* flags);

// Prints "kvtier recall: <why>" and the usage on stderr; returns 2, the exit code for bad
// arguments.
int RecallBadFlag(const std::string& why);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_FLAGS_H_
