"""Reading `#SBATCH` directives from a batch script, as sbatch does."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions
from phalanx.jobspec.wording import did_you_mean


@dataclass(frozen=True)
class _Option:
    long: str
    short: str | None
    field: str | None  # SubmitOptions field; None: a Slurm option Phalanx does not support
    takes_value: bool
    flag_value: bool | None = None  # what a flag sets its field to


def _value(long: str, field: str, short: str | None = None) -> _Option:
    return _Option(long, short, field, True)


def _flag(long: str, field: str, value: bool, short: str | None = None) -> _Option:
    return _Option(long, short, field, False, value)


_SUPPORTED = [
    _value("job-name", "job_name", "J"),
    _value("nodes", "nodes", "N"),
    _value("ntasks", "ntasks", "n"),
    _value("ntasks-per-node", "ntasks_per_node"),
    _value("gres", "gres"),
    _value("gpus", "gpus", "G"),
    _value("gpus-per-node", "gpus_per_node"),
    _value("gpus-per-task", "gpus_per_task"),
    _value("cpus-per-task", "cpus_per_task", "c"),
    _value("mem", "mem"),
    _value("time", "time", "t"),
    _value("partition", "partition", "p"),
    _value("qos", "qos", "q"),
    _value("account", "account", "A"),
    _value("output", "output", "o"),
    _value("error", "error", "e"),
    _value("dependency", "dependency", "d"),
    _value("array", "array", "a"),
    _flag("requeue", "requeue", True),
    _flag("no-requeue", "requeue", False),
    _value("signal", "signal"),
    _flag("exclusive", "exclusive", True),
    _flag("oversubscribe", "exclusive", False, "s"),
    _value("chdir", "workdir", "D"),
    _value("workdir", "workdir"),  # the name of --chdir before Slurm 17.11
    _value("export", "export"),
    _value("constraint", "constraint", "C"),
    _value("exclude", "exclude", "x"),
    _value("nodelist", "nodelist", "w"),
    _value("begin", "begin", "b"),
    _value("launcher", "launcher"),  # Phalanx's own
    _value("max-restarts", "max_restarts"),  # Phalanx's own, as are the ones below
    _flag("restart-on-failure", "restart_on_failure", True),
    _flag("no-restart-on-failure", "restart_on_failure", False),
    _value("checkpoint-dir", "checkpoint_dir"),
    _value("preempt-signal", "preempt_signal"),
    _value("preempt-grace", "preempt_grace"),
    _value("hang-timeout", "hang_timeout"),
    _value("notify-url", "notify_url"),  # Phalanx's own: --mail-* map to it (jobspec/notify.py)
    _value("mail-type", "mail_type"),
    _value("mail-user", "mail_user"),
]
# Slurm options Phalanx does not honour: named here so that their value is skipped
# correctly and the warning says "not supported" rather than "unknown".
_UNSUPPORTED_WITH_VALUE = {
    "acctg-freq": None, "batch": None, "bb": None, "bbf": None,
    "cluster-constraint": None, "clusters": "M", "comment": None, "container": None,
    "container-id": None, "core-spec": "S", "cores-per-socket": None, "cpu-bind": None,
    "cpu-freq": None, "cpus-per-gpu": None, "deadline": None, "delay-boot": None,
    "distribution": "m", "export-file": None, "extra-node-info": "B", "gid": None,
    "gpu-bind": None, "gpu-freq": None, "gpus-per-socket": None, "gres-flags": None,
    "hint": None, "input": "i", "kill-on-invalid-dep": None, "licenses": "L",
    "mcs-label": None, "mem-bind": None, "mem-per-cpu": None, "mem-per-gpu": None,
    "mincpus": None, "network": None, "nodefile": "F",
    "ntasks-per-core": None, "ntasks-per-gpu": None, "ntasks-per-socket": None,
    "open-mode": None, "power": None, "prefer": None, "priority": None, "profile": None,
    "reservation": None, "segment": None, "sockets-per-node": None, "switches": None,
    "thread-spec": None, "threads-per-core": None, "time-min": None, "tmp": None,
    "tres-bind": None, "tres-per-task": None, "uid": None, "wait-all-nodes": None,
    "wckey": None, "wrap": None,
}  # fmt: skip
# Options whose argument is optional take it only as `--opt=value`, so they read as flags.
_UNSUPPORTED_FLAGS = {
    "contiguous": None, "get-user-env": None, "hold": "H", "ignore-pbs": None,
    "immediate": "I", "nice": None, "no-kill": "k", "overcommit": "O", "parsable": None,
    "propagate": None, "quiet": "Q", "reboot": None, "spread-job": None, "test-only": None,
    "use-min-nodes": None, "verbose": "v", "wait": "W", "help": "h", "usage": None,
    "version": "V",
}  # fmt: skip

_OPTIONS = [
    *_SUPPORTED,
    *(_Option(name, short, None, True) for name, short in _UNSUPPORTED_WITH_VALUE.items()),
    *(_Option(name, short, None, False) for name, short in _UNSUPPORTED_FLAGS.items()),
]
_BY_LONG = {opt.long: opt for opt in _OPTIONS}
_BY_SHORT = {opt.short: opt for opt in _OPTIONS if opt.short}
_DIRECTIVE = "#SBATCH"


def check_script(text: str) -> None:
    """Refuse a batch script file that sbatch refuses: one whose first line is not
    `#!INTERPRETER` ("This does not look like a batch script"), and a binary file, which
    would otherwise fail only when it ran (`cannot execute binary file`, exit 126).
    An empty script is left to build_spec, which says so."""
    if not text.strip():
        return
    if "\x00" in text:
        raise JobSpecError(
            "a binary file, not a batch script; to run a program, put it after --: "
            "phalanx submit [FLAGS] -- PROGRAM ARGS…"
        )
    if not text.startswith("#!"):
        first = text.splitlines()[0] if text.splitlines() else ""
        shown = first if len(first) <= 40 else first[:37] + "..."
        raise JobSpecError(
            f"not a batch script: its first line ({shown!r}) must start with #! and an "
            "interpreter, e.g. #!/bin/bash (as sbatch requires); to run a command, put it "
            "after --: phalanx submit [FLAGS] -- CMD ARGS…"
        )


def parse_sbatch(text: str) -> tuple[SubmitOptions, list[str]]:
    """Read the `#SBATCH` directives of a batch script into SubmitOptions.

    As sbatch, directives are read from the top until the first line that is neither blank
    nor a comment; later `#SBATCH` lines are ignored (with a warning). Both `--opt=value`
    and `--opt value`, short forms (`-J name`, `-Jname`, `-N 2`), several options per line
    and trailing `# comments` are understood; a later directive overrides an earlier one.
    Returns the options and one warning per directive that was not used, naming its line.
    Raises JobSpecError for a directive that cannot be read (a missing value, bad quotes).
    """
    opts = SubmitOptions()
    warnings: list[str] = []
    _parse_script(text, opts, warnings, Seen(frozenset(), {}, _BY_LONG, _BY_SHORT))
    return opts, warnings


def _parse_script(text: str, opts: SubmitOptions, warnings: list[str], seen: Seen) -> None:
    lines = text.splitlines()
    body_start = len(lines)
    for index, line in enumerate(lines):
        number = index + 1
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            body_start = index
            break
        if _is_directive(stripped) and not _is_directive(line):
            warnings.append(f"line {number}: an indented {_DIRECTIVE} is only a comment; ignored")
        elif _is_directive(line):
            _parse_line(line[len(_DIRECTIVE) :], number, opts, warnings, seen)
    for index in range(body_start, len(lines)):
        if _is_directive(lines[index]):
            warnings.append(
                f"line {index + 1}: {_DIRECTIVE} after the first command is ignored "
                "(as sbatch does); move it to the top of the script"
            )


def _is_directive(line: str) -> bool:
    rest = line[len(_DIRECTIVE) :]
    return line.startswith(_DIRECTIVE) and (not rest or rest[0].isspace())


def _parse_line(
    rest: str, number: int, opts: SubmitOptions, warnings: list[str], seen: Seen
) -> None:
    try:
        tokens = shlex.split(_strip_comment(rest))
    except ValueError as exc:
        raise JobSpecError(f"line {number}: cannot read {_DIRECTIVE} line: {exc}") from exc
    if tokens and tokens[0] == "hetjob":
        raise JobSpecError(f"line {number}: {HETJOB_REFUSAL}")
    _parse_tokens(tokens, f"line {number}: ", opts, warnings, seen, stop_at_argument=False)


@dataclass
class Seen:
    """The options a caller honours itself (long names, e.g. `parsable`, `wrap`), and the
    value of each one given (None for a flag); `by_long`/`by_short`: the option table."""

    handled: frozenset[str]
    values: dict[str, str | None]
    by_long: dict[str, _Option]
    by_short: dict[str, _Option]
    unknown: list[str] = field(default_factory=list)  # options neither sbatch nor Phalanx has


# Why heterogeneous jobs are refused (docs/slurm.md says the same): their components are
# separate allocations with their own sizes started together, and a Phalanx job is one
# gang of identical nodes; splitting one into several jobs would lose the gang start.
HETJOB_REFUSAL = (
    "heterogeneous jobs (hetjob, ':' between components) are not supported by Phalanx: a "
    "job is one gang of identical nodes; submit the components as separate jobs, or one "
    "job sized for the largest component"
)


def _parse_tokens(
    tokens: list[str],
    where: str,
    opts: SubmitOptions,
    warnings: list[str],
    seen: Seen,
    *,
    stop_at_argument: bool,
) -> list[str]:
    """Apply options from `tokens` to `opts`; returns the tokens not read (the script and
    its arguments, on a command line, when `stop_at_argument`). Options `seen.handled`
    names are recorded in `seen.values` instead: the caller honours them."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if stop_at_argument and (token == "-" or not token.startswith("-")):
            return tokens[i:]
        i += 1
        if stop_at_argument and token == "--":
            return tokens[i:]
        value: str | None
        if token.startswith("--") and len(token) > 2:
            name, eq, inline = token[2:].partition("=")
            value = inline if eq else None
            opt = _lookup_long(name, seen.by_long)
            if opt is None:
                label = f"--{name}"
                hint = did_you_mean(name, seen.by_long, prefix="--")
                if (
                    not stop_at_argument
                    and value is None
                    and i < len(tokens)
                    and not tokens[i].startswith("-")
                ):
                    label, i = f"{label} {tokens[i]}", i + 1
                warnings.append(f"{where}unknown option {label}{hint}; ignored")
                seen.unknown.append(f"--{name}")
                continue
            shown = f"--{opt.long}"
        elif token.startswith("-") and len(token) > 1 and token[1] != "-":
            opt = seen.by_short.get(token[1])
            value = token[2:] or None
            if opt is not None and value is not None and not opt.takes_value:
                # A cluster of flags (`-Hv`): this one, then the rest as their own token.
                tokens = [*tokens[:i], "-" + value, *tokens[i:]]
                value = None
            if opt is None:
                warnings.append(f"{where}unknown option {token}; ignored")
                seen.unknown.append(token[:2])
                continue
            shown = f"-{opt.short}/--{opt.long}"
        else:
            warnings.append(f"{where}unexpected argument {token!r}; ignored")
            continue
        if opt.takes_value and value is None:
            if i >= len(tokens):
                raise JobSpecError(f"{where}{shown} needs a value")
            value, i = tokens[i], i + 1
        if opt.long in seen.handled:
            seen.values[opt.long] = value
        elif opt.field is None:
            warnings.append(f"{where}{shown} is not supported by Phalanx; ignored")
        elif not opt.takes_value and value is not None:
            warnings.append(
                f"{where}{shown}={value} is not supported (only a plain {shown}); ignored"
            )
        else:
            setattr(opts, opt.field, value if opt.takes_value else opt.flag_value)
    return []


@dataclass
class CommandLine:
    """Options read from an sbatch command line or a script's `#SBATCH` lines."""

    opts: SubmitOptions
    warnings: list[str]
    seen: dict[str, str | None]  # the `handled` options given, by long name: their value
    arguments: list[str]  # command line: the script and its arguments (empty: none given)
    unknown: list[str]  # options no Slurm command has (`--frobnicate`), as given


def _seen(handled: frozenset[str], extra: Sequence[tuple[str, str | None, bool]] = ()) -> Seen:
    """The table for one parse: sbatch's options, with `extra` (long, short, takes a
    value) added or replacing sbatch's of the same name; every extra one is handled."""
    by_long = dict(_BY_LONG)
    by_short = dict(_BY_SHORT)
    for long, short, takes_value in extra:
        by_long[long] = _Option(long, short, None, takes_value)
        if short:
            by_short[short] = by_long[long]
    unknown = sorted(name for name in handled if name not in by_long)
    if unknown:
        raise ValueError(f"not sbatch options: {unknown}")
    return Seen(handled | {long for long, _, _ in extra}, {}, by_long, by_short)


def parse_sbatch_argv(
    argv: list[str],
    handled: frozenset[str] = frozenset(),
    extra: Sequence[tuple[str, str | None, bool]] = (),
) -> CommandLine:
    """Read an sbatch command line as sbatch does (getopt, stopping at the first argument,
    which is the script). Options named in `handled` (long names of options Phalanx does
    not turn into a JobSpec field, such as `parsable` or `wrap`) are returned in `seen`
    for the caller to honour instead of being warned about; so are `extra` options
    (long, short, takes a value) that sbatch lacks (srun's and salloc's own). A `:` after
    the options (a heterogeneous job) raises JobSpecError."""
    opts = SubmitOptions()
    warnings: list[str] = []
    seen = _seen(handled, extra)
    rest = _parse_tokens(list(argv), "", opts, warnings, seen, stop_at_argument=True)
    if rest[:1] == [":"]:
        raise JobSpecError(HETJOB_REFUSAL)
    return CommandLine(opts, warnings, seen.values, rest, seen.unknown)


def parse_sbatch_script(text: str, handled: frozenset[str] = frozenset()) -> CommandLine:
    """`parse_sbatch`, with the `handled` options of `parse_sbatch_argv` returned in
    `seen` rather than warned about."""
    opts = SubmitOptions()
    warnings: list[str] = []
    seen = _seen(handled)
    _parse_script(text, opts, warnings, seen)
    return CommandLine(opts, warnings, seen.values, [], seen.unknown)


def _strip_comment(rest: str) -> str:
    """Cut a trailing `# comment` as the shell would: a `#` starting a word, outside quotes.

    (shlex's own comment handling also cuts `--job-name=a#b` in the middle of a word.)
    """
    quote = ""
    escaped = False
    word_start = True  # after an unquoted, unescaped blank (or at the start)
    for index, char in enumerate(rest):
        at_start, word_start = word_start, False
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and at_start:
            return rest[:index]
        elif char.isspace():
            word_start = True
    return rest


def _lookup_long(name: str, by_long: dict[str, _Option]) -> _Option | None:
    """An exact long name, or an unambiguous prefix of one (getopt_long allows both)."""
    if name in by_long:
        return by_long[name]
    matches = [opt for long, opt in by_long.items() if long.startswith(name)]
    return matches[0] if len(matches) == 1 else None
