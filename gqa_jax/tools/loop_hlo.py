"""Where a compiler put a decode loop's ops: read from its optimized HLO text (``compiled.as_text()``).

XLA may move an op whose operands do not change from one iteration to the next out of a
``while`` loop (its while-loop-invariant code motion): the loop then carries the op's result and
its body no longer computes it. Whether it did shows in the optimized HLO: the op's metadata keeps
the name it was traced under (``op_name="jit(f)/while/body/<scope>/dot_general"``), and the
computation it now sits in is, or is not, reached from a ``while``'s body or condition.

- :func:`computations`: the HLO module's computations, each its instruction lines;
- :func:`loop_computations`: those a ``while`` runs (its body and condition, and everything they
  call: fusions, reductions, nested loops);
- :func:`scoped_ops`: the instructions traced under a name scope (``jax.named_scope``; the paper's
  decode names its per-step cross K/V projection ``model.CROSS_RECOMPUTE_SCOPE`` and its one-hot cache
  write ``cache.ONE_HOT_SCOPE``), each with the computation it sits in and whether a loop runs it;
- :func:`placement`: ``"in the loop"``, ``"hoisted"`` (every such product outside every loop) or
  ``"absent"``, for the products (``dot`` / ``convolution``: a TPU's matmuls) of a scope.
"""

from __future__ import annotations

import dataclasses
import math
import re

PRODUCTS = ("dot", "convolution")  # how XLA writes a matmul (a TPU's as convolutions)
IN_LOOP, HOISTED, ABSENT = "in the loop", "hoisted", "absent"

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"\swhile\(.*\bcondition=%?([\w.\-]+), body=%?([\w.\-]+)")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Op:
    """One instruction of the optimized HLO: its name, opcode, computation, whether a loop runs it
    (``in_loop``), the name it was traced under (``op_name``) and its line."""

    name: str
    opcode: str
    computation: str
    in_loop: bool
    op_name: str
    line: str


def computations(hlo: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines, in the module's order."""
    comps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in hlo.splitlines():
        if current is None:
            found = _HEADER.match(line)
            if found and not line.startswith((" ", "HloModule")):
                current = comps.setdefault(found.group(1), [])
        elif line.strip() == "}":
            current = None
        else:
            current.append(line)
    return comps


def _called(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        names.update(_CALLS.findall(line))
        for group in _CALL_LISTS.findall(line):
            names.update(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return names


def loop_computations(comps: dict[str, list[str]]) -> set[str]:
    """The computations a ``while`` runs: its body and condition and all they call, transitively."""
    todo = [
        name for lines in comps.values() for line in lines for pair in _WHILE.findall(line) for name in pair
    ]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo.extend(_called(comps[name]))
    return seen


def scoped_ops(hlo: str, scope: str, opcodes: tuple[str, ...] | None = None) -> list[Op]:
    """The instructions traced under the name scope ``scope`` (their op_name holds ``/scope/``),
    of ``opcodes`` only where given, each with where it sits."""
    comps = computations(hlo)
    looped = loop_computations(comps)
    found = []
    for comp, lines in comps.items():
        for line in lines:
            op_name = _OP_NAME.search(line)
            if op_name is None or f"/{scope}/" not in op_name.group(1):
                continue
            head, _, rest = line.partition("=")
            opcode = _OPCODE.search(" " + rest)
            code = opcode.group(1) if opcode else "?"
            if opcodes is None or code in opcodes:
                name = head.strip().removeprefix("ROOT").strip().lstrip("%")
                found.append(Op(name, code, comp, comp in looped, op_name.group(1), line.strip()))
    return found


def placement(hlo: str, scope: str) -> str:
    """Where the compiler put the products traced under ``scope``: ``IN_LOOP`` (some in a loop's
    computations), ``HOISTED`` (all outside every loop) or ``ABSENT`` (none left)."""
    ops = scoped_ops(hlo, scope, PRODUCTS)
    if not ops:
        return ABSENT
    return IN_LOOP if any(op.in_loop for op in ops) else HOISTED


def where(hlo: str, scope: str, opcodes: tuple[str, ...] = PRODUCTS) -> dict[str, object]:
    """Where a compiled loop has ``scope``'s ``opcodes`` (its products by default): ``IN_LOOP`` where
    some sit in a loop's computations, ``HOISTED`` where all are outside, ``ABSENT``; the instructions
    themselves (their computation, whether a loop runs it, their line) and, per result of theirs (its
    dtype and size), how many values of that dtype and size each ``while`` carries (a hoisted
    product's result is carried into the loop, maybe reshaped)."""
    ops = scoped_ops(hlo, scope, opcodes)
    sizes = sorted({_size(t[0]) for op in ops if (t := _types(op.line.partition("=")[2].split()[0]))})
    loops = [line for lines in computations(hlo).values() for line in lines if _WHILE.search(line)]
    return {
        "placement": ABSENT if not ops else IN_LOOP if any(op.in_loop for op in ops) else HOISTED,
        "products": [{"computation": op.computation, "in_loop": op.in_loop, "line": op.line} for op in ops],
        "carried": [{f"{t} x {n}": [_size(c) for c in _carried(line)].count((t, n)) for t, n in sizes}
                    for line in loops],
    }  # fmt: skip


def _types(text: str) -> list[str]:
    """The array types in ``text``, layouts dropped: ``bf16[64,2048,8,64]``."""
    return re.findall(r"\b[a-z]+\d*\[[\d,]*\]", text)


def _size(array_type: str) -> tuple[str, int]:
    """``bf16[4,24,8]`` -> ``("bf16", 768)``: the dtype and the number of elements."""
    dtype, dims = array_type.rstrip("]").split("[")
    return dtype, math.prod(int(d) for d in dims.split(",") if d)


def _carried(while_line: str) -> list[str]:
    """The types of the values a ``while`` carries (its tuple's elements)."""
    return _types(while_line.partition("=")[2].rpartition(" while(")[0])
