"""The `vllm` engine checked against the pinned vLLM release on a machine without vLLM or a GPU.

`scripts/check_vllm_api.py` downloads the pinned wheel once (cached), parses its sources and ours with
`ast` and reports every use that release does not have. The real engine must check clean; snippets with
uses that do not exist must be reported, file:line and vLLM symbol named (so the check can fail).
Each behaviour rule (scripts/vllm_api_rules.py) holds on the engine and fails on a snippet that breaks it,
and each premise it rests on fails on a wheel whose source no longer says so.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check_vllm_api.py"


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_vllm_api", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


chk = _load_checker()
import vllm_api_rules as rules  # noqa: E402  (scripts/ is on the path once the checker is loaded)


@pytest.fixture(scope="module")
def index():
    version = chk.pinned_version()
    try:
        wheel, _ = chk.fetch_wheel(version, chk.default_cache())
    except chk.WheelUnavailable as exc:
        pytest.skip(f"the vllm=={version} wheel cannot be downloaded here (no network?): {exc}")
    return chk.VllmIndex(wheel)


def _check(index, tmp_path: Path, code: str, **modules: str):
    """Mismatches of `code` (as tmp_path/snippet.py), with `modules` (dotted name -> source) beside it."""
    for name, text in modules.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(code))
    return [str(m) for m in chk.check_files(index, [snippet], root=tmp_path).mismatches]


@pytest.mark.slow  # ~15 s: it also reads every vLLM model class's `load_weights`
def test_engine_matches_the_pinned_vllm(index):
    rep = chk.check_files(index, chk.vllm_users())
    assert rep.mismatches == [], "\n".join(map(str, rep.mismatches))
    assert rep.modules == ["services/explorer/engines/vllm.py", "services/explorer/engines/vllm_worker.py"]
    checked = "\n".join(rep.checked)
    for use in (
        "AsyncEngineArgs(worker_extension_cls=...)",
        "AsyncEngineArgs(logprobs_mode=...)",
        "SamplingParams(logprobs=...)",
        "AsyncLLM.from_engine_args",
        "AsyncLLM.generate",
        "CompletionOutput.logprobs",
        "collective_rpc('rft_receive') -> WeightSyncExtension.rft_receive",
        "Worker.model_runner",
        "worker extension WeightSyncExtension vs vllm.v1.worker.gpu_worker.Worker",
        # behaviour rules
        "SamplingParams(n=..., output_kind=FINAL_ONLY)",
        "AsyncEngineArgs(logprobs_mode='processed_logprobs') = the trainer's log-probs",
        "collective_rpc('rft_load_shared') payload is plain (1 argument(s))",
        "collective_rpc('rft_join_group') payload is plain (4 argument(s))",
        "collective_rpc('rft_receive') payload is plain (3 argument(s))",
        "AsyncLLM.sleep(level=...)",
        "AsyncLLM.wake_up",
        "reload_weights(...): vLLM's post-load processing runs",
        "environment variable VLLM_USE_V2_MODEL_RUNNER (vllm/envs.py)",  # the V1 runner pinned on a GPU
        "environment variable VLLM_CPU_KVCACHE_SPACE (vllm/envs.py)",
    ):
        assert use in checked, f"{use} was not checked:\n{checked}"
    assert checked.count(": premise ") == len(rules.PREMISES)


def test_a_misspelled_sampling_keyword_is_reported(index, tmp_path):
    found = _check(
        index,
        tmp_path,
        "from vllm import SamplingParams\n\n\ndef f():\n    return SamplingParams(temprature=1.0)\n",
    )
    assert found == [
        "snippet.py:5: vllm.sampling_params.SamplingParams: no parameter or field 'temprature'"
        " (did you mean 'temperature'?)"
    ]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("from vllm import SamplingParms\n", "snippet.py:1: vllm: has no 'SamplingParms'"),
        (
            "import vllm\nvllm.LLM('m', tensor_paralel_size=2, logprobs_mode='processed_logprobs')\n",
            "vllm.entrypoints.llm.LLM: no parameter or field",
        ),
        (
            "import vllm\nvllm.AsyncEngineArgs(model='m', logprobs_mode='processed')\n",
            "AsyncEngineArgs: logprobs_mode='processed' is not one of",
        ),
        (
            "from vllm.v1.engine.async_llm import AsyncLLM\n\n\nasync def f(a):\n"
            "    llm = AsyncLLM.from_engine_args(a)\n    await llm.reset_cache()\n",
            "snippet.py:6: vllm.v1.engine.async_llm.AsyncLLM: has no attribute 'reset_cache'",
        ),
        (
            "from vllm.v1.engine.async_llm import AsyncLLM\n\n\nasync def f(a):\n"
            "    out = None\n    async for out in AsyncLLM.from_engine_args(a).generate('p', None, 'id'):\n"
            "        pass\n    return out.outputs[0].token_ids, out.output\n",
            "snippet.py:8: vllm.outputs.RequestOutput: has no attribute 'output'",
        ),
        (
            "from vllm.v1.engine.async_llm import AsyncLLM\n\n\nasync def f(a, p, sp):\n"
            "    async for o in AsyncLLM.from_engine_args(a).generate(p, sp):\n        pass\n",
            "snippet.py:5: vllm.v1.engine.async_llm.AsyncLLM.generate: missing required argument(s) 'request_id'",
        ),
        (
            "import os\nimport vllm\nos.environ.setdefault('VLLM_USE_V1_MODEL_RUNNER', '1')\n",
            "snippet.py:3: vllm.envs: no environment variable 'VLLM_USE_V1_MODEL_RUNNER' (did you mean "
            "'VLLM_USE_V2_MODEL_RUNNER'?)",
        ),
    ],
)
def test_other_mismatches_are_reported(index, tmp_path, code, expected):
    found = _check(index, tmp_path, code)
    assert len(found) == 1 and expected in found[0], found


def test_worker_extension_and_collective_rpc_are_checked(index, tmp_path):
    engine = """\
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM


        async def run():
            args = vllm.AsyncEngineArgs(
                model="m", worker_extension_cls="ext.Sync", logprobs_mode="processed_logprobs"
            )
            llm = AsyncLLM.from_engine_args(args)
            await llm.collective_rpc("sync_weights", args=(1, 2))
            await llm.collective_rpc("sync_weigths")
        """
    extension = """\
        class Sync:
            def sync_weights(self, version):
                return self.model_runner.model.load_weights(weights=[])

            def load_model(self):
                return self.no_such_worker_attr
        """
    found = _check(index, tmp_path, engine, ext=extension)
    assert len(found) == 6, found
    text = "\n".join(found)
    assert "ext.py:3: model.load_weights: loads weights without vLLM's post-load processing" in text
    assert "ext.py:1: vllm.v1.worker.gpu_worker.Worker.load_model: the worker extension redefines it" in text
    assert "ext.py:6: vllm.v1.worker.gpu_worker.Worker: has no attribute 'no_such_worker_attr'" in text
    assert "ext.py:3: model.load_weights: 1 of" in text and "BgeM3EmbeddingModel" in text
    assert "snippet.py:10: Sync.sync_weights: takes 1 positional argument(s), 2 given" in text
    assert (
        "snippet.py:11: collective_rpc: no worker method 'sync_weigths' (did you mean 'sync_weights'?)"
        in text
    )


def test_the_script_exits_non_zero_naming_file_line_and_symbol(index, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import vllm\n\nvllm.SamplingParams(n=1, temprature=1.0)\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bad.py:3: vllm.sampling_params.SamplingParams: no parameter or field 'temprature'" in done.stdout
    assert f"vLLM {index.version}" in done.stdout and "1 mismatch(es)" in done.stdout


# -- behaviour rules (scripts/vllm_api_rules.py): each fails on a snippet that breaks it
ENGINE_HEAD = "import vllm\nfrom vllm.sampling_params import RequestOutputKind\n\n\n"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("vllm.SamplingParams(n=4, logprobs=0)", "n=4 with no output_kind: vLLM streams each of the n samples"),
        ("vllm.SamplingParams(n=k, output_kind=RequestOutputKind.CUMULATIVE)",
         "n=k with output_kind=RequestOutputKind.CUMULATIVE"),
        ("vllm.AsyncEngineArgs(model='m')", "logprobs_mode is not set"),
        ("vllm.AsyncEngineArgs(model='m', logprobs_mode='raw_logprobs')",
         "logprobs_mode='raw_logprobs': the trainer computes log_softmax(logits / T)"),
        ("vllm.LLM('m')", "vllm.entrypoints.llm.LLM: logprobs_mode is not set"),
    ],
)  # fmt: skip
def test_sampling_and_logprobs_rules_fail_on_a_breaking_call(index, tmp_path, call, expected):
    found = _check(index, tmp_path, f"{ENGINE_HEAD}def f(k):\n    return {call}\n")
    assert len(found) == 1 and expected in found[0] and found[0].startswith("snippet.py:6: "), found


@pytest.mark.parametrize(
    "call",
    [
        "vllm.SamplingParams(n=1)",
        "vllm.SamplingParams(temperature=0.5)",
        "vllm.SamplingParams(n=k, output_kind=RequestOutputKind.FINAL_ONLY)",
        "vllm.AsyncEngineArgs(model='m', logprobs_mode='processed_logprobs')",
    ],
)
def test_sampling_and_logprobs_rules_pass_a_right_call(index, tmp_path, call):
    assert _check(index, tmp_path, f"{ENGINE_HEAD}def f(k):\n    return {call}\n") == []


PLAIN = """\
    from typing import TypedDict

    import torch


    class Payload(TypedDict):
        path: str
        names: list[list[str | list[int]]]


    async def send(llm, version: int, info, p: Payload, t: torch.Tensor, named_tensors):
        named = [(n, x.detach().cpu()) for n, x in named_tensors]
        await llm.collective_rpc("a", args=(version, b"x", info.SerializeToString(), p, [1, "s"]))
        await llm.collective_rpc("b", args=(named,))
        await llm.collective_rpc("c", args=(version, t))
        await llm.collective_rpc("d", kwargs={"w": t.tolist()})
    """


def test_collective_rpc_payloads_must_be_plain(index, tmp_path):
    found = _check(index, tmp_path, PLAIN)
    assert len(found) == 3, found
    assert found[0].startswith("snippet.py:14: collective_rpc: 'b' argument 'named': cannot show that [(n, x")
    assert "rebuilds tensors only in fields typed as tensors" in found[0]
    assert found[1].startswith(
        "snippet.py:15: collective_rpc: 'c' argument 't': type torch.Tensor is not plain"
    )
    assert "(a tensor)" in found[1]
    assert found[2].startswith("snippet.py:16: collective_rpc: 'd' argument") and "t.tolist()" in found[2]


def test_a_payload_type_from_another_module_of_ours_is_followed(index, tmp_path):
    shared = "from typing import TypedDict\n\n\nclass P(TypedDict):\n    path: str\n    t: 'torch.Tensor'\n"
    code = (
        "from pkg.shared import P, make\n\n\nasync def send(llm, named):\n    p: P = make()\n"
        "    await llm.collective_rpc('a', args=(p,))\n    await llm.collective_rpc('b', args=(make(),))\n"
    )
    found = _check(index, tmp_path, code, **{"pkg.shared": shared + "\n\ndef make() -> P:\n    ...\n"})
    assert len(found) == 2, found
    assert all("P.t: type torch.Tensor is not plain (a tensor)" in f for f in found), found


SLEEPY = """\
    import vllm
    from vllm.v1.engine.async_llm import AsyncLLM


    async def run(sleep_too: bool):
        args = vllm.AsyncEngineArgs(model="m", logprobs_mode="processed_logprobs", enable_sleep_mode=True)
        llm = AsyncLLM.from_engine_args(args)
        if sleep_too:
            await llm.sleep(level=1)
    """


def test_sleep_mode_needs_sleep_and_wake_up(index, tmp_path):
    found = _check(index, tmp_path, SLEEPY)
    assert found == [
        "snippet.py:6: vllm.v1.engine.async_llm.AsyncLLM.wake_up: enable_sleep_mode is set but "
        "AsyncLLM.wake_up is never called: a GPU shared with the trainer stays full"
    ]
    woken = SLEEPY + "        await llm.wake_up()\n"
    assert _check(index, tmp_path, woken) == []
    misspelled = SLEEPY.replace("llm.sleep(level=1)", "llm.sleep(levle=1)") + "        await llm.wake_up()\n"
    found = _check(index, tmp_path, misspelled)
    assert len(found) == 1 and "AsyncLLM.sleep: no parameter or field 'levle'" in found[0], found


LOADER = """\
    import vllm


    def engine():
        return vllm.AsyncEngineArgs(model="m", logprobs_mode="processed_logprobs", worker_extension_cls="ext.W")
    """
EXTENSION = """\
    class W:
        def rft_full(self, weights):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)

        def rft_kernel_format(self, weights):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=False)

        def rft_direct(self, weights):
            self.model_runner.model.load_weights(weights)

        def rft_guarded(self, weights):
            self._rft_unquantized()
            self.model_runner.model.load_weights(weights)

        def rft_guard_too_late(self, weights):
            self.model_runner.model.load_weights(weights)
            self._rft_unquantized()

        def _rft_unquantized(self):
            if self.model_config.quantization is not None:
                raise RuntimeError("quantized")
    """


def test_weight_loads_need_post_load_processing_or_an_unquantized_model(index, tmp_path):
    found = _check(index, tmp_path, LOADER, ext=EXTENSION)
    assert len(found) == 3, found
    assert found[0].startswith("ext.py:6: Worker.reload_weights: is_checkpoint_format=False skips")
    for f, line in zip(found[1:], (9, 16), strict=True):
        assert f.startswith(f"ext.py:{line}: model.load_weights: loads weights without vLLM's post-load"), f


def _wheel_with(index, tmp_path, file: str, old: str, new: str) -> Path:
    """A copy of the premises' files of the pinned wheel, with `old` replaced by `new` in `file`."""
    fake = tmp_path / "vllm-0.33.0-fake.whl"
    with zipfile.ZipFile(fake, "w") as z:
        for name in sorted({p.file for p in rules.PREMISES}):
            text = index.zip.read(name).decode()
            if name == file:
                assert old in text
                text = text.replace(old, new)
            z.writestr(name, text)
    return fake


@pytest.mark.parametrize(
    ("file", "old", "new", "expected"),
    [
        ("vllm/v1/engine/parallel_sampling.py", "!= RequestOutputKind.FINAL_ONLY", "is None",
         "ParentRequest.get_outputs: no longer has '!= RequestOutputKind.FINAL_ONLY'"),
        ("vllm/v1/serial_utils.py", "if t is slice:", "if issubclass(t, list):\n                return obj\n"
         "            if t is slice:", None),
        ("vllm/config/vllm.py", "if use_v2_model_runner is not None:", "if use_v2_model_runner:",
         "VllmConfig.use_v2_model_runner: no longer has 'if use_v2_model_runner is not None:'"),
        ("vllm/v1/serial_utils.py", "issubclass(t, torch.Tensor)", "t is torch.Tensor",
         "MsgpackDecoder.dec_hook: no longer has 'issubclass(t, torch.Tensor)'"),
        ("vllm/model_executor/model_loader/reload/layerwise.py",
         "quant_method.process_weights_after_loading(layer)\n        # Re-reconcile", "pass\n        # Re-reconcile",
         "_layerwise_process: no longer has 'quant_method.process_weights_after_loading(layer)'"),
    ],
)  # fmt: skip
def test_a_premise_fails_on_a_wheel_that_no_longer_says_so(index, tmp_path, file, old, new, expected):
    fake = chk.VllmIndex(_wheel_with(index, tmp_path, file, old, new))
    rep = chk.Report()
    rules.check_premises(fake, rep)
    found = [str(m) for m in rep.mismatches]
    if expected is None:  # a change that keeps the premise
        assert found == [], found
    else:
        assert len(found) == 1 and found[0].startswith(file) and expected in found[0], found


def test_every_premise_holds_on_the_pinned_wheel(index):
    rep = chk.Report()
    rules.check_premises(index, rep)
    assert rep.mismatches == [] and len(rep.checked) == len(rules.PREMISES)
