"""The command line of every script: the configurator and the one boundary for user errors.

    cfg = parse_config(SETTINGS, sys.argv[1:], script=__file__)   # configs/*.py, then --key=value
    run_cli(main)                                                  # in `if __name__ == "__main__":`

A user error (bad input, not a bug) derives from `UserError`; `run_cli` turns it into one line,
`error: ...`, and exit status 2 (REPRLAB_TRACEBACK=1 shows the traceback).
"""
import ast
import contextlib
import json
import math
import os
import sys
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

from data.atomic import DiskFull, disk_full, free_space, write_text


class UserError(Exception):
    """Bad input that the message explains, with the fix: no traceback. `needs`: what of the environment is
    missing (the Hub, a file), so that experiments/runner.py stops the other jobs that need it."""
    needs = None


class ConfigError(UserError, ValueError):
    """A configuration that cannot work; the message names the key, the value and the fix."""


class UnknownConfigKey(ConfigError, KeyError):
    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


class ConfigTypeError(ConfigError, TypeError):
    pass


class MissingInput(UserError, FileNotFoundError):
    """A file or folder the user named does not exist; `path`: its name as the user wrote it (`needs`)."""
    def __init__(self, message, path=None):
        super().__init__(message)
        self.needs = None if path is None else str(path)


# Built-in errors that reach a script's main() from a path the user typed, and an explained full disk
OS_INPUT_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, DiskFull)


def where(path):
    """`path` as the user gave it, and where a relative one was looked for."""
    p = Path(path)
    return f"{str(path)!r}" if p.is_absolute() else f"{str(path)!r} (relative to the current directory {Path.cwd()})"


# ---- Configuration: a script's DEFAULTS, overridden by configs/*.py files and --key=value flags ----
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


def parse_config(defaults, argv: list[str], script=None, words=None) -> dict:
    """nanoGPT-style configurator, strict: `configs/x.py` files (their top-level names) and `--key=value`
    / `--key value` / `--flag` arguments, applied in order; --k-bias means --k_bias. Unknown keys, wrong
    types and a flag that a later config file would override are errors. `defaults`: a Settings (its
    rules checked), or a plain {key: default} with `words` ({key: words it takes besides its type, e.g.
    "auto"}). `-h` / `--help` prints the usage of `script` and every key."""
    table = defaults
    if isinstance(defaults, Settings):
        defaults, words = table.defaults, table.words
    if "-h" in argv or "--help" in argv:
        print(config_help(table, script))
        raise SystemExit(0)
    cfg, flags = dict(defaults), {}

    def set_key(key, value, where_from):
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
            key, value = key.replace("-", "_"), _literal(text)
            if isinstance(defaults.get(key), str) and not isinstance(value, str):
                value = text  # a word of a str key: 80_10_10 is not the number 801010, 1e3 not 1000.0
            set_key(key, value, f"command line {arg}")
            flags[key] = arg
        else:
            path = Path(arg)
            if not path.is_file():
                raise MissingInput(f"config file {where(arg)} does not exist (arguments are config files or "
                                  "--key=value; --help lists the keys)", path=arg)
            for key, value in config_file(path).items():
                if key in flags:
                    raise ConfigError(f"{flags[key]} comes before {arg}, which sets {key} again: later "
                                      f"arguments win, so the flag would be ignored; put config files first "
                                      f"(python {Path(script or 'train.py').name} {arg} {flags[key]})")
                set_key(key, value, str(path))
        i += 1
    if isinstance(table, Settings):
        check_values(cfg, table.rules)
    return cfg


def config_file(path) -> dict:
    """The top-level names a `configs/x.py` file sets (imported ones included; not _private, functions, modules)."""
    scope = {}
    try:
        exec(compile(Path(path).read_text(), str(path), "exec"), scope)
    except SyntaxError as e:
        raise ConfigError(f"config file {path}, line {e.lineno}: {e.msg}; fix that line (a config file is Python: "
                          "key = value, one per line)") from None
    return {key: value for key, value in scope.items()
            if not key.startswith("_") and not callable(value) and not isinstance(value, type(sys))}


def config_help(defaults, script=None) -> str:
    """The usage lines of `script`'s docstring, then its keys: from a Settings table (settings_help),
    or from the script's `DEFAULTS = dict(...)` as it stands in the file (comment lines as group
    titles, the comment beside a key as its help)."""
    table = defaults if isinstance(defaults, Settings) else None
    if table is not None:
        defaults = table.defaults
    if script is None:
        return "keys (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items())
    source = Path(script).read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    name = Path(script).name
    usage = [ln.strip() for ln in doc.splitlines() if ln.startswith("    ") and name in ln]
    out = [doc.split("\n\n")[0], "", "usage:"] + [f"  {u}" for u in usage]
    out += ["", "Every key can be set in a configs/*.py file or as --key=value (applied in order, later wins):"]
    if table is not None:
        return "\n".join(out + settings_help(table))
    call = next((node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "DEFAULTS" and isinstance(node.value, ast.Call)), None)
    if call is None:
        return "\n".join(out + [f"  --{k}={v!r}" for k, v in defaults.items()])
    lines = source.splitlines()
    keys_on = {}
    for kw in call.keywords:
        keys_on.setdefault(kw.lineno, []).append(kw.arg)
    indent = min(kw.value.col_offset - len(kw.arg) - 1 for kw in call.keywords)  # where a key's line starts
    for n in range(call.lineno + 1, call.end_lineno):
        text = lines[n - 1].strip()
        if text.startswith("#") and len(lines[n - 1]) - len(lines[n - 1].lstrip()) > indent and out[-1].startswith("  "):
            out[-1] += " " + text.lstrip("# ")   # a comment continued under its key's line
        elif text.startswith("#"):
            out += ["", text.lstrip("# ")]
        elif n in keys_on:
            comment = text.split("#", 1)[1].strip() if "#" in text else ""
            shown = ", ".join(f"--{k}={defaults[k]!r}" for k in keys_on[n] if k in defaults)
            out.append(f"  {shown:<40} {comment}".rstrip())
    return "\n".join(out)


def settings_help(table):
    """--help's lines for the keys of a Settings table (config_help)."""
    out = []
    for title, keys in table.groups:
        out += ["", title] if title else []
        shown = []
        for i, key in enumerate(keys):
            s, nxt = table[key], table[keys[i + 1]] if i + 1 < len(keys) else None
            shown.append(f"--{key}={s.default!r}")
            if (nxt is not None and s.rule.choices is None and nxt.rule.choices is None and nxt.help == s.help
                    and len(", ".join(shown + [f"--{keys[i + 1]}={nxt.default!r}"])) <= 100):
                continue  # keys of one help in a row: one line
            text = " | ".join(s.rule.choices) + (f": {s.help}" if s.help else "") if s.rule.choices else s.help
            out.append(f"  {', '.join(shown):<40} {text}".rstrip())
            shown = []
    kept = ", ".join(key for key in table if key in table.fixed)
    return out + [""] + textwrap.wrap(f"A resumed run keeps (refuses a change of): {kept}; the others may change, "
                                      "with a note.", 110)


def say(text, file=None):
    """A line on stderr (or `file`) from rank 0, clear of an open progress bar (tqdm.write)."""
    if int(os.environ.get("RANK", 0)) == 0:
        from tqdm import tqdm
        file = file or sys.stderr
        tqdm.write(text, file=file)
        file.flush()   # before the bar is drawn again on its own stream


# ---- What each key accepts (a script's VALID: {key: Rule}) ---------------------------------------
class Rule:
    """What a config key accepts: `problem(value)` (None, or what it should be), `bad` values, `choices`."""
    def __init__(self, problem, bad=(), choices=None):
        self.problem, self.bad, self.choices = problem, tuple(bad), choices


def _but(text, hint):
    return f"{text} ({hint})" if hint else text


def one_of(table, hint=""):
    """A key that names an entry of `table` (a dict of formulas or a tuple of names, read when checked)."""
    def problem(v):
        names = list(table)
        if isinstance(v, str) and v in names:
            return None
        use = " or ".join(map(repr, names)) if len(names) <= 2 else "one of " + ", ".join(map(repr, names))
        return _but(f"use {use}", hint)
    return Rule(problem, bad=("?",), choices=table)


def count(least, hint=""):
    """A whole number >= `least`: a number of steps, examples, layers; a divisor or a loop bound."""
    return Rule(lambda v: None if isinstance(v, int) and not isinstance(v, bool) and v >= least
                else _but(f"give a whole number >= {least}", hint), bad=(least - 1,))


def interval(text, hint=""):
    """A number in `text`, an interval as mathematics writes it: "[0, 1)", "(0, inf)"."""
    lo, hi = (float(x) for x in text[1:-1].split(","))
    open_lo, open_hi = text[0] == "(", text[-1] == ")"

    def inside(v):
        return (isinstance(v, (int, float)) and not isinstance(v, bool)
                and (lo < v if open_lo else lo <= v) and (v < hi if open_hi else v <= hi))
    bad = [x for x in (lo if open_lo else lo - 1, hi if open_hi else hi + 1) if math.isfinite(x)] + [math.nan]
    return Rule(lambda v: None if inside(v) else _but(f"give a number in {text}", hint), bad=bad)


def checked(*bad):
    """A key that the script's check_config checks with its own code; `bad`: values it refuses."""
    return Rule(lambda v: None, bad=bad)


ANY = Rule(lambda v: None)  # a key that takes any value of its default's type (a path, a switch, a seed)


# ---- A script's settings: one entry per key (default, rule, class on resume, help) ------------------


FIXED, FREE = "fixed", "free"  # on resume: kept from the checkpoint (a change is refused) | may change


@dataclass(frozen=True)
class Setting:
    """One key of a script: its default, its Rule, whether a resumed run may change it (FIXED: refused; FREE: said
    in a note), its --help text and `words` besides its type. A default of ...: each script gives its own."""
    default: object
    rule: Rule = ANY
    resume: str = FREE
    help: str = ""
    words: tuple = ()

    def given(self, default, help=None):
        """This setting with `default` (and another help text, if given)."""
        return replace(self, default=default, help=self.help if help is None else help)

    def each(self, **defaults):
        """{key: this setting with its default}: several keys of one kind, written once."""
        return {key: self.given(value) for key, value in defaults.items()}


def fixed(default, rule=ANY, help="", words=()):
    """A key that a resumed run keeps (Setting)."""
    return Setting(default, rule, FIXED, help, tuple(words))


def free(default, rule=ANY, help="", words=()):
    """A key that a resumed run may change, with a note (Setting)."""
    return Setting(default, rule, FREE, help, tuple(words))


class Settings(dict):
    """A script's settings, {key: Setting} in --help's order: `parts` are group titles and {key: Setting} dicts.
    Built whole, never changed after: its views (defaults, rules, fixed keys, words) are taken once."""
    def __init__(self, *parts):
        super().__init__()
        self.groups = []
        for part in parts:
            if isinstance(part, str) or not self.groups:
                self.groups.append((part if isinstance(part, str) else "", []))
            for key, setting in ({} if isinstance(part, str) else part).items():
                if (key in self or not isinstance(setting, Setting) or setting.default is ...
                        or setting.resume not in (FIXED, FREE)):
                    raise ValueError(f"setting {key!r}: declared twice, not a Setting (cli.fixed, cli.free), or "
                                     "without its default")
                self[key] = setting
                self.groups[-1][1].append(key)
        self.defaults = {key: s.default for key, s in self.items()}
        self.rules = {key: s.rule for key, s in self.items()}
        self.fixed = {key for key, s in self.items() if s.resume == FIXED}
        self.words = {key: s.words for key, s in self.items() if s.words}


def check_values(cfg, valid):
    """A ConfigError naming the key, the value and the fix for the first value its rule in `valid` refuses."""
    for key, rule in valid.items():
        if key in cfg and (why := rule.problem(cfg[key])) is not None:
            raise ConfigError(f"{key}={cfg[key]!r}: {why}")


# ---- The boundary: a user error becomes `error: ...` and exit status 2 ---------------------------
def run_cli(main, *args):
    """Run a script's main(*args). A UserError (or a missing file the user named, a full disk) prints
    `error: message` and exits with status 2; REPRLAB_TRACEBACK=1 re-raises it with its traceback.

    Under torchrun, rank 0 prints it and every rank writes it to torchrun's error file; the other
    ranks exit RANK_EXIT_DELAY_S later, so that torchrun's "Root Cause" (the earliest error file) is
    rank 0's. REPRLAB_ERROR_FILE (experiments/runner.py): the message and UserError.needs as JSON,
    so that the runner can stop the jobs that would fail the same way."""
    try:
        return main(*args)
    except (UserError, *OS_INPUT_ERRORS, OSError) as e:
        known = isinstance(e, (UserError, *OS_INPUT_ERRORS))
        if os.environ.get("REPRLAB_TRACEBACK") or not (known or disk_full(e)):
            raise
        # a full disk that no command explained: still one line, with the file and the space left
        where = getattr(e, "filename", None)   # unknown: no folder named rather than a guess
        where = f" of {where} ({free_space(where)} free)" if where else ""
        message = f"error: {e}" if known else (
            f"error: no space left on the device{where}: {e.strerror or e}. Free some space and run the same "
            "command again")
        rank = int(os.environ.get("RANK", 0))
        if rank == 0:
            from tqdm import tqdm
            for bar in list(getattr(tqdm, "_instances", ())):  # the bar as it stood, then the error below it
                bar.close()
            print(message, file=sys.stderr, flush=True)
        elif "TORCHELASTIC_ERROR_FILE" in os.environ:
            time.sleep(RANK_EXIT_DELAY_S)  # torchrun's root cause is the earliest error file's
        record = {"message": message, "timestamp": int(time.time())}
        for var, extra in (("TORCHELASTIC_ERROR_FILE", {}), ("REPRLAB_ERROR_FILE", {"needs": getattr(e, "needs", None)})):
            if os.environ.get(var):
                with contextlib.suppress(OSError):  # every rank may write it: a whole file replaces another
                    write_text(os.environ[var], json.dumps({**record, **extra}), unique=True)
        raise SystemExit(2) from None


RANK_EXIT_DELAY_S = 5.0
