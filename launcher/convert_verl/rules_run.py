"""Conversions of a veRL command's run settings that read several keys at once: data files -> tasksets,
over-long prompts, the GPU split between rollout engines and trainer ranks (and a reward model), logging,
checkpoint cadence and folder, and resume. Each rule takes a `Draft`, reads the keys it owns and sets
RFT Mesh keys with a comment.

Over-long prompts: veRL drops a prompt longer than `data.max_prompt_length` when it loads the data
(`data.filter_overlong_prompts=True`), else applies `data.truncation` (`error` by default: the run
stops; `left` keeps the last tokens). Here `model.enable_prompt_truncation: true` keeps the last tokens
and trains on them, `false` fails the prompt's task, which the explorer skips (no experiences, not
retried); so filtering (and `error`) map to false and `left` to true."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from launcher.convert_verl.draft import Draft
from launcher.convert_verl.table import VERL_DEFAULTS

R, D, T = "actor_rollout_ref.rollout.", "data.", "trainer."
ENGINES = {"vllm": "vllm", "sglang": "vllm", "hf": "hf"}
MONITORS = ("wandb", "tensorboard", "mlflow")
_SPLIT_NAMES = {"train", "test", "val", "valid", "validation", "dev", "eval"}


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _taskset_name(path: str, taken: set[str], suffix: str = "") -> str:
    p = PurePosixPath(path)
    stem = p.name.split(".")[0]
    name = (p.parent.name if stem.lower() in _SPLIT_NAMES and p.parent.name else stem) or "taskset"
    name = name.replace("${oc.env:", "").replace("}", "") + suffix
    out, i = name, 2
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def data(d: Draft) -> None:
    """Training and validation files -> tasksets / eval_tasksets; veRL's data layout as the format."""
    prompt_key = d.get(D + "prompt_key", "prompt")
    fmt = {"prompt_key": prompt_key, "messages_key": prompt_key}
    selector: dict[str, Any] = {"selector_type": "shuffle" if d.get(D + "shuffle", True) else "sequential"}
    if d.has(D + "seed"):
        selector["seed"] = d.get(D + "seed")
    taken: set[str] = set()
    train = _files(d.get(D + "train_files"))
    tasksets = [
        {"name": _taskset_name(f, taken), "path": f, "format": dict(fmt), "data_selector": dict(selector)}
        for f in train
    ]
    if tasksets:
        d.set("buffer.explorer_input.tasksets", tasksets, keys=(D + "train_files",))
        for i in range(len(tasksets)):
            d.comment(
                ("buffer", "explorer_input", "tasksets", i, "format"),
                "veRL rows: chat messages under the prompt key",
            )
            d.comment(
                ("buffer", "explorer_input", "tasksets", i, "data_selector"),
                d.source(D + "shuffle") or "veRL shuffles the training data by default",
            )
    v = R + "val_kwargs."
    greedy = not d.get(v + "do_sample", False)
    args = {"temperature": 0.0 if greedy else d.get(v + "temperature", 0.0)}
    if d.has(v + "top_p"):
        args["top_p"] = d.get(v + "top_p")
    if d.has(v + "top_k"):
        args["top_k"] = d.get(v + "top_k")
    evals = []
    for f in _files(d.get(D + "val_files")):
        item = {
            "name": _taskset_name(f, taken, "_eval"),
            "path": f,
            "format": dict(fmt),
            "rollout_args": args,
        }
        if d.get(v + "n", 1) != 1:
            item["repeat_times"] = d.get(v + "n")
        evals.append(item)
    if evals:
        d.set("buffer.explorer_input.eval_tasksets", evals, keys=(D + "val_files",))
        for i in range(len(evals)):
            d.comment(
                ("buffer", "explorer_input", "eval_tasksets", i, "rollout_args"),
                d.source(v + "do_sample", v + "temperature") or "veRL validates greedily by default",
            )
    if tasksets or evals:
        d.note(
            "veRL parquet rows keep the reference answer in reward_model.ground_truth: set each taskset's "
            "format.response_key to a top-level column that holds it"
        )


def prompts(d: Draft) -> None:
    """data.filter_overlong_prompts and data.truncation -> model.enable_prompt_truncation (see above)."""
    fkey, tkey, path = D + "filter_overlong_prompts", D + "truncation", "model.enable_prompt_truncation"
    mode = d.get(tkey, "error")
    if d.get(fkey, False):
        d.set(
            path,
            False,
            f"{d.source(fkey)}: an over-long prompt's task is skipped (veRL drops the prompt when it loads "
            "the data, so its steps stay full)",
            (fkey,),
        )
        if d.has(tkey):
            d.drop(tkey, f"{fkey}=True leaves no over-long prompt to truncate", warn=False, same=True)
    elif mode == "left":
        d.set(path, True, f"{d.source(tkey)}: an over-long prompt keeps its last tokens", (fkey, tkey))
    elif mode == "error":
        d.set(
            path,
            False,
            f"{d.source_or_default(tkey, mode)}: an over-long prompt is not cut; veRL stops the run, here "
            "its task is skipped",
            (fkey, tkey),
        )
    else:
        d.drop(
            tkey,
            f"over-long prompts here keep their last tokens (model.enable_prompt_truncation: true, veRL's "
            f"truncation=left) or skip their task (false); veRL's {mode!r} keeps "
            + ("the first tokens" if mode == "right" else "the first and last halves"),
        )


def gpus(d: Draft) -> None:
    """veRL shares every GPU between rollout and training; here the explorer's engines and the trainer get
    their own: a quarter of the GPUs roll out, rounded down to whole engines of tensor_parallel_size GPUs
    but at least one engine (so more than a quarter when one engine is larger), as in Trinity-RFT's
    examples; the trainer gets the rest. Where that leaves the trainer no GPU (veRL's small hybrid-engine
    examples, e.g. 2 GPUs with tensor parallel 2) the run is colocated as veRL's (`cluster.colocate`):
    GPUs // tp engines and a trainer rank on every GPU."""
    name_key, tp_key = R + "name", R + "tensor_model_parallel_size"
    name = d.get(name_key, "vllm")
    if name not in ENGINES:
        d.drop(name_key, f"engines here: {', '.join(sorted(set(ENGINES.values())))}")
    else:
        if name != ENGINES[name]:
            d.warn(f"veRL {name_key}={name}: no {name} engine here; {ENGINES[name]} is used")
        d.set(
            "explorer.rollout_model.engine_type",
            ENGINES[name],
            d.source_or_default(name_key, name),
            (name_key,),
        )
    # veRL's default tensor parallelism (2) is for vLLM/SGLang only; its hf rollout ignores the key
    default_tp = VERL_DEFAULTS[tp_key] if ENGINES.get(name) == "vllm" else 1
    tp = int(d.get(tp_key, default_tp))
    d.set(
        "explorer.rollout_model.tensor_parallel_size",
        tp,
        d.source_or_default(tp_key, tp) if d.has(tp_key) or default_tp > 1 else "",
        (tp_key,),
    )
    nodes, per = int(d.get(T + "nnodes", 1)), int(d.get(T + "n_gpus_per_node", 0) or 0)
    if d.has(T + "nnodes"):
        d.set("cluster.node_num", nodes, keys=(T + "nnodes",))
    if d.has(T + "n_gpus_per_node"):
        d.set("cluster.gpu_per_node", per, keys=(T + "n_gpus_per_node",))
    total = nodes * per
    rm_path = d.get("reward_model.model.path") if d.get("reward_model.enable", False) else None
    engines = max(1, total // 4 // tp)
    aux = max(1, total // 4) if rm_path else 0
    left = total - engines * tp - aux
    if total and left < 1 and not aux and tp <= total:
        # veRL's hybrid engine as written: the actor's ranks and the rollout engines on the same GPUs
        d.set(
            "cluster.colocate",
            True,
            f"veRL's hybrid engine: actor and rollout share the {total} GPU(s), too few to split; "
            "the engines sleep while the trainer steps",
        )
        d.set(
            "explorer.rollout_model.engine_num",
            total // tp,
            f"{total // tp} engine(s) x tensor_parallel_size {tp}",
        )
        d.set("trainer.nproc", total, f"every one of the {total} GPU(s), as veRL's actor")
        total = 0
    elif total and left < 1:
        d.warn(
            f"{total} GPU(s) cannot hold both the rollout engines and the trainer; cluster.gpu_per_node "
            "is left out (each service then sees every GPU of its machine)"
        )
        d.unset(("cluster", "gpu_per_node"))
        total = 0
    if total:
        rolling = engines * tp
        share = "a quarter" if rolling * 4 == total else str(rolling)
        split = (
            f"veRL shares every GPU between rollout and training; here {share} of the {total} GPUs roll out "
            f"({engines} engine(s) x tensor_parallel_size {tp})"
        )
        d.set("explorer.rollout_model.engine_num", engines, split)
        d.set("trainer.nproc", left, f"the {left} GPU(s) left to the trainer")
    if rm_path:
        d.set(
            "explorer.auxiliary_models",
            [
                {
                    "model_path": rm_path,
                    "engine_type": ENGINES.get(name, "hf"),
                    "engine_num": max(aux, 1),
                    "tensor_parallel_size": 1,
                }
            ],
            "reward_model.model.path (a workflow must call it to score)",
            ("reward_model.model.path", "reward_model.enable"),
        )
        d.warn(
            "veRL reward_model: declared as explorer.auxiliary_models[0]; veRL scores every response with it, "
            "here a workflow must call it (the built-in workflows score with rules or an LLM judge)"
        )


def logging_and_checkpoints(d: Draft) -> None:
    """Logger, evaluation and checkpoint cadence (veRL counts steps as this conversion does: one step =
    data.train_batch_size prompts), checkpoint folder, resume."""
    key = T + "logger"
    if d.has(key):
        value = d.get(key)
        backends = [b for b in (value if isinstance(value, list) else [value]) if b != "console"]
        chosen = [b for b in backends if b in MONITORS]
        d.set(
            "monitor.monitor_type",
            chosen[0] if chosen else "console",
            d.source(key) + " (console and JSON lines always run)",
            (key,),
        )
        for extra in backends[1 if chosen else 0 :]:
            d.warn(
                f"veRL {key}: {extra!r} has no equivalent (monitors here: console + one of {', '.join(MONITORS)})"
            )
    key = T + "test_freq"
    if d.has(key):
        freq = d.get(key)
        if isinstance(freq, int) and freq > 0:
            d.set("explorer.eval_interval", freq, keys=(key,))
        elif d.has(D + "val_files"):
            d.drop(
                key, "evaluation cannot be switched off while eval tasksets exist; see explorer.eval_interval"
            )
        else:
            d.drop(key, "there are no eval tasksets", warn=False, same=True)
    elif d.has(D + "val_files"):
        d.note(
            f"veRL default {key}=-1 validates only before training (trainer.val_before_train); here the eval "
            "tasksets also run every explorer.eval_interval steps (100 unless set)"
        )
    key = T + "save_freq"
    if d.has(key):
        freq = d.get(key)
        if isinstance(freq, int) and freq > 0:
            d.set("trainer.save_interval", freq, keys=(key,))
        else:
            d.set(
                "trainer.save_interval",
                0,
                f"{d.source(key)}: 0 = no checkpoint every N steps; the end of the run still saves one",
                (key,),
            )
            d.warn(
                f"veRL {key}={d.args[key].text} never saves a checkpoint; here trainer.save_interval 0 saves "
                "none every N steps, but the trainer still saves one at the end of the run (with its "
                "Hugging Face export, trainer.save_hf_checkpoint) and whenever the batches trained since the "
                "last one would fill half the buffer (a checkpoint is what marks experiences consumed)"
            )
    key = T + "default_local_dir"
    if d.has(key):
        path = str(d.get(key)).rstrip("/")
        tail = (
            f"/{d.args[T + 'project_name'].value}/{d.args[T + 'experiment_name'].value}"
            if (d.has(T + "project_name") and d.has(T + "experiment_name"))
            else None
        )
        if tail and path.endswith(tail) and len(path) > len(tail):
            d.set("checkpoint_root_dir", path[: -len(tail)], keys=(key,))
        else:
            d.drop(key, "checkpoints go to checkpoint_root_dir/project/name")
    key = T + "resume_mode"
    if d.has(key):
        mode = d.get(key)
        if mode in ("auto", "disable"):
            d.set("continue_from_checkpoint", mode == "auto", keys=(key,))
        else:
            d.drop(key, "runs resume from their own job folder (continue_from_checkpoint)")


RUN_RULES = (data, prompts, gpus, logging_and_checkpoints)
# the veRL keys these rules convert (tests/unit/launch/test_convert_verl_keys.py has a row for each)
RUN_KEYS = (
    *(D + k for k in ("train_files", "val_files", "prompt_key", "shuffle", "seed")),
    *(R + "val_kwargs." + k for k in ("do_sample", "temperature", "top_p", "top_k", "n")),
    D + "filter_overlong_prompts",
    D + "truncation",
    R + "name",
    R + "tensor_model_parallel_size",
    T + "nnodes",
    T + "n_gpus_per_node",
    "reward_model.enable",
    "reward_model.model.path",
    T + "logger",
    T + "test_freq",
    T + "save_freq",
    T + "default_local_dir",
    T + "resume_mode",
)
