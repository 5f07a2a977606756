"""Markdown building blocks shared by every benchmark's renderer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def num(v: Any, fmt: str = ",.0f") -> str:
    return "–" if v is None else format(v, fmt)


def table(head: list[str], rows: Iterable[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(head))]
    return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


@dataclass
class Target:
    what: str
    measured: str
    met: bool

    def row(self) -> list[str]:
        return [self.what, self.measured, "yes" if self.met else "**no**"]


def targets_table(targets: list[Target]) -> list[str]:
    return table(["target", "measured in the same run", "met"], (t.row() for t in targets),
                 right_from=99)


def images(paths: list[str], alts: dict[str, str]) -> list[str]:
    out = []
    for p in paths:
        stem = Path(p).stem
        out += ["", f"![{alts.get(stem, stem)}]({p})"]
    return out


def table_line(what: str, value: str) -> str:
    return f"- {what}: {value}"
