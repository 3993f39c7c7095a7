// Starting the monitored command and passing signals to it.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "fullburn/status.h"

namespace fullburn::cli {

// Installs handlers that forward SIGINT, SIGTERM, SIGHUP and SIGQUIT to the
// children. A signal the terminal already sent to the whole foreground group
// (Ctrl-C) is not sent twice.
void InstallSignalForwarding();

// Starts argv[0] (searched in PATH) with fullburn's stdin, stdout and stderr.
// The child gets SIGTERM if fullburn dies, so it is never orphaned. Failure to
// start (not found, not executable) comes back as a Status naming the cause.
Result<pid_t> SpawnChild(const std::vector<std::string>& argv,
                         const std::vector<std::string>& extra_env);

// Waits for the child; returns its exit code, or 128 + signal if it was killed.
int WaitChild(pid_t pid);
// Waits for any started child: its pid and exit code (as WaitChild), or -1
// when none is left.
std::pair<pid_t, int> WaitAnyChild();
// Sends `sig` to every started child still running.
void SignalChildren(int sig);

}  // namespace fullburn::cli
