"""The `vllm` engine checked against the pinned vLLM release on a machine without vLLM or a GPU.

`scripts/check_vllm_api.py` downloads the pinned wheel once (cached), parses its sources and ours with
`ast` and reports every use that release does not have. The real engine must check clean; snippets with
uses that do not exist must be reported, file:line and vLLM symbol named (so the check can fail).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
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
        "model.load_weights(...) against",
        "worker extension WeightSyncExtension vs vllm.v1.worker.gpu_worker.Worker",
    ):
        assert use in checked, f"{use} was not checked:\n{checked}"


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
            "import vllm\nvllm.LLM('m', tensor_paralel_size=2)\n",
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
            args = vllm.AsyncEngineArgs(model="m", worker_extension_cls="ext.Sync")
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
    assert len(found) == 5, found
    text = "\n".join(found)
    assert "ext.py:1: vllm.v1.worker.gpu_worker.Worker.load_model: the worker extension redefines it" in text
    assert "ext.py:6: vllm.v1.worker.gpu_worker.Worker: has no attribute 'no_such_worker_attr'" in text
    assert "ext.py:3: model.load_weights: 1 of" in text and "BgeM3EmbeddingModel" in text
    assert "snippet.py:8: Sync.sync_weights: takes 1 positional argument(s), 2 given" in text
    assert (
        "snippet.py:9: collective_rpc: no worker method 'sync_weigths' (did you mean 'sync_weights'?)" in text
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
