"""`textarena`: text games of TextArena (`textarena` on PyPI) as multi-turn episodes.

`TextArenaEnvironment` is a `multi_turn` environment (multi_turn.py does the turns, the masks and the
rewards) over one game made by `textarena.make(game, **game_args)`, e.g. `GuessTheNumber-v0-raw`,
`TowerOfHanoi-v0-raw`, `Blackjack-v0-raw`: single-player games need no opponent and no API key (word
games such as Hangman need nltk corpora, a download: their reset fails with an error saying so).
The model is player `player_id` of `num_players` (1: single-player games).
- reset: `env.reset(num_players, seed)`, the seed being the row's `seed`, else `seed` of the
  environment's arguments, else the row's index, so the samples of a GRPO group play the same game;
  the game's prompt is the first observation.
- step: the model's whole turn is the action; the observation shown next is the game's new messages
  (its own echo of the action left out). A `-raw` game id gives the messages as they are; a game with
  TextArena's default wrappers gives its full rendered history each turn instead.
- rewards: per turn, `invalid_move_reward` (default 0) when the game refused the move (it tells the
  player so and lets it try again, up to its error allowance); at the end, the game's own reward for
  the player (`env.close()`; e.g. 1 for a win, a completion fraction otherwise). The game's reason
  goes into the Experience's `info`.

TextArena seeds Python's global `random`; each episode keeps its own `random` state, swapped in around
every call into the game, so episodes do not disturb each other or the process.

`workflow_type: textarena` is `multi_turn` over this environment with its arguments (`game`,
`game_args`, `num_players`, `player_id`, `seed`, `invalid_move_reward`) in `workflow_args`. The
library is the optional extra `rft-mesh[textarena]`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from services.common.extras import import_extra
from services.explorer.tasks import Task
from services.explorer.workflows.base import WORKFLOWS
from services.explorer.workflows.multi_turn import ENVIRONMENTS, MultiTurnWorkflow

MISSING = (
    "the textarena environment needs TextArena, which is not installed here: install the `textarena` "
    "extra (`uv pip install -e '.[textarena]' -c requirements/constraints.txt`)"
)

T = TypeVar("T")


@ENVIRONMENTS.register("textarena")
class TextArenaEnvironment:
    """One game of TextArena (see the module docstring)."""

    def __init__(
        self,
        game: str = "GuessTheNumber-v0-raw",
        game_args: Mapping[str, Any] | None = None,
        num_players: int = 1,
        player_id: int = 0,
        seed: int | None = None,
        invalid_move_reward: float = 0.0,
    ):
        self.ta = import_extra("textarena", MISSING)
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=3)
            raise ValueError(
                f"TextArena has no game {game!r}" + (f"; did you mean {close}?" if close else "")
            )
        self.game, self.game_args = game, dict(game_args or {})
        self.num_players, self.player_id, self.seed = int(num_players), int(player_id), seed
        self.invalid_move_reward = float(invalid_move_reward)
        self.env: Any = None
        self.closed = False
        self.rewards: Mapping[int, float] | None = None
        self.game_info: Mapping[Any, Any] = {}
        self._rng = random.Random().getstate()

    def _in_own_random(self, fn: Callable[[], T]) -> T:
        outer = random.getstate()
        random.setstate(self._rng)
        try:
            return fn()
        finally:
            self._rng = random.getstate()
            random.setstate(outer)

    def _observation(self) -> tuple[str, bool]:
        """The player's new messages as text, and whether one of them refuses its last move."""
        player, messages = self.env.get_observation()
        if player != self.player_id:
            raise RuntimeError(
                f"TextArena game {self.game!r} asks player {player} to move; the model is player "
                f"{self.player_id} and this adapter plays no opponent (use a single-player game)"
            )
        if isinstance(messages, str):  # a wrapped game renders its own text
            return messages.strip(), False
        kinds = self.ta.ObservationType
        lines, refused = [], False
        for sender, text, kind in messages:
            if sender == self.player_id and kind == kinds.PLAYER_ACTION:
                continue  # the game's echo of what the model just said
            refused |= kind == kinds.GAME_ADMIN
            lines.append(str(text).strip())
        return "\n".join(line for line in lines if line), refused

    def reset(self, task: Task) -> str:
        seed = task.raw.get("seed", self.seed if self.seed is not None else task.index)
        self._rng = random.Random(seed).getstate()

        def start() -> str:
            self.env = self.ta.make(self.game, **self.game_args)
            try:
                self.env.reset(num_players=self.num_players, seed=int(seed))
            except LookupError as exc:  # nltk corpora (word games) are downloads; nothing is fetched here
                raise RuntimeError(
                    f"TextArena game {self.game!r} needs data that is not on this machine (it would "
                    f"download it): {str(exc).strip()[:300]}; choose a game without downloads, e.g. "
                    "GuessTheNumber-v0-raw, TowerOfHanoi-v0-raw, Blackjack-v0-raw"
                ) from exc
            return self._observation()[0]

        return self._in_own_random(start)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, str]]:
        def play() -> tuple[str, float, bool, dict[str, str]]:
            done, step_info = self.env.step(action)
            info = {str(k): str(v) for k, v in dict(step_info or {}).items()}
            if done:
                return "", self._finish(), True, info | self._final_info()
            text, refused = self._observation()
            return text, self.invalid_move_reward if refused else 0.0, False, info

        return self._in_own_random(play)

    def _finish(self) -> float:
        self.rewards, self.game_info = self.env.close()
        self.closed = True
        return float((self.rewards or {}).get(self.player_id, 0.0))

    def _final_info(self) -> dict[str, str]:
        mine = dict(self.game_info.get(self.player_id, {})) if isinstance(self.game_info, Mapping) else {}
        return {f"game_{k}": str(v) for k, v in mine.items()}

    def close(self) -> None:
        if self.env is not None and not self.closed:
            self._in_own_random(self.env.close)
            self.closed = True


@WORKFLOWS.register("textarena")
class TextArenaWorkflow(MultiTurnWorkflow):
    """`multi_turn` over a TextArena game, its arguments in `workflow_args`."""

    default_env = "textarena"
    default_max_turns = 10
    env_arg_names = ("game", "game_args", "num_players", "player_id", "seed", "invalid_move_reward")
