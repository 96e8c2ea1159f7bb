"""Node, task and GPU counts from Slurm's overlapping options, checked for agreement."""

from __future__ import annotations

import re
from dataclasses import dataclass

from phalanx.api.models import MAX_GPUS_PER_NODE, MAX_NODES
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions

_MODEL = re.compile(r"[A-Za-z0-9_.@+-]+")
# ASCII only: str.isdigit() also takes other scripts' digits. Bounded, so that conversion
# never fails, yet long enough that a number too large is told "at most N".
_NUMBER = re.compile(r"[0-9]{1,30}")


@dataclass(frozen=True)
class Resources:
    """What a job asks for on each of its nodes."""

    nodes: int
    ntasks_per_node: int | None
    gpus_per_node: int
    gpu_model: str | None


def parse_count(option: str, text: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number for `option`, within bounds, or a JobSpecError naming both."""
    raw = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,30}", raw):
        raise JobSpecError(f"{option}={text}: expected a whole number")
    value = int(raw)
    if value < minimum:
        raise JobSpecError(f"{option}={text}: must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise JobSpecError(f"{option}={text}: must be at most {maximum}")
    return value


def resolve(opts: SubmitOptions) -> Resources:
    """Nodes, tasks per node, GPUs per node and GPU model, from all the ways to say them."""
    nodes = _nodes(opts.nodes) if opts.nodes is not None else None
    nodes, per_node_tasks = _tasks(opts, nodes)
    gpus, model = _gpus(opts, nodes, per_node_tasks)
    return Resources(nodes, per_node_tasks, gpus, _model(opts.constraint, model))


def _nodes(text: str) -> int:
    span = re.fullmatch(r"\s*([0-9]{1,30})\s*-\s*([0-9]{1,30})\s*", text)
    if span is None:
        return parse_count("--nodes", text, maximum=MAX_NODES)
    if int(span.group(1)) != int(span.group(2)):
        raise JobSpecError(
            f"--nodes={text}: node count ranges (min-max) are not supported; give one count"
        )
    return parse_count("--nodes", span.group(1), maximum=MAX_NODES)


def _tasks(opts: SubmitOptions, nodes: int | None) -> tuple[int, int | None]:
    per_node = None
    if opts.ntasks_per_node is not None:
        per_node = parse_count("--ntasks-per-node", opts.ntasks_per_node, maximum=1024)
    if opts.ntasks is None:
        return nodes or 1, per_node
    total = parse_count("--ntasks", opts.ntasks)
    if per_node is not None:
        if nodes is None:
            if total % per_node:
                raise JobSpecError(
                    f"--ntasks={total} is not a multiple of --ntasks-per-node={per_node}"
                )
            return _check_nodes(total // per_node), per_node
        if total != nodes * per_node:
            raise JobSpecError(
                f"--ntasks={total} disagrees with --nodes={nodes} × "
                f"--ntasks-per-node={per_node}; give only two of them"
            )
        return nodes, per_node
    nodes = nodes or 1
    if total % nodes:
        raise JobSpecError(
            f"--ntasks={total} cannot be split evenly over --nodes={nodes}; Phalanx runs the "
            "same number of tasks on every node"
        )
    return nodes, total // nodes


def _check_nodes(nodes: int) -> int:
    if nodes > MAX_NODES:
        raise JobSpecError(f"the job needs {nodes} nodes; at most {MAX_NODES} are allowed")
    return nodes


def _gpus(opts: SubmitOptions, nodes: int, tasks: int | None) -> tuple[int, str | None]:
    asks: list[tuple[str, int]] = []  # (the option as given, GPUs per node it means)
    models: list[tuple[str, str]] = []
    if opts.gpus_per_node is not None:
        label = f"--gpus-per-node={opts.gpus_per_node}"
        asks.append((label, _typed_count(label, opts.gpus_per_node, models)))
    if opts.gres is not None:
        label = f"--gres={opts.gres}"
        asks.append((label, _gres(label, opts.gres, models)))
    if opts.gpus_per_task is not None:
        label = f"--gpus-per-task={opts.gpus_per_task}"
        per_task = _typed_count(label, opts.gpus_per_task, models)
        asks.append((f"{label} × {tasks or 1} task(s) per node", per_task * (tasks or 1)))
    if opts.gpus is not None:
        label = f"--gpus={opts.gpus}"
        total = _typed_count(label, opts.gpus, models)
        if total % nodes:
            raise JobSpecError(
                f"{label}: {total} GPUs cannot be split evenly over {nodes} nodes; use "
                "--gpus-per-node"
            )
        asks.append((f"{label} over {nodes} node(s)", total // nodes))
    if len({count for _, count in asks}) > 1:
        said = "; ".join(f"{label} means {count} per node" for label, count in asks)
        raise JobSpecError(f"conflicting GPU options: {said}; give only one")
    if len({model for _, model in models}) > 1:
        said = ", ".join(f"{label} asks for {model}" for label, model in models)
        raise JobSpecError(f"conflicting GPU models: {said}")
    count = asks[0][1] if asks else 1
    if count > MAX_GPUS_PER_NODE:
        raise JobSpecError(
            f"{asks[0][0]}: {count} GPUs per node; at most {MAX_GPUS_PER_NODE} are supported"
        )
    return count, models[0][1] if models else None


def _typed_count(label: str, text: str, models: list[tuple[str, str]]) -> int:
    """`N` or `type:N` (as --gpus-per-node=h100:8)."""
    parts = text.strip().split(":")
    if len(parts) > 2:
        raise JobSpecError(f"{label}: use N or TYPE:N, e.g. 8 or h100:8")
    if len(parts) == 2:
        models.append((label, _model_name(label, parts[0])))
    return _gpu_count(label, parts[-1])


def _gres(label: str, text: str, models: list[tuple[str, str]]) -> int:
    """`gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N`; other generic resources are refused."""
    entries = [entry.strip() for entry in text.split(",")]
    others = [entry for entry in entries if entry.split(":")[0] != "gpu"]
    if others:
        raise JobSpecError(
            f"{label}: only GPUs can be requested as generic resources in Phalanx "
            f"(not {', '.join(others)}); use gpu:N or gpu:TYPE:N"
        )
    if len(entries) > 1:
        raise JobSpecError(f"{label}: give the GPU request once, e.g. gpu:h100:4")
    parts = entries[0].split(":")[1:]
    if len(parts) > 2:
        raise JobSpecError(f"{label}: use gpu:N or gpu:TYPE:N, e.g. gpu:4 or gpu:h100:4")
    count = "1"  # Slurm: a gres without a count means one
    if parts and _NUMBER.fullmatch(parts[-1]):
        count = parts.pop()
    if parts:
        models.append((label, _model_name(label, parts[0])))
    return _gpu_count(label, count)


def _gpu_count(label: str, text: str) -> int:
    if not _NUMBER.fullmatch(text.strip()):
        raise JobSpecError(f"{label}: {text!r} is not a GPU count")
    count = int(text)
    if count < 1:
        raise JobSpecError(f"{label}: a Phalanx job needs at least 1 GPU per node")
    return count


def _model_name(label: str, name: str) -> str:
    if not _MODEL.fullmatch(name):
        raise JobSpecError(f"{label}: {name!r} is not a GPU model name (e.g. h100, a100)")
    return name


def _model(constraint: str | None, model: str | None) -> str | None:
    if constraint is None:
        return model
    wanted = constraint.strip()
    if not _MODEL.fullmatch(wanted):
        raise JobSpecError(
            f"--constraint={constraint}: only one feature, the GPU model, is supported "
            "(no &, |, [ ], * or counts), e.g. --constraint=h100"
        )
    if model is not None and model != wanted:
        raise JobSpecError(f"--constraint={constraint} conflicts with the GPU model {model!r}")
    return wanted
