"""Reading veRL scripts: continuations, comments, quotes, variables, several commands; Hydra values."""

from __future__ import annotations

import pytest

from launcher.convert_verl.overrides import parse_override, parse_value
from launcher.convert_verl.shell import ShellSyntaxError, read_commands, verl_commands


def _args(script: str) -> list[str]:
    [cmd] = verl_commands(script)
    return cmd.args


def test_continuations_comments_and_indentation():
    script = (
        "#!/bin/bash\n"
        "# train\n"
        "set -x\n"
        "python3 -m verl.trainer.main_ppo \\\n"
        "    data.train_batch_size=8 \\\n"
        "\tactor_rollout_ref.rollout.n=4   # group size\n"
        "echo done\n"
    )
    [cmd] = verl_commands(script)
    assert cmd.args == ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4"]
    assert cmd.line == 4


def test_variables_set_earlier_are_substituted_in_order():
    script = (
        "MODEL=/models/qwen\n"
        "export DATA=/data\n"
        "N=4\n"
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL "
        "data.train_files=${DATA}/train.parquet actor_rollout_ref.rollout.n=${N}\n"
        "MODEL=/other\n"
    )
    assert _args(script) == [
        "actor_rollout_ref.model.path=/models/qwen",
        "data.train_files=/data/train.parquet",
        "actor_rollout_ref.rollout.n=4",
    ]


def test_unset_variables_become_env_interpolations():
    args = _args("python -m verl.trainer.main_ppo a.b=$HOME/x c.d=${CKPT:-/tmp/ck} e.f=${HOME}")
    assert args == ["a.b=${oc.env:HOME}/x", "c.d=${oc.env:CKPT,/tmp/ck}", "e.f=${oc.env:HOME}"]


def test_quotes_single_literal_double_expanded_escapes():
    script = (
        "X=1\n"
        "python3 -m verl.trainer.main_ppo a.b='$X' c.d=\"$X and ${X}\" e.f=\\$X "
        'g.h="say \\"hi\\"" trainer.logger=\'["console","wandb"]\'\n'
    )
    assert _args(script) == [
        "a.b=$X",
        "c.d=1 and 1",
        "e.f=$X",
        'g.h=say "hi"',
        'trainer.logger=["console","wandb"]',
    ]


def test_list_variable_with_quoted_paths():
    script = (
        "train=$HOME/data/train.parquet\n"
        "files=\"['$train', '/abs/b.parquet']\"\n"
        'python3 -m verl.trainer.main_ppo data.train_files="$files"\n'
    )
    [arg] = _args(script)
    o = parse_override(arg)
    assert o is not None and o.value == ["${oc.env:HOME}/data/train.parquet", "/abs/b.parquet"]


def test_several_commands_and_entry_points():
    script = (
        "python3 examples/data_preprocess/gsm8k.py --local_dir x && python3 -m verl.trainer.main_ppo a.b=1\n"
        "python3 verl/trainer/main_ppo.py a.b=2; echo between\n"
        "torchrun --nproc_per_node 8 -m verl.trainer.main_ppo a.b=3 | tee log.txt\n"
    )
    assert [c.args for c in verl_commands(script)] == [["a.b=1"], ["a.b=2"], ["a.b=3"]]
    assert [c.line for c in verl_commands(script)] == [1, 2, 3]


def test_positional_arguments_and_command_substitution_are_reported():
    script = "NOW=$(date +%s)\npython3 -m verl.trainer.main_ppo trainer.experiment_name=run_$NOW $@\n"
    [cmd] = verl_commands(script)
    assert cmd.args == ["trainer.experiment_name=run_${oc.env:NOW}"]
    assert any("NOW is set by a command substitution" in n for n in cmd.notes)
    assert any("$@" in n for n in cmd.notes)


def test_no_verl_command_and_unclosed_quote():
    assert verl_commands("echo 'python3 -m verl.trainer.main_ppo' is not run here\n") == []
    with pytest.raises(ShellSyntaxError, match="line 2: unclosed double quote"):
        read_commands('A=1\npython3 -m verl.trainer.main_ppo a.b="x\n')


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1024", 1024),
        ("1e-6", 1e-6),
        ("0.6", 0.6),
        ("True", True),
        ("false", False),
        ("null", None),
        ("vllm", "vllm"),
        ("'007'", "007"),
        ("[a,b]", ["a", "b"]),
        ("[]", []),
        ("['x, y', 2]", ["x, y", 2]),
        ("[[1,2],[3]]", [[1, 2], [3]]),
        ("{a: 1, b: [x]}", {"a": 1, "b": ["x"]}),
        ("${oc.env:A,1}/b", "${oc.env:A,1}/b"),
        ("[${oc.env:A,1}/b]", ["${oc.env:A,1}/b"]),
    ],
)
def test_hydra_values(text, value):
    assert parse_value(text) == value


def test_hydra_override_forms():
    plus = parse_override("+actor_rollout_ref.actor.optim.betas=[0.9,0.95]")
    assert plus is not None and plus.added and plus.key == "actor_rollout_ref.actor.optim.betas"
    assert plus.value == [0.9, 0.95] and plus.text == "[0.9,0.95]"
    force = parse_override("++trainer.seed=3")
    assert force is not None and force.added and force.value == 3
    plain = parse_override("data.truncation=error")
    assert plain is not None and not plain.added and plain.value == "error"
    assert parse_override("~trainer.logger") is None
    assert parse_override("--config-name=ppo_megatron_trainer") is None
