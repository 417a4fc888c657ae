"""Behaviour rules of `check_vllm_api.py`: what vLLM does with our calls, which names alone do not show.

Each rule rests on a premise about vLLM's code, itself checked against the wheel (`PREMISES`: ordered
snippets of one function's source), so a release that changes the behaviour fails the check instead of
silently voiding the rule. The rules on our code:

1. `SamplingParams` given `n` (other than the literal 1) sets `output_kind=RequestOutputKind.FINAL_ONLY`:
   else parallel sampling streams each child on its own (`ParentRequest.get_outputs`) and the last output
   holds only the samples that finished last (GRPO groups come back short).
2. Every argument of `collective_rpc` is provably plain (bytes, str, int, float, bool, None, lists / tuples
   / dicts of them, TypedDicts of them): its transport is msgspec msgpack, whose decoder rebuilds tensors
   only for fields typed as tensors (`MsgpackDecoder.dec_hook`), so a tensor arrives as a list.
3. Engine arguments (`AsyncEngineArgs`, `EngineArgs`, `LLM`) set `logprobs_mode` to `LOGPROBS_MODE`, the
   trainer's definition (log_softmax(logits / T); vLLM's default `raw_logprobs` is before temperature).
4. With `enable_sleep_mode` passed, `AsyncLLM.sleep` and `AsyncLLM.wake_up` are called (and exist).
5. The worker extension loads weights with vLLM's post-load processing: `self.reload_weights(...)` (not
   with `is_checkpoint_format=False`), or a direct `model.load_weights` only after a method of the
   extension that checks `self.model_config.quantization` and raises (quantized models refused).
6. Every `VLLM_*` environment variable our modules name (the string, e.g. in `os.environ.setdefault`) is
   one vLLM reads: a key of `environment_variables` in vllm/envs.py. Among them `V1_RUNNER_ENV`, which
   the engine sets to 0 on a GPU: vLLM 0.33 defaults to Model Runner V2, and the premises of rule 3
   (the sampler's processed log-probs) are those of the V1 runner.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

# the trainer computes log_softmax(logits / T) (services/trainer/actor.py): vLLM's processed log-probs
LOGPROBS_MODE = "processed_logprobs"
SAMPLING_PARAMS = "vllm.sampling_params.SamplingParams"
ENGINE_ARGS = {
    "vllm.engine.arg_utils.AsyncEngineArgs",
    "vllm.engine.arg_utils.EngineArgs",
    "vllm.entrypoints.llm.LLM",
}
PLAIN_TYPES = {"int", "str", "bytes", "float", "bool", "None"}
PLAIN_CONTAINERS = {"list", "tuple", "dict", "List", "Tuple", "Dict", "Sequence", "Mapping"}
PLAIN_CALLS = {"int", "str", "bytes", "float", "bool", "len"}
SERIAL = "vllm/v1/serial_utils.py MsgpackDecoder.dec_hook"
ENVS_FILE = "vllm/envs.py"
V1_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # 0: the V1 model runner (vllm/config/vllm.py)


@dataclass(frozen=True)
class Premise:
    """`snippets` occur in this order in the source of `function` ("Class.method") of vLLM `file`."""

    file: str
    function: str
    snippets: tuple[str, ...]
    why: str


PREMISES = (
    Premise(
        "vllm/v1/engine/parallel_sampling.py",
        "ParentRequest.get_outputs",
        (
            "!= RequestOutputKind.FINAL_ONLY",
            "outputs = [] if already_finished_and_returned else [completion_output]",
            "self.output_aggregator[completion_output.index] = completion_output",
        ),
        "rule 1: n > 1 children come in one output only with FINAL_ONLY",
    ),  # fmt: skip
    Premise(
        "vllm/v1/engine/core_client.py",
        "AsyncMPClient._call_utility_async",
        ("self.encoder.encode((self.client_index, call_id, method, args))",),
        "rule 2: collective_rpc's arguments are msgpack-encoded to the engine core",
    ),
    Premise(
        "vllm/v1/serial_utils.py",
        "MsgpackDecoder.dec_hook",
        ("isclass(t)", "issubclass(t, torch.Tensor)", "self._decode_tensor(obj)", "return obj"),
        "rule 2: tensors are rebuilt only for fields typed as tensors",
    ),
    Premise(
        "vllm/v1/sample/sampler.py",
        "Sampler.sample",
        ('logprobs_mode == "processed_logprobs"', "self.apply_temperature(", "self.topk_topp_sampler("),
        "rule 3: processed log-probs are taken after temperature, top-k and top-p",
    ),
    Premise(
        "vllm/config/vllm.py",
        "VllmConfig.use_v2_model_runner",
        (
            "use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER",
            "if use_v2_model_runner is not None:",
            "return use_v2_model_runner",
        ),
        f"rule 6: {V1_RUNNER_ENV}=0 picks the V1 model runner over the default",
    ),  # fmt: skip
    Premise(
        "vllm/v1/engine/async_llm.py",
        "AsyncLLM.sleep",
        ("self.engine_core.sleep_async(level",),
        "rule 4: AsyncLLM.sleep(level) frees the engine's GPU memory",
    ),
    Premise(
        "vllm/v1/engine/async_llm.py",
        "AsyncLLM.wake_up",
        ("self.engine_core.wake_up_async(tags)",),
        "rule 4: AsyncLLM.wake_up brings it back",
    ),
    Premise(
        "vllm/v1/worker/gpu_worker.py",
        "Worker.reload_weights",
        ("self.model_runner.reload_weights(*args, **kwargs)",),
        "rule 5: the worker's reload_weights is the model runner's",
    ),
    Premise(
        "vllm/v1/worker/gpu_model_runner.py",
        "GPUModelRunner.reload_weights",
        ("weights_iterator", "is_checkpoint_format", "reload_weights("),
        "rule 5: the model runner reloads in place from an iterator",
    ),
    Premise(
        "vllm/v1/worker/gpu/model_runner.py",
        "GPUModelRunner.reload_weights",
        ("weights_iterator", "is_checkpoint_format", "reload_weights("),
        "rule 5: so does the v2 model runner",
    ),
    Premise(
        "vllm/model_executor/model_loader/reload/inplace.py",
        "reload_weights",
        (
            "if is_checkpoint_format:",
            "initialize_layerwise_reload(model)",
            "model.load_weights(weights_iterator)",
            "finalize_layerwise_reload(model, model_config)",
        ),
        "rule 5: an in-place reload wraps the model's load_weights in layerwise reload",
    ),  # fmt: skip
    Premise(
        "vllm/model_executor/model_loader/reload/layerwise.py",
        "_layerwise_process",
        ("param.weight_loader(", "quant_method.process_weights_after_loading(layer)"),
        "rule 5: layerwise reload runs each layer's process_weights_after_loading",
    ),
)


def check_premises(idx, rep, premises=PREMISES) -> None:
    for p in premises:
        src = idx.zip.read(p.file).decode() if p.file in idx.files else None
        node = _find_function(ast.parse(src), p.function) if src is not None else None
        if node is None:
            rep.bad(p.file, 1, p.function, f"not found ({p.why})")
            continue
        body = "\n".join(src.splitlines()[node.lineno - 1 : node.end_lineno])
        at = 0
        for snippet in p.snippets:
            found = body.find(snippet, at)
            if found < 0:
                rep.bad(
                    p.file, node.lineno, p.function, f"no longer has {snippet!r} where expected ({p.why})"
                )
                break
            at = found + len(snippet)
        else:
            rep.ok(p.file, node.lineno, f"premise {p.function}: {p.why}")


def _find_function(tree: ast.Module, dotted: str):
    scope: list = tree.body
    node = None
    for part in dotted.split("."):
        node = next(
            (s for s in scope if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
             and s.name == part),
            None,
        )  # fmt: skip
        if node is None:
            return None
        scope = node.body
    return node


# -- rules 1, 3 (per call of a vLLM constructor) and the facts rule 4 needs
def check_call_rules(idx, rep, where: tuple[str, int], sig, call: ast.Call, facts: dict) -> None:
    path, line = where
    kws = {k.arg: k.value for k in call.keywords if k.arg is not None}
    unpacked = any(k.arg is None for k in call.keywords)
    if sig.qual == SAMPLING_PARAMS:
        n = kws.get("n")
        single = n is None or (isinstance(n, ast.Constant) and n.value == 1)
        kind = kws.get("output_kind")
        final = kind is not None and ast.unparse(kind).endswith("RequestOutputKind.FINAL_ONLY")
        if not single and not final:
            got = f"output_kind={ast.unparse(kind)}" if kind is not None else "no output_kind"
            rep.bad(
                path, line, sig.qual,
                f"n={ast.unparse(n)} with {got}: vLLM streams each of the n samples on its own "
                "(v1/engine/parallel_sampling.py ParentRequest.get_outputs) and the last output holds only "
                "those that finished last; pass output_kind=RequestOutputKind.FINAL_ONLY",
            )  # fmt: skip
        elif not single:
            rep.ok(path, line, f"{sig.qual}(n=..., output_kind=FINAL_ONLY)")
    elif sig.qual in ENGINE_ARGS:
        mode = kws.get("logprobs_mode")
        if mode is None:
            if not unpacked:
                rep.bad(
                    path, line, sig.qual,
                    f"logprobs_mode is not set (vLLM's default 'raw_logprobs' is before temperature); the "
                    f"trainer computes log_softmax(logits / T): set logprobs_mode={LOGPROBS_MODE!r}",
                )  # fmt: skip
        elif isinstance(mode, ast.Constant) and mode.value == LOGPROBS_MODE:
            rep.ok(path, line, f"{sig.qual}(logprobs_mode={LOGPROBS_MODE!r}) = the trainer's log-probs")
        else:
            allowed = idx.literal_values(idx.accepts(sig, "logprobs_mode"))
            if not (
                isinstance(mode, ast.Constant) and allowed and mode.value not in allowed
            ):  # else reported
                rep.bad(
                    path, line, sig.qual,
                    f"logprobs_mode={ast.unparse(mode)}: the trainer computes log_softmax(logits / T), "
                    f"vLLM's {LOGPROBS_MODE!r}; set logprobs_mode={LOGPROBS_MODE!r}",
                )  # fmt: skip
        sleep = kws.get("enable_sleep_mode")
        if sleep is not None and not (isinstance(sleep, ast.Constant) and not sleep.value):
            facts.setdefault("sleep_mode", (path, line))


def check_sleep_rule(rep, facts: dict) -> None:
    """Rule 4, after every module is walked: sleep mode set means AsyncLLM.sleep and wake_up are used."""
    if "sleep_mode" not in facts:
        return
    path, line = facts["sleep_mode"]
    for method in ("sleep", "wake_up"):
        if not any(c.endswith(f"AsyncLLM.{method}") for c in rep.checked):
            rep.bad(
                path, line, f"vllm.v1.engine.async_llm.AsyncLLM.{method}",
                f"enable_sleep_mode is set but AsyncLLM.{method} is never called: a GPU shared with the "
                "trainer stays full",
            )  # fmt: skip


# -- rule 2: collective_rpc payloads are plain
class _Types:
    """Annotations and values our code gives names, to decide whether a value is plain."""

    def __init__(self, path: str, tree: ast.Module, root: Path):
        self.path, self.root = path, root
        self.functions: dict[str, ast.AST] = {}
        self.typeddicts: dict[str, ast.ClassDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (our module file, name)
        for s in tree.body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[s.name] = s
            elif isinstance(s, ast.ClassDef) and any(_last(b) == "TypedDict" for b in s.bases):
                self.typeddicts[s.name] = s
            elif isinstance(s, ast.ImportFrom) and not s.level and s.module:
                file = root / (s.module.replace(".", "/") + ".py")
                if file.exists():
                    for a in s.names:
                        self.imports[a.asname or a.name] = (str(file), a.name)
        self._foreign: dict[str, _Types] = {}

    def _resolve(self, name: str):
        """(types of the module that defines `name`, its local name) for an imported name of ours."""
        if name not in self.imports:
            return None
        file, real = self.imports[name]
        if file not in self._foreign:
            text = Path(file).read_text()
            self._foreign[file] = _Types(file, ast.parse(text), self.root)
        return self._foreign[file], real

    def plain_type(self, ann, depth: int = 0) -> str | None:
        """None when annotation `ann` is plain, else why not."""
        if depth > 8:
            return "too deeply nested"
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            ann = ast.parse(ann.value, mode="eval").body
        if isinstance(ann, ast.Constant) and ann.value is None:
            return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return self.plain_type(ann.left, depth + 1) or self.plain_type(ann.right, depth + 1)
        if isinstance(ann, ast.Subscript) and _last(ann.value) in PLAIN_CONTAINERS:
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            for p in parts:
                if not (isinstance(p, ast.Constant) and p.value is Ellipsis):
                    why = self.plain_type(p, depth + 1)
                    if why:
                        return why
            return None
        if isinstance(ann, ast.Name):
            if ann.id in PLAIN_TYPES:
                return None
            if ann.id in self.typeddicts:
                for s in self.typeddicts[ann.id].body:
                    if isinstance(s, ast.AnnAssign):
                        why = self.plain_type(s.annotation, depth + 1)
                        if why:
                            return f"{ann.id}.{ast.unparse(s.target)}: {why}"
                return None
            found = self._resolve(ann.id)
            if found is not None:
                types, real = found
                return types.plain_type(ast.Name(real), depth + 1)
        return f"type {ast.unparse(ann)} is not plain" + (
            " (a tensor)" if "Tensor" in ast.unparse(ann) else ""
        )

    def returns(self, name: str):
        """(types, return annotation) of our function `name`, or None."""
        if name in self.functions:
            return self, self.functions[name].returns
        found = self._resolve(name)
        if found is not None and found[1] in found[0].functions:
            return found[0], found[0].functions[found[1]].returns
        return None

    def value(self, e, scope: dict, depth: int = 0) -> str | None:
        """None when expression `e` is plain, else why not. `scope`: name -> ('ann'|'value', node)."""
        if depth > 8:
            return "too deeply nested"
        if isinstance(e, (ast.Constant, ast.JoinedStr)):
            return None
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            return next((w for w in (self.value(x, scope, depth + 1) for x in e.elts) if w), None)
        if isinstance(e, ast.Dict):
            parts = [x for x in (*e.keys, *e.values) if x is not None]
            return next((w for w in (self.value(x, scope, depth + 1) for x in parts) if w), None)
        if isinstance(e, ast.Await):
            return self.value(e.value, scope, depth + 1)
        if isinstance(e, ast.Name):
            if e.id not in scope:
                return f"{e.id!r} has no annotation or value here"
            kind, node = scope[e.id]
            return self.plain_type(node) if kind == "ann" else self.value(node, scope, depth + 1)
        if isinstance(e, ast.Call):
            f = e.func
            if isinstance(f, ast.Name) and f.id in PLAIN_CALLS:
                return None
            if isinstance(f, ast.Attribute) and f.attr == "SerializeToString":
                return None  # protobuf bytes
            target = f.id if isinstance(f, ast.Name) else None
            if isinstance(f, ast.Attribute) and f.attr == "to_thread" and e.args:
                target = e.args[0].id if isinstance(e.args[0], ast.Name) else None
            found = self.returns(target) if target else None
            if found is not None and found[1] is not None:
                why = found[0].plain_type(found[1])
                return f"{target}() returns {why}" if why else None
            return f"cannot show that {ast.unparse(e)[:60]} is plain"
        return f"cannot show that {ast.unparse(e)[:60]} is plain"


def _last(e) -> str:
    return e.attr if isinstance(e, ast.Attribute) else getattr(e, "id", "")


def _scope(fn) -> dict:
    scope: dict = {}
    a = fn.args
    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        if p.annotation is not None:
            scope[p.arg] = ("ann", p.annotation)
    for n in ast.walk(fn):
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            scope[n.target.id] = ("ann", n.annotation)
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            scope.setdefault(n.targets[0].id, ("value", n.value))
    return scope


def check_rpc_payloads(rep, path: str, tree: ast.Module, root: Path) -> None:
    types = _Types(path, tree, root)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        scope = None
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and _last(call.func) == "collective_rpc"):
                continue
            scope = scope if scope is not None else _scope(fn)
            method = (
                call.args[0]
                if call.args
                else next((k.value for k in call.keywords if k.arg == "method"), None)
            )
            name = ast.unparse(method) if method is not None else "?"
            kw = {k.arg: k.value for k in call.keywords}
            args = kw.get("args", call.args[2] if len(call.args) > 2 else None)
            given = list(args.elts) if isinstance(args, ast.Tuple) else [args] if args is not None else []
            kwargs = kw.get("kwargs", call.args[3] if len(call.args) > 3 else None)
            given += [kwargs] if kwargs is not None else []
            bad = False
            for arg in given:
                why = types.value(arg, scope)
                if why:
                    bad = True
                    rep.bad(
                        path, call.lineno, "collective_rpc",
                        f"{name} argument {ast.unparse(arg)[:40]!r}: {why}; its transport is msgspec msgpack, "
                        f"which rebuilds tensors only in fields typed as tensors ({SERIAL}): pass plain "
                        "values only (bytes, str, int, float, bool, lists / dicts of them)",
                    )  # fmt: skip
            if not bad:
                rep.ok(
                    path, call.lineno, f"collective_rpc({name}) payload is plain ({len(given)} argument(s))"
                )


# -- rule 5: weights loaded into vLLM get its post-load processing
def check_post_load(rep, path: str, cls: ast.ClassDef) -> None:
    methods = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    guards = {name for name, fn in methods.items() if _refuses_quantized(fn)}
    for fn in methods.values():
        guarded_at = min(
            (c.lineno for c in ast.walk(fn) if isinstance(c, ast.Call) and _self_call(c) in guards),
            default=None,
        )
        for c in ast.walk(fn):
            if not isinstance(c, ast.Call) or not isinstance(c.func, ast.Attribute):
                continue
            if _self_call(c) == "reload_weights":
                fmt = next((k.value for k in c.keywords if k.arg == "is_checkpoint_format"), None)
                if isinstance(fmt, ast.Constant) and fmt.value is False:
                    rep.bad(
                        path, c.lineno, "Worker.reload_weights",
                        "is_checkpoint_format=False skips the layerwise reload and so "
                        "process_weights_after_loading (model_loader/reload/inplace.py)",
                    )  # fmt: skip
                else:
                    rep.ok(path, c.lineno, "reload_weights(...): vLLM's post-load processing runs")
            elif c.func.attr == "load_weights" and _last(c.func.value) == "model":
                if guarded_at is None or guarded_at > c.lineno:
                    rep.bad(
                        path, c.lineno, "model.load_weights",
                        "loads weights without vLLM's post-load processing (process_weights_after_loading: "
                        "fp8 / quantized / MoE layouts): use self.reload_weights(weights_iterator=..., "
                        "is_checkpoint_format=True) (model_loader/reload/inplace.py), or first call a method "
                        "that refuses a quantized model (checks self.model_config.quantization and raises)",
                    )  # fmt: skip
                else:
                    rep.ok(path, c.lineno, "model.load_weights after refusing quantized models")


def _self_call(c: ast.Call) -> str | None:
    f = c.func
    return f.attr if isinstance(f, ast.Attribute) and _last(f.value) == "self" else None


def _refuses_quantized(fn) -> bool:
    reads = any(
        isinstance(n, ast.Attribute)
        and n.attr == "quantization"
        and ast.unparse(n.value) == "self.model_config"
        for n in ast.walk(fn)
    )
    return reads and any(isinstance(n, ast.Raise) for n in ast.walk(fn))


# -- rule 6: the environment variables we name are vLLM's
def vllm_env_names(idx) -> set[str]:
    """The keys of `environment_variables` in vllm/envs.py (empty when the wheel has none)."""
    if ENVS_FILE not in idx.files:
        return set()
    for node in ast.parse(idx.zip.read(ENVS_FILE).decode()).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
    return set()


def check_env_names(idx, rep, path: str, tree: ast.Module) -> None:
    """Rule 6: each `VLLM_*` string in our module is an environment variable vLLM reads."""
    names: set[str] | None = None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if not re.fullmatch(r"VLLM_[A-Z0-9_]+", node.value):
            continue
        names = vllm_env_names(idx) if names is None else names
        if node.value in names:
            rep.ok(path, node.lineno, f"environment variable {node.value} ({ENVS_FILE})")
        else:
            close = difflib.get_close_matches(node.value, sorted(names), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            rep.bad(path, node.lineno, "vllm.envs", f"no environment variable {node.value!r}{hint}")
