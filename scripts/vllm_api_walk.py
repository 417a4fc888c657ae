"""Walks one of our modules for `check_vllm_api.py`: a small static evaluator of the vLLM values in it.

Names are bound from `import vllm` / `from vllm... import X`, from functions that return such a name
(`vllm = _import_vllm()`), from `import_extra("vllm", ...)`, from calls (a class gives an instance, a function its return annotation),
`await`, `for` / `async for` over annotated iterables, and from `self.x = ...` in our classes (what a
`cls(...)` call passes to `__init__` included). Each attribute read on, and each call of, a vLLM value is
checked against the `VllmIndex`; the walk runs three times so facts found late reach earlier code, and
only the last run reports. A worker extension class is also checked against vLLM's CUDA worker.
"""

from __future__ import annotations

import ast

from vllm_api_index import VllmIndex
from vllm_api_values import EXISTS, MISSING, Ann, Cls, Func, Inst, Models, Module, func_sig

VLLM_VALUES = (Module, Cls, Func, Inst, Ann, Models)


class OurClass:
    """One of our classes: its own names, and the vLLM values found on `self` and passed to `__init__`."""

    def __init__(self, node: ast.ClassDef, extension: bool):
        self.node, self.extension = node, extension
        self.attrs: dict[str, object] = {}  # self.x -> vLLM value
        self.init_args: dict[str, object] = {}  # __init__ parameter -> vLLM value passed
        self.own = {
            s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        for s in node.body:
            targets = (
                s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, ast.AnnAssign) else []
            )
            self.own |= {t.id for t in targets if isinstance(t, ast.Name)}


class OurRef:
    """`cls` / `self` / one of our module's functions, as a value."""

    def __init__(self, kind: str, target):
        self.kind, self.target = kind, target


class OurModule:
    """One of our modules, walked for its vLLM uses; `run` reports into `rep` through `check_call`."""

    def __init__(self, idx: VllmIndex, rep, path: str, text: str, check_call):
        self.idx, self.rep, self.path, self.check_call = idx, rep, path, check_call
        self.tree = ast.parse(text, filename=path)
        self.returns: dict[str, object] = {}  # our function -> the vLLM value it returns
        self.rpcs: list = []  # (path, line, method, synthesized call)
        self.extensions: list[tuple[str, int]] = []  # worker_extension_cls values
        self.extension_methods: dict = {}
        self.consts = {
            t.id: s.value.value
            for s in self.tree.body
            if isinstance(s, ast.Assign)
            and isinstance(s.value, ast.Constant)
            and isinstance(s.value.value, str)
            for t in s.targets
            if isinstance(t, ast.Name)
        }

    def run(self, extension: str | None = None) -> None:
        classes = {
            s.name: OurClass(s, s.name == extension) for s in self.tree.body if isinstance(s, ast.ClassDef)
        }
        if extension and extension not in classes:
            self.rep.bad(self.path, 1, "worker_extension_cls", f"no class {extension!r} in this module")
        self.classes = classes
        quiet = self.rep.quiet
        for i in range(3):
            self.rep.quiet = quiet or i < 2
            self.rpcs, self.extensions = [], []
            env: dict[str, object] = {}
            self.block(self.tree.body, env, None)
        self.rep.quiet = quiet
        for c in classes.values():
            if c.extension:
                self.check_extension(c)

    # -- statements
    def block(self, stmts, env, owner: OurClass | None) -> None:
        for s in stmts:
            self.stmt(s, env, owner)

    def stmt(self, s, env, owner) -> None:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            self.import_(s, env)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if owner is None:
                env[s.name] = OurRef("func", s.name)
            self.function(s, dict(env), owner)
        elif isinstance(s, ast.ClassDef):
            cls = self.classes.get(s.name) if owner is None else None
            env[s.name] = OurRef("class", cls)
            self.block(s.body, dict(env), cls)
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            v = self.eval(s.value, env) if s.value is not None else None
            for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                self.bind(t, v, env)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.bind(s.target, self.idx.element_of(self.eval(s.iter, env)), env)
            self.block(s.body + s.orelse, env, owner)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.eval(item.context_expr, env)
            self.block(s.body, env, owner)
        elif isinstance(s, (ast.If, ast.While)):
            self.eval(s.test, env)
            self.block(s.body + s.orelse, env, owner)
        elif isinstance(s, ast.Try):
            self.block(s.body + s.orelse + s.finalbody, env, owner)
            for h in s.handlers:
                self.block(h.body, env, owner)
        elif isinstance(s, ast.Return) and s.value is not None:
            v = self.eval(s.value, env)
            if isinstance(v, VLLM_VALUES) and env.get("__func__"):
                self.returns[env["__func__"]] = v
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.eval(child, env)

    def bind(self, target, value, env) -> None:
        if isinstance(target, ast.Name) and value is not None:
            env[target.id] = value
        elif isinstance(target, ast.Attribute) and isinstance(env.get(_name(target.value)), OurRef):
            ref = env[_name(target.value)]
            if ref.kind == "self" and ref.target is not None and value is not None:
                ref.target.attrs[target.attr] = value

    def function(self, fn, env, owner: OurClass | None) -> None:
        env["__func__"] = fn.name if owner is None else None
        params = [p.arg for p in fn.args.posonlyargs + fn.args.args]
        decos = {getattr(d, "id", "") for d in fn.decorator_list}
        if owner is not None and params and "staticmethod" not in decos:
            env[params[0]] = OurRef("class" if "classmethod" in decos else "self", owner)
        if owner is not None and fn.name == "__init__":
            env.update(owner.init_args)
        self.block(fn.body, env, None)

    def import_(self, s, env) -> None:
        line = s.lineno
        if isinstance(s, ast.Import):
            for a in s.names:
                if a.name.split(".")[0] != "vllm":
                    continue
                if not self.idx.is_module(a.name):
                    self.rep.bad(self.path, line, a.name, "no such module")
                else:
                    self.rep.ok(self.path, line, f"import {a.name}")
                env[a.asname or "vllm"] = Module(a.asname and a.name or "vllm")
            return
        if s.level or (s.module or "").split(".")[0] != "vllm":
            return
        if not self.idx.is_module(s.module):
            self.rep.bad(self.path, line, s.module, "no such module")
            return
        for a in s.names:
            found = self.idx.lookup(s.module, a.name)
            if found is None:
                self.rep.bad(self.path, line, s.module, f"has no {a.name!r}")
            else:
                self.rep.ok(self.path, line, f"from {s.module} import {a.name}")
                env[a.asname or a.name] = found

    # -- expressions
    def eval(self, e, env):
        if isinstance(e, ast.Name):
            return env.get(e.id)
        if isinstance(e, ast.Await):
            return self.eval(e.value, env)
        if isinstance(e, ast.Attribute):
            return self.attribute(e, self.eval(e.value, env))
        if isinstance(e, ast.Call):
            return self.call(e, env)
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = dict(env)
            for g in e.generators:
                self.bind(g.target, self.idx.element_of(self.eval(g.iter, inner)), inner)
                for cond in g.ifs:
                    self.eval(cond, inner)
            for part in (e.key, e.value) if isinstance(e, ast.DictComp) else (e.elt,):
                self.eval(part, inner)
            return None
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                self.eval(child, env)
        return None

    def attribute(self, e: ast.Attribute, base):
        if isinstance(base, OurRef) and base.kind == "self" and base.target is not None:
            cls = base.target
            if e.attr in cls.attrs:
                return cls.attrs[e.attr]
            if cls.extension and e.attr not in cls.own:
                worker = self.idx.worker()
                base = worker
            else:
                return None
        if not isinstance(base, VLLM_VALUES):
            return None
        got = self.idx.attr(base, e.attr)
        qual = getattr(base, "qual", None) or getattr(self.idx.instance_of(base), "qual", "?")
        if got is MISSING:
            self.rep.bad(self.path, e.lineno, qual, f"has no attribute {e.attr!r}")
            return None
        if got is not None:
            self.rep.ok(self.path, e.lineno, f"{qual}.{e.attr}")
        return None if got is EXISTS else got

    def call(self, e: ast.Call, env):
        extra = self.extra_module(e)
        if extra is not None:
            return extra
        f = self.eval(e.func, env)
        values = [self.eval(a, env) for a in e.args]
        kwvalues = {k.arg: self.eval(k.value, env) for k in e.keywords}
        if isinstance(f, OurRef):
            if f.kind == "func":
                return self.returns.get(f.target)
            if f.kind == "class" and f.target is not None:
                init = next((s for s in f.target.node.body if getattr(s, "name", "") == "__init__"), None)
                if init is not None:
                    names = [p.arg for p in init.args.args[1:] + init.args.kwonlyargs]
                    bound = {**dict(zip(names, values, strict=False)), **kwvalues}
                    f.target.init_args.update({k: v for k, v in bound.items() if isinstance(v, VLLM_VALUES)})
            return None
        if isinstance(f, Models):
            self.check_models(e)
            return None
        sig = self.idx.signature(f) if isinstance(f, VLLM_VALUES) else None
        if sig is not None:
            self.check_call(self.idx, self.rep, (self.path, e.lineno), sig, e)
        if isinstance(f, VLLM_VALUES):
            self.note_extension(e, env)
            if isinstance(f, Func) and f.node.name == "collective_rpc":
                self.note_rpc(e)
        return self.idx.call_result(f) if isinstance(f, VLLM_VALUES) else None

    def extra_module(self, e: ast.Call) -> Module | None:
        """`import_extra("vllm...", ...)` (services/common/extras.py) gives that vLLM module, as `import` does."""
        if _name(e.func) != "import_extra" or not e.args:
            return None
        first = e.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return None
        if first.value.split(".")[0] != "vllm":
            return None
        if not self.idx.is_module(first.value):
            self.rep.bad(self.path, e.lineno, first.value, "no such module")
            return None
        self.rep.ok(self.path, e.lineno, f"import_extra({first.value!r})")
        return Module(first.value)

    def note_extension(self, e: ast.Call, env) -> None:
        for k in e.keywords:
            if k.arg == "worker_extension_cls":
                v = k.value
                dotted = v.value if isinstance(v, ast.Constant) else self.consts.get(_name(v))
                if isinstance(dotted, str):
                    self.extensions.append((dotted, e.lineno))

    def note_rpc(self, e: ast.Call) -> None:
        method = e.args[0] if e.args else next((k.value for k in e.keywords if k.arg == "method"), None)
        if not (isinstance(method, ast.Constant) and isinstance(method.value, str)):
            return
        kw = {k.arg: k.value for k in e.keywords}
        args = kw.get("args", e.args[2] if len(e.args) > 2 else None)
        kwargs = kw.get("kwargs")
        synth = ast.Call(
            func=e.func, args=list(args.elts) if isinstance(args, ast.Tuple) else [], keywords=[]
        )
        if args is not None and not isinstance(args, ast.Tuple):
            synth.args = [ast.Starred(value=args)]
        if isinstance(kwargs, ast.Dict):
            synth.keywords = [
                ast.keyword(arg=k.value, value=v) for k, v in zip(kwargs.keys, kwargs.values, strict=True)
                if isinstance(k, ast.Constant)
            ]  # fmt: skip
        self.rpcs.append((self.path, e.lineno, method.value, synth))

    def check_models(self, e: ast.Call) -> None:
        sigs = self.idx.model_load_weights()
        failing = []
        for sig in sigs:
            sub = type(self.rep)()
            self.check_call(self.idx, sub, (self.path, e.lineno), sig, e)
            if sub.mismatches:
                problems = ", ".join(m.problem for m in sub.mismatches)
                failing.append(f"{sig.qual.removeprefix('vllm.model_executor.models.')}: {problems}")
        if failing:
            head = "; ".join(failing[:3]) + (" ..." if len(failing) > 3 else "")
            self.rep.bad(
                self.path,
                e.lineno,
                "model.load_weights",
                f"{len(failing)} of {len(sigs)} model classes reject this call: {head}",
            )
        else:
            self.rep.ok(
                self.path, e.lineno, f"model.load_weights(...) against {len(sigs)} vllm model classes"
            )

    def check_extension(self, cls: OurClass) -> None:
        """vLLM mixes the class into its worker and asserts no name (but dunders) is on both."""
        worker = self.idx.worker()
        if worker is None:
            self.rep.bad(
                self.path, cls.node.lineno, ".".join(("vllm.v1.worker.gpu_worker", "Worker")), "not found"
            )
            return
        for name in sorted(cls.own):
            if name.startswith("__"):
                continue
            if self.idx.attr(worker, name) not in (MISSING, None):
                self.rep.bad(
                    self.path,
                    cls.node.lineno,
                    f"{worker.qual}.{name}",
                    "the worker extension redefines it (vLLM refuses the class)",
                )
        for s in cls.node.body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.extension_methods[s.name] = func_sig(s, f"{cls.node.name}.{s.name}", drop_first=True)
        self.rep.ok(self.path, cls.node.lineno, f"worker extension {cls.node.name} vs {worker.qual}")


def _name(e) -> str | None:
    return e.id if isinstance(e, ast.Name) else None
