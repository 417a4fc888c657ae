"""A static index of a vLLM wheel for `check_vllm_api.py`: its modules parsed with `ast`, never imported.

It answers what the checker asks of a vLLM symbol: what a dotted name resolves to (following re-exports,
relative imports, `TYPE_CHECKING` blocks and the lazy `MODULE_ATTRS` table of `vllm/__init__.py`), the
members of a class through its vLLM bases (methods, class annotations, `self.x` set in methods), the
signature of a function or constructor (dataclass, msgspec.Struct and TypedDict fields are annotations),
whether a keyword is accepted (following `**kwargs` into the call it is forwarded to), the `Literal`
values of a parameter, and the type an annotation names (for return values and iteration).
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from vllm_api_values import (
    EXISTS,
    MISSING,
    Ann,
    Cls,
    Func,
    Inst,
    Models,
    Module,
    Sig,
    decorators,
    func_sig,
    last_name,
)

# The CUDA platform's `worker_cls` (vllm/platforms/cuda.py); the worker extension is mixed into it.
WORKER_CLASS = ("vllm.v1.worker.gpu_worker", "Worker")
MODEL_RUNNERS = (
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
    "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
)
RECORD_BASES = {"Struct", "TypedDict", "NamedTuple"}  # constructors take their annotated fields
PLAIN_BASES = {"object", "ABC", "Generic", "Protocol", "Struct", "TypedDict", "NamedTuple", "Enum"}
ITERABLES = {"list", "List", "Sequence", "GenericSequence", "Iterable", "Iterator", "AsyncIterator"}
ITERABLES |= {"AsyncIterable", "AsyncGenerator", "Generator", "set", "tuple", "frozenset"}


def _top_statements(body):
    """Module-level statements, descending into if/try blocks (TYPE_CHECKING, optional imports)."""
    for s in body:
        yield s
        if isinstance(s, ast.If):
            yield from _top_statements(s.body + s.orelse)
        elif isinstance(s, ast.Try):
            yield from _top_statements(s.body + s.orelse + s.finalbody)
            for h in s.handlers:
                yield from _top_statements(h.body)


class VllmIndex:
    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.files = set(self.zip.namelist())
        dist = next((n.split("/")[0] for n in self.files if n.split("/")[0].endswith(".dist-info")), "")
        self.version = dist.removesuffix(".dist-info").partition("-")[2] or "?"
        self._trees: dict[str, ast.Module | None] = {}
        self._members: dict[int, dict[str, object]] = {}

    # -- modules and names
    def _file(self, mod: str) -> str | None:
        base = mod.replace(".", "/")
        return next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in self.files), None)

    def is_module(self, mod: str) -> bool:
        return self._file(mod) is not None

    def tree(self, mod: str) -> ast.Module | None:
        if mod not in self._trees:
            f = self._file(mod)
            self._trees[mod] = ast.parse(self.zip.read(f), filename=f) if f else None
        return self._trees[mod]

    def _absolute(self, mod: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = mod if (self._file(mod) or "").endswith("__init__.py") else mod.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        return f"{pkg}.{node.module}" if node.module else pkg

    def lookup(self, mod: str, name: str, depth: int = 0):
        """What `name` is in vLLM module `mod`, or None."""
        tree = self.tree(mod)
        if tree is None or depth > 12:
            return None
        for s in _top_statements(tree.body):
            if isinstance(s, ast.ClassDef) and s.name == name:
                return Cls(mod, s)
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name:
                return Func(mod, s)
            if isinstance(s, ast.ImportFrom):
                for a in s.names:
                    if (a.asname or a.name) == name:
                        src = self._absolute(mod, s)
                        found = self.lookup(src, a.name, depth + 1)
                        return found or (
                            Module(f"{src}.{a.name}") if self.is_module(f"{src}.{a.name}") else None
                        )
            if isinstance(s, ast.Import):
                for a in s.names:
                    if a.asname == name:
                        return Module(a.name)
            targets = (
                s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, ast.AnnAssign) else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and s.value is not None:
                return Ann(mod, s.value)
            if isinstance(s, ast.Assign) and last_name(s.targets[0]) == "MODULE_ATTRS":
                lazy = ast.literal_eval(s.value) if isinstance(s.value, ast.Dict) else {}
                if name in lazy:
                    rel, _, attr = lazy[name].partition(":")
                    return self.lookup(mod + rel if rel.startswith(".") else rel, attr, depth + 1)
        return Module(f"{mod}.{name}") if self.is_module(f"{mod}.{name}") else None

    def resolve(self, mod: str, expr: ast.expr):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(expr, ast.Name):
            return self.lookup(mod, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(mod, expr.value)
            got = self.attr(base, expr.attr) if base is not None else None
            return None if got is MISSING else got
        return None

    # -- classes
    def bases(self, cls: Cls) -> tuple[list[Cls], bool]:
        """vLLM base classes, and whether some base is opaque (outside vLLM and not a plain one)."""
        found, opaque = [], False
        for b in cls.node.bases:
            r = self.resolve(cls.module, b.value if isinstance(b, ast.Subscript) else b)
            if isinstance(r, Cls):
                found.append(r)
            elif last_name(b.value if isinstance(b, ast.Subscript) else b) not in PLAIN_BASES:
                opaque = True
        return found, opaque

    def mro(self, cls: Cls) -> tuple[list[Cls], bool]:
        out, opaque, todo = [], False, [cls]
        while todo:
            c = todo.pop(0)
            if any(c.node is o.node for o in out):
                continue
            out.append(c)
            bases, op = self.bases(c)
            opaque |= op
            todo.extend(bases)
        return out, opaque

    def _own_members(self, c: Cls) -> dict[str, object]:
        if id(c.node) not in self._members:
            m: dict[str, object] = {}
            methods = [s for s in c.node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for fn in methods:  # instance attributes set in methods
                params = {p.arg: p.annotation for p in fn.args.args + fn.args.kwonlyargs if p.annotation}
                for n in ast.walk(fn):
                    targets = (
                        n.targets
                        if isinstance(n, ast.Assign)
                        else [n.target]
                        if isinstance(n, ast.AnnAssign)
                        else []
                    )
                    for t in targets:
                        if isinstance(t, ast.Attribute) and last_name(t.value) == "self":
                            if isinstance(n, ast.AnnAssign):
                                m[t.attr] = Ann(c.module, n.annotation)
                            elif isinstance(n.value, ast.Name) and n.value.id in params:
                                m.setdefault(t.attr, Ann(c.module, params[n.value.id]))
                            else:
                                m.setdefault(t.attr, EXISTS)
            for s in c.node.body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    m[s.name] = Func(c.module, s, c)
                elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    m[s.target.id] = Ann(c.module, s.annotation)
                elif isinstance(s, ast.Assign):
                    m.update({t.id: EXISTS for t in s.targets if isinstance(t, ast.Name)})
                elif isinstance(s, ast.ClassDef):
                    m[s.name] = Cls(c.module, s)
            self._members[id(c.node)] = m
        return self._members[id(c.node)]

    def attr(self, value, name: str):
        """Member `name` of a vLLM value: the member, EXISTS, MISSING, or None (cannot tell)."""
        if isinstance(value, Module):
            return self.lookup(value.name, name) or MISSING
        if isinstance(value, Ann):
            value = self.instance_of(value)
        if isinstance(value, Models):
            return Models(name) if name == "load_weights" else None
        if not isinstance(value, (Cls, Inst)):
            return None
        cls = value.cls if isinstance(value, Inst) else value
        if isinstance(value, Inst) and cls.qual in MODEL_RUNNERS and name == "model":
            return Models()
        mro, opaque = self.mro(cls)
        for c in mro:
            found = self._own_members(c).get(name)
            if found is not None:
                return found
        dynamic = any("__getattr__" in self._own_members(c) for c in mro)
        return None if opaque or dynamic else MISSING

    def instance_of(self, ann: Ann):
        """The instance an annotation names (`X`, `"X"`, `X | None`, `Optional[X]`), or None."""
        e = ann.expr
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            try:
                e = ast.parse(e.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitOr):
            return self.instance_of(Ann(ann.module, e.left)) or self.instance_of(Ann(ann.module, e.right))
        if isinstance(e, ast.Subscript) and last_name(e.value) == "Optional":
            return self.instance_of(Ann(ann.module, e.slice))
        r = self.resolve(ann.module, e) if isinstance(e, (ast.Name, ast.Attribute)) else None
        return Inst(r) if isinstance(r, Cls) else None

    def element_of(self, value):
        """What iterating `value` gives, when its annotation says (`list[X]`, `AsyncGenerator[X, None]`)."""
        if not isinstance(value, Ann):
            return None
        e = value.expr
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitOr):
            return self.element_of(Ann(value.module, e.left)) or self.element_of(Ann(value.module, e.right))
        if isinstance(e, ast.Subscript) and last_name(e.value) in ITERABLES:
            first = e.slice.elts[0] if isinstance(e.slice, ast.Tuple) else e.slice
            return Ann(value.module, first)
        return None

    # -- calls
    def signature(self, value) -> Sig | None:
        if isinstance(value, Func):
            decos = decorators(value.node)
            drop = value.owner is not None and "staticmethod" not in decos
            return func_sig(value.node, value.qual, value.module, drop_first=drop)
        if isinstance(value, Cls):
            return self.ctor_sig(value)
        return None

    def ctor_sig(self, cls: Cls) -> Sig | None:
        mro, opaque = self.mro(cls)
        for c in mro:
            init = self._own_members(c).get("__init__")
            if isinstance(init, Func) and init.owner is not None and init.owner.node is c.node:
                return func_sig(init.node, cls.qual, c.module, drop_first=True)
            if "dataclass" in decorators(c.node) or any(last_name(b) in RECORD_BASES for b in c.node.bases):
                return self._fields_sig(cls, mro)
        return None if opaque else Sig(cls.qual, [])

    def _fields_sig(self, cls: Cls, mro: list[Cls]) -> Sig:
        names, anns = [], {}
        for c in reversed(mro):
            for s in c.node.body:
                if not (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)):
                    continue
                if (
                    last_name(s.annotation.value if isinstance(s.annotation, ast.Subscript) else s.annotation)
                    == "ClassVar"
                ):
                    continue
                v = s.value
                if isinstance(v, ast.Call) and any(
                    k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in v.keywords
                ):
                    continue
                if s.target.id not in anns:
                    names.append(s.target.id)
                anns[s.target.id] = Ann(c.module, s.annotation)
        return Sig(cls.qual, [], names, annotations=anns)

    def call_result(self, value):
        if isinstance(value, Cls):
            return Inst(value)
        if isinstance(value, Func) and value.node.returns is not None:
            return Ann(value.module, value.node.returns)
        return None

    def accepts(self, sig: Sig, name: str, depth: int = 0):
        """The annotation (or EXISTS) of parameter `name` of `sig`, or None when it is not accepted."""
        if name in sig.positional[sig.posonly :] or name in sig.keyword:
            return sig.annotations.get(name, EXISTS)
        if sig.varkw is None:
            return None
        targets = self._forwarded_to(sig) if depth < 4 else []
        for t in targets:
            found = self.accepts(t, name, depth + 1)
            if found is not None:
                return found
        return None if targets else EXISTS

    def _forwarded_to(self, sig: Sig) -> list[Sig]:
        """Signatures of the vLLM calls `sig`'s body passes its `**kwargs` on to."""
        out = []
        for n in ast.walk(sig.node) if sig.node is not None else ():
            if isinstance(n, ast.Call) and any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == sig.varkw
                for k in n.keywords
            ):
                callee = (
                    self.resolve(sig.module, n.func)
                    if isinstance(n.func, (ast.Name, ast.Attribute))
                    else None
                )
                s = self.signature(callee) if callee is not None else None
                if s is not None:
                    out.append(s)
        return out

    def literal_values(self, found) -> set[str] | None:
        """The strings a `Literal[...]` annotation (or an alias of one) allows, or None."""
        if not isinstance(found, Ann):
            return None
        e = found.expr
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitOr):
            parts = [self.literal_values(Ann(found.module, x)) for x in (e.left, e.right)]
            return None if all(p is None for p in parts) else set().union(*(p for p in parts if p))
        if isinstance(e, ast.Subscript) and last_name(e.value) == "Literal":
            elts = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
            return {x.value for x in elts if isinstance(x, ast.Constant) and isinstance(x.value, str)}
        if isinstance(e, (ast.Name, ast.Attribute)):
            alias = self.resolve(found.module, e)
            if isinstance(alias, Ann) and alias.expr is not e:
                return self.literal_values(alias)
        return None

    def worker(self) -> Inst | None:
        cls = self.lookup(*WORKER_CLASS)
        return Inst(cls) if isinstance(cls, Cls) else None

    def method_sig(self, name: str) -> Sig | None:
        w = self.worker()
        found = self.attr(w, name) if w else None
        return self.signature(found) if isinstance(found, Func) else None

    def model_load_weights(self) -> list[Sig]:
        """`load_weights` of every model class in vllm/model_executor/models/."""
        out = []
        prefix = "vllm/model_executor/models/"
        for f in sorted(self.files):
            if f.startswith(prefix) and f.endswith(".py") and b"def load_weights" in self.zip.read(f):
                mod = f.removesuffix(".py").replace("/", ".")
                for c in self.tree(mod).body:
                    if isinstance(c, ast.ClassDef):
                        lw = self._own_members(Cls(mod, c)).get("load_weights")
                        if isinstance(lw, Func) and lw.owner.node is c:
                            out.append(func_sig(lw.node, lw.qual, mod, drop_first=True))
        return out
