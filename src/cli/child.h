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

// Starts argv[0] (searched in PATH) with fullburn's stdin, stdout and stderr
// (stdout and stderr into `output_path` instead, when given: fullburn tune's
// trial logs). The child gets SIGTERM if fullburn dies, so it is never
// orphaned. Failure to start (not found, not executable, the log cannot be
// written) comes back as a Status naming the cause.
Result<pid_t> SpawnChild(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                         const std::string& output_path = "");

// The last signal the forwarding handlers saw (0: none), including one the
// terminal sent to the whole group: fullburn tune stops after its trial.
int ReceivedSignal();

// Waits for the child; returns its exit code, or 128 + signal if it was killed.
int WaitChild(pid_t pid);
// As WaitChild, but after `timeout_s` the child gets SIGTERM (and SIGKILL 10 s
// later); *timed_out says whether that happened.
int WaitChildFor(pid_t pid, double timeout_s, bool* timed_out);
// Waits for any started child: its pid and exit code (as WaitChild), or -1
// when none is left.
std::pair<pid_t, int> WaitAnyChild();
// Sends `sig` to every started child still running.
void SignalChildren(int sig);

// Makes this process the reaper of its orphaned descendants
// (PR_SET_CHILD_SUBREAPER): a job's worker whose parent exits becomes this
// process's child, so it stays in the job's tree and can be ended with it.
void BecomeSubreaper();

// The processes below this one, nearest first (read from /proc).
std::vector<pid_t> Descendants();

// What EndLeftovers did: processes sent SIGTERM, and those of them (or of
// their children) still alive after the wait, sent SIGKILL.
struct Leftovers {
  int terminated = 0, killed = 0;
};
// Ends every process still below this one once the job's main process is
// gone, as srun ends a job step: SIGTERM to each, up to `kill_wait_s` for
// them to exit, then SIGKILL, reaping each. Without it, orphaned DataLoader
// workers blocked on a full queue can hold a GPU's memory for hours.
Leftovers EndLeftovers(double kill_wait_s);

// A helper of fullburn's own beside the job (fullburn-net's mlflow-follow),
// in a process group of its own: a terminal's Ctrl-C, the signals fullburn
// passes on and EndLeftovers all leave it alone, and it outlives a
// fullburn that is killed. Its output is fullburn's.
Result<pid_t> SpawnHelper(const std::vector<std::string>& argv);
// Waits up to `timeout_s` for the helper to exit; then SIGTERM and up to 5 s
// more, then SIGKILL. True when it exited within `timeout_s` with code 0.
bool WaitHelper(pid_t pid, double timeout_s);

}  // namespace fullburn::cli
