"""The values `check_vllm_api.py` reasons about: vLLM modules, classes, functions, instances, unevaluated
annotations, signatures, and two markers (MISSING: known to lack a member; EXISTS: present, type unknown).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

MISSING = object()  # the target is known and lacks the member
EXISTS = object()  # the member exists, its type is not known


@dataclass(frozen=True)
class Module:
    name: str

    @property
    def qual(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Cls:
    module: str
    node: ast.ClassDef

    @property
    def qual(self) -> str:
        return f"{self.module}.{self.node.name}"


@dataclass(frozen=True, eq=False)
class Func:
    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: Cls | None = None

    @property
    def qual(self) -> str:
        return f"{self.owner.qual if self.owner else self.module}.{self.node.name}"


@dataclass(frozen=True)
class Inst:
    cls: Cls

    @property
    def qual(self) -> str:
        return self.cls.qual


@dataclass(frozen=True, eq=False)
class Ann:
    """An annotation (or module-level assigned value) in `module`, evaluated when needed."""

    module: str
    expr: ast.expr


@dataclass(frozen=True)
class Models:
    """`model_runner.model`: any vLLM model class (the attribute is not annotated in vLLM)."""

    method: str = ""
    qual: str = "vllm model (any vllm/model_executor/models class)"


@dataclass
class Sig:
    qual: str
    positional: list[str]
    keyword: list[str] = field(default_factory=list)
    varargs: bool = False
    varkw: str | None = None
    annotations: dict[str, Ann] = field(default_factory=dict)
    node: ast.AST | None = None
    module: str = ""
    posonly: int = 0
    required: list[str] = field(default_factory=list)  # parameters without a default


def last_name(expr: ast.expr) -> str:
    return expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")


def decorators(node) -> set[str]:
    return {last_name(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}


def func_sig(node, qual: str, module: str = "", drop_first: bool = False) -> Sig:
    a = node.args
    pos = [*a.posonlyargs, *a.args]
    posonly = len(a.posonlyargs)
    first_default = len(pos) - len(a.defaults)
    required = [p.arg for p in pos[:first_default]]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    if drop_first and pos:
        required = [r for r in required if r != pos[0].arg]
        pos, posonly = pos[1:], max(posonly - 1, 0)
    anns = {p.arg: Ann(module, p.annotation) for p in [*pos, *a.kwonlyargs] if p.annotation is not None}
    return Sig(
        qual, [p.arg for p in pos], [p.arg for p in a.kwonlyargs], a.vararg is not None,
        a.kwarg.arg if a.kwarg else None, anns, node, module, posonly, required,
    )  # fmt: skip
