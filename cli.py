"""The command line of every script: the configurator and the one boundary for user errors.

    cfg = parse_config(DEFAULTS, sys.argv[1:], script=__file__)   # configs/*.py, then --key=value
    run_cli(main)                                                  # in `if __name__ == "__main__":`

A user error is bad input, not a bug: a key with a wrong value, a missing file, an unreachable Hub.
Every such error class of the project derives from `UserError` (and, where it helps callers, from
the built-in class it refines: ConfigError is a ValueError). `run_cli` turns it into one line,
`error: ...`, and exit status 2; a traceback is for bugs (REPRLAB_TRACEBACK=1 shows it anyway).
This module imports nothing of the project, so any module can import it.
"""
import ast
import json
import os
import sys
import time
from pathlib import Path


class UserError(Exception):
    """Bad input that the message explains, with the fix: no traceback. `needs`: what of the
    environment is missing, when that is the cause (the Hub, a file): experiments/runner.py then
    stops the other jobs that need it."""
    needs = None


class ConfigError(UserError, ValueError):
    """A configuration that cannot work; the message names the key, the value and the fix."""


class UnknownConfigKey(ConfigError, KeyError):
    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


class ConfigTypeError(ConfigError, TypeError):
    pass


class MissingInput(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or is not what it should be); `path`, when
    given, is its name as the user wrote it (`needs`)."""

    def __init__(self, message, path=None):
        super().__init__(message)
        self.needs = None if path is None else str(path)


# Built-in errors that reach a script's main() almost always from a path the user typed
OS_INPUT_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError)


def where(path):
    """`path` as the user gave it, and where a relative one was looked for."""
    p = Path(path)
    return f"{str(path)!r}" if p.is_absolute() else f"{str(path)!r} (relative to the current directory {Path.cwd()})"


# ------------------------------------------------------------------------------------------------
# Configuration: a script's DEFAULTS, overridden by configs/*.py files and --key=value flags
# ------------------------------------------------------------------------------------------------


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as hf:org/name or cosine


def _coerce(key, value, default):
    """Check that `value` fits the type of the default; ints are accepted where floats are expected."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    elif isinstance(default, str) and isinstance(value, (str, int, float)):
        return str(value)
    elif isinstance(value, type(default)):
        return value
    raise ConfigTypeError(f"config key {key!r}: expected {type(default).__name__} (default {default!r}), "
                          f"got {type(value).__name__} {value!r}")


def parse_config(defaults: dict, argv: list[str], script=None, words=None) -> dict:
    """nanoGPT-style configurator, strict: `configs/x.py` files (executed, their top-level names
    become overrides) and `--key=value` / `--key value` / `--flag` arguments, applied in order.
    Dashes in keys mean underscores (--k-bias == --k_bias). Unknown keys and wrong types are errors
    that list the valid keys, and so is a flag that a later config file would silently override.
    `words`: {key: (word, ...)}, words a key takes besides values of its default's type (a number
    key that may also say "auto", say); the script gives each its meaning.
    `-h` / `--help` prints the usage of `script` and every key with its default and comment."""
    if "-h" in argv or "--help" in argv:
        print(config_help(defaults, script))
        raise SystemExit(0)
    cfg, flags = dict(defaults), {}

    def set_key(key, value, where_from):
        key = key.replace("-", "_")
        if key not in cfg:
            valid = ", ".join(sorted(cfg))
            raise UnknownConfigKey(f"unknown config key {key!r} (from {where_from}). Valid keys: {valid}; "
                                   "--help lists them with their defaults")
        allowed = (words or {}).get(key, ())
        if isinstance(value, str) and value in allowed:
            cfg[key] = value
            return
        try:
            cfg[key] = _coerce(key, value, defaults[key])
        except ConfigTypeError as e:
            if not allowed:
                raise
            raise ConfigTypeError(f"{e}; or one of: {', '.join(allowed)}") from None

    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, text = arg[2:].split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                key, text = arg[2:], argv[i + 1]
                i += 1
            else:
                key, text = arg[2:], "True"  # a bare flag
            set_key(key, _literal(text), f"command line {arg}")
            flags[key.replace("-", "_")] = arg
        else:
            path = Path(arg)
            if not path.is_file():
                raise MissingInput(f"config file {where(arg)} does not exist (arguments are config files or "
                                  "--key=value; --help lists the keys)", path=arg)
            scope = {}
            exec(compile(path.read_text(), str(path), "exec"), scope)
            for key, value in scope.items():
                if not key.startswith("_") and not callable(value) and not isinstance(value, type(sys)):
                    if key in flags:
                        raise ConfigError(f"{flags[key]} comes before {arg}, which sets {key} again: later "
                                          f"arguments win, so the flag would be ignored; put config files first "
                                          f"(python {Path(script or 'train.py').name} {arg} {flags[key]})")
                    set_key(key, value, str(path))
        i += 1
    return cfg


def config_help(defaults: dict, script=None) -> str:
    """The usage lines of `script`'s docstring, then the keys of its `DEFAULTS = dict(...)` as they
    stand in the file: comment lines as group titles, each line's keys with their defaults and the
    comment written beside them. A script without DEFAULTS gets its docstring and the key list."""
    if script is None:
        return "keys (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items())
    source = Path(script).read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    name = Path(script).name
    usage = [ln.strip() for ln in doc.splitlines() if ln.startswith("    ") and name in ln]
    out = [doc.split("\n\n")[0], "", "usage:"] + [f"  {u}" for u in usage]
    out += ["", "Every key can be set in a configs/*.py file or as --key=value (applied in order, later wins):"]
    call = next((node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "DEFAULTS" and isinstance(node.value, ast.Call)), None)
    if call is None:
        return "\n".join(out + [f"  --{k}={v!r}" for k, v in defaults.items()])
    lines = source.splitlines()
    keys_on = {}
    for kw in call.keywords:
        keys_on.setdefault(kw.lineno, []).append(kw.arg)
    for n in range(call.lineno + 1, call.end_lineno):
        text = lines[n - 1].strip()
        if text.startswith("#"):
            out += ["", text.lstrip("# ")]
        elif n in keys_on:
            comment = text.split("#", 1)[1].strip() if "#" in text else ""
            shown = ", ".join(f"--{k}={defaults[k]!r}" for k in keys_on[n] if k in defaults)
            out.append(f"  {shown:<40} {comment}".rstrip())
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# The boundary: a user error becomes `error: ...` and exit status 2
# ------------------------------------------------------------------------------------------------


def run_cli(main, *args):
    """Run a script's main(*args). A UserError (or a missing file the user named) prints
    `error: message` and exits with status 2; REPRLAB_TRACEBACK=1 re-raises it with its traceback.

    Under torchrun every rank usually meets the same error: rank 0 prints it, the others stay
    quiet, and each rank also writes it to torchrun's error file, so that torchrun's summary names
    the first failure once (a rank-specific error included). torchrun itself then exits with 1
    (it always does when a worker fails); the workers' status, 2, is in its summary. The other
    ranks write their file and exit RANK_EXIT_DELAY_S later: torchrun stops every worker when the
    first one ends (a rank 1 ending first could kill rank 0 before it printed) and names the
    earliest error file the root cause. So the line is the first thing rank 0 prints, and the
    "Root Cause" block that ends torchrun's summary is rank 0's, with the same line.

    REPRLAB_ERROR_FILE (set by experiments/runner.py for each job): the message and what of the
    environment it needs (UserError.needs), as JSON, so that the runner can stop the jobs that
    would fail the same way."""
    try:
        return main(*args)
    except (UserError, *OS_INPUT_ERRORS) as e:
        if os.environ.get("REPRLAB_TRACEBACK"):
            raise
        message, rank = f"error: {e}", int(os.environ.get("RANK", 0))
        if rank == 0:
            print(message, file=sys.stderr, flush=True)
        elif "TORCHELASTIC_ERROR_FILE" in os.environ:
            time.sleep(RANK_EXIT_DELAY_S)  # torchrun's root cause is the earliest error file's
        record = {"message": message, "timestamp": int(time.time())}
        for var, extra in (("TORCHELASTIC_ERROR_FILE", {}), ("REPRLAB_ERROR_FILE", {"needs": getattr(e, "needs", None)})):
            if os.environ.get(var):
                try:  # every rank may write it: a whole file replaces another, never a mix of two
                    tmp = Path(f"{os.environ[var]}.{os.getpid()}.tmp")
                    tmp.write_text(json.dumps({**record, **extra}))
                    os.replace(tmp, os.environ[var])
                except OSError:
                    pass
        raise SystemExit(2) from None


RANK_EXIT_DELAY_S = 5.0
