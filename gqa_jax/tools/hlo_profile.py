"""A compiled program's HLO joined with a ``jax.profiler`` trace of it: the instructions
(:func:`parse_hlo`), the bytes each reads (:func:`input_bytes`), the trace's op events
(:func:`op_events`) and the decode loop body's ops timed and grouped (:func:`breakdown`):

  ms / step   summed durations of the group's ops / steps (XLA's threads may run ops side by side)
  MB / step   bytes of the ops' inputs by their HLO shapes; an in-place cache write (scatter,
              dynamic-update-slice) counts the update, not the buffer it writes into; a gather
              or slice (the embedding lookup) at most what it takes
  GB/s        MB / step over ms / step: the rate the ops read at
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4}
_DTYPE_BYTES |= {"f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*\) -> .*\{$")
_INSTR = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = ")
_IN_PLACE = ("scatter", "dynamic-update-slice")
_TAKES = {"gather", "dynamic-slice", "slice"}


@dataclasses.dataclass
class Op:
    """One HLO instruction: its computation, opcode, output shape, operand names, the computation
    it calls (a fusion's body) or loops over (a while's body), and its source frame."""

    name: str
    computation: str
    opcode: str
    shape: str
    operands: list[str]
    calls: str | None = None
    body: str | None = None
    frame: int | None = None
    root: bool = False


def shape_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape string (``f32[8,512]{1,0}``, tuples summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
        if size is not None:
            total += size * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
    return total


def compact(shape: str) -> str:
    """The shape without its layouts: ``f32[8,512]{1,0}`` -> ``f32[8,512]``."""
    return re.sub(r"\{[^}]*\}", "", shape)


def _close(text: str, start: int) -> int:
    """Index of the parenthesis closing the one opened just before ``start``."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def parse_hlo(text: str) -> tuple[dict[str, Op], dict[int, str]]:
    """Instructions of an HLO module's text by name, and source frames ``{id: "file:line fn"}``
    from its stack-frame tables (empty when the text has none)."""
    ops: dict[str, Op] = {}
    computation = ""
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            computation = header.group(1)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        rest = line[m.end() :]
        if rest.startswith("("):  # a tuple shape
            end = _close(rest, 1)
            shape, rest = rest[: end + 1], rest[end + 2 :]
        else:
            shape, _, rest = rest.partition(" ")
        opcode, _, rest = rest.partition("(")
        end = _close(rest, 0)
        args, attrs = rest[:end], rest[end + 1 :]
        calls = re.search(r"calls=%([\w.\-]+)", attrs)
        body = re.search(r"body=%([\w.\-]+)", attrs)
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        ops[m.group(2)] = Op(
            name=m.group(2),
            computation=computation,
            opcode=opcode,
            shape=shape,
            operands=re.findall(r"%([\w.\-]+)", args),
            calls=calls.group(1) if calls else None,
            body=body.group(1) if body else None,
            frame=int(frame.group(1)) if frame else None,
            root=bool(m.group(1)),
        )
    return ops, _frames(text)


def _section(text: str, name: str) -> list[str]:
    m = re.search(rf"^{name}\n(.*?)(?:\n\s*\n|\Z)", text, re.S | re.M)
    return m.group(1).splitlines() if m else []


def _frames(text: str) -> dict[int, str]:
    """``{stack frame id: "file.py:line function"}`` of the frame's own (innermost) location."""

    def table(name: str) -> dict[int, str]:
        return {int(r.split()[0]): r.split(None, 1)[1].strip('"') for r in _section(text, name) if r.strip()}

    def fields(row: str) -> dict[str, int]:
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row)}

    files, functions = table("FileNames"), table("FunctionNames")
    locations = {}
    for row in _section(text, "FileLocations"):
        f = fields(row)
        file = Path(files.get(f.get("file_name_id", 0), "?")).name
        locations[int(row.split()[0])] = (
            f"{file}:{f.get('line', 0)} {functions.get(f.get('function_name_id', 0), '?')}"
        )
    return {
        int(row.split()[0]): locations.get(fields(row).get("file_location_id", 0), "?")
        for row in _section(text, "StackFrames")
    }


def computations(ops: dict[str, Op]) -> dict[str, tuple[set[str], str | None]]:
    """``{computation: (its opcodes, its root's opcode)}``."""
    out: dict[str, tuple[set[str], str | None]] = {}
    for op in ops.values():
        opcodes, root = out.get(op.computation, (set(), None))
        out[op.computation] = (opcodes | {op.opcode}, op.opcode if op.root else root)
    return out


def input_bytes(op: Op, ops: dict[str, Op], comps: dict | None = None) -> int:
    """Bytes of an op's inputs. An in-place write (scatter or dynamic-update-slice, alone or as
    its fusion's root) does not count the operand it writes into (the one shaped like its
    output); an op that gathers or slices (alone or in its fusion) counts an operand larger than
    its output at the output's size (it takes rows, not the whole array)."""
    comps = computations(ops) if comps is None else comps
    inner, root = comps.get(op.calls, (set(), None)) if op.calls else (set(), None)
    shapes = [ops[name].shape for name in op.operands if name in ops]
    if op.opcode in _IN_PLACE or root in _IN_PLACE:
        out = compact(op.shape)
        for i, s in enumerate(shapes):
            if compact(s) == out:
                del shapes[i]
                break
    sizes = [shape_bytes(s) for s in shapes]
    if (inner | {op.opcode}) & _TAKES:
        sizes = [min(b, shape_bytes(op.shape)) for b in sizes]
    return sum(sizes)


def op_events(trace_dir: str) -> list[tuple[str, float, float]]:
    """``(name, start_ns, end_ns)`` of every event in the newest trace under ``trace_dir`` (an
    event's ``hlo_op`` stat names the op where the event is a device kernel)."""
    from jax.profiler import ProfileData

    paths = sorted(Path(trace_dir).glob("**/*.xplane.pb"), key=os.path.getmtime)
    if not paths:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    events = []
    for plane in ProfileData.from_file(str(paths[-1])).planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                name = stats.get("hlo_op", ev.name)
                events.append((str(name), float(ev.start_ns), float(ev.start_ns + ev.duration_ns)))
    return events


def breakdown(ops: dict[str, Op], frames: dict[int, str], events: list, steps: int) -> dict[str, Any]:
    """The decode loop's body ops, timed and grouped (module docstring). The body is the while
    body computation whose ops' events most often numbered exactly ``steps``."""
    by_name = collections.defaultdict(list)
    for name, start, end in events:
        if name in ops:
            by_name[name].append((start, end))
    bodies = {op.body for op in ops.values() if op.opcode == "while" and op.body}

    def matches(body: str) -> int:
        return sum(len(by_name[o.name]) == steps for o in ops.values() if o.computation == body)

    if not bodies or max(map(matches, bodies)) == 0:
        raise RuntimeError(f"no while body in the compiled loop ran its ops {steps} times in the trace")
    body = max(bodies, key=matches)
    comps = computations(ops)
    groups: dict[tuple, dict[str, Any]] = {}
    first, last, total_ns = float("inf"), 0.0, 0.0
    for op in ops.values():
        if op.computation != body or not by_name[op.name]:
            continue
        spans = by_name[op.name]
        ns = sum(end - start for start, end in spans)
        first, last, total_ns = (
            min(first, min(s for s, _ in spans)),
            max(last, max(e for _, e in spans)),
            total_ns + ns,
        )
        shapes = [compact(ops[n].shape) for n in op.operands if n in ops]
        largest = max(shapes, key=lambda s: shape_bytes(s), default="")
        key = (frames.get(op.frame, "?"), re.sub(r"\.\d+$", "", op.name), compact(op.shape), largest)
        g = groups.setdefault(key, {"ops": 0, "ns": 0.0, "bytes": 0})
        g["ops"] += len(spans) / steps
        g["ns"] += ns
        g["bytes"] += input_bytes(op, ops, comps) * len(spans) / steps
    rows = [
        {
            "source": src,
            "op": kind,
            "output": out,
            "largest_input": largest,
            "ops_per_step": g["ops"],
            "step_s": g["ns"] / steps / 1e9,
            "bytes_per_step": g["bytes"],
            "gb_s": g["bytes"] / (g["ns"] / steps) if g["ns"] else float("nan"),
        }
        for (src, kind, out, largest), g in groups.items()
    ]
    rows.sort(key=lambda r: -r["step_s"])
    return {
        "body": body,
        "steps": steps,
        "wall_step_s": (last - first) / steps / 1e9,
        "ops_step_s": total_ns / steps / 1e9,
        "bytes_per_step": sum(r["bytes_per_step"] for r in rows),
        "rows": rows,
    }
