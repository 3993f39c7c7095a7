"""The `fullburn` command of a pip-installed fullburn: the console-script
entry point (pyproject.toml) replaces this process with the native program
inside the package, so signals, exit codes and the job's process tree are the
program's own. `python -m fullburn ARGS` does the same."""
import os
import shutil
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "fullburn")


def _shadowing_command():
    """The `fullburn` that PATH finds first when it is not this package's: a
    CMake-installed one in /usr/local/bin, another venv's. Typing `fullburn`
    in a shell runs that one, not this."""
    first = shutil.which("fullburn")
    if not first or not sys.argv or not sys.argv[0]:
        return None
    me = sys.argv[0]
    if os.path.basename(me) != "fullburn":  # python -m fullburn: no script of ours to compare
        me = os.path.join(os.path.dirname(sys.executable), "fullburn")
        if not os.path.exists(me):
            return None
    if os.path.realpath(first) in (os.path.realpath(me), os.path.realpath(_BIN)):
        return None
    return first, me


def main():
    if not os.access(_BIN, os.X_OK):
        sys.stderr.write(
            "fullburn: the program %s is missing or not executable: reinstall with "
            "pip install --force-reinstall fullburn\n" % _BIN)
        return 1
    shadow = _shadowing_command()
    if shadow and sys.argv[1:2] in (["version"], ["--version"]):
        first, me = shadow
        sys.stderr.write(
            "fullburn: note: `fullburn` on PATH is %s, not this one (%s): put %s first on PATH "
            "or remove the other\n" % (first, me, os.path.dirname(me) or "."))
    argv = ["fullburn"] + sys.argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(_BIN, argv)
    except OSError as e:
        sys.stderr.write("fullburn: cannot start %s: %s\n" % (_BIN, e.strerror))
        return 1
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
