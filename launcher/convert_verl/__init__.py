"""Convert veRL launch scripts (`python3 -m verl.trainer.main_ppo key=value ...`) into RFT Mesh run
configs: shell.py reads the script, overrides.py the Hydra values, table.py, rules_training.py and rules_run.py map the keys,
draft.py writes the YAML, convert.py puts it together and checks the result loads."""

from launcher.convert_verl.convert import (
    Conversion,
    ConversionError,
    NoVerlCommandError,
    convert_command,
    convert_script,
)
from launcher.convert_verl.shell import ShellSyntaxError

__all__ = [
    "Conversion",
    "ConversionError",
    "NoVerlCommandError",
    "ShellSyntaxError",
    "convert_command",
    "convert_script",
]
