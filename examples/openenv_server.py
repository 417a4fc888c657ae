"""An OpenEnv environment server to train against: guess a number in a few tries.

Written with OpenEnv's own server kit (`openenv.core.env_server`: the `Environment` base class, the
pydantic `Action` / `Observation` models and `create_app`, which serves HTTP and the `/ws` sessions
that clients keep one episode on), as any OpenEnv environment is. `examples/openenv.yaml` trains on it
with the `openenv` workflow:

    python examples/openenv_server.py --port 8765 &
    rft run --config examples/openenv.yaml

The episode: reset (with a `seed`) picks a number in [low, high]; each action `{"message": text}` is a
guess (the first integer of the text). A well-formed guess earns `format_reward` (a per-turn reward),
a wrong one is answered "higher" or "lower", the right one ends the episode with reward 1; after
`max_steps` guesses the episode ends with 0. `--port 0` takes a free port; the server prints
`port=<N>` on its first line either way.
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import sys
from typing import Any

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

LOW, HIGH, MAX_STEPS, FORMAT_REWARD = 1, 9, 4, 0.1


class GuessAction(Action):
    message: str = Field(..., description="the guess, as text")


class GuessObservation(Observation):
    prompt: str = Field(default="", description="what the game says")
    guesses: int = Field(default=0, description="guesses made so far")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session gets its own instance

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.target = LOW

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self.target = random.Random(seed).randint(LOW, HIGH)
        self._state = State(episode_id=episode_id, step_count=0)
        prompt = f"Guess my number between {LOW} and {HIGH}. You have {MAX_STEPS} tries."
        return GuessObservation(prompt=prompt, reward=0.0, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        steps = self._state.step_count
        found = re.search(r"-?\d+", action.message)
        if found is None:
            return self._answer("Say a number.", 0.0, steps >= MAX_STEPS)
        guess = int(found.group())
        if guess == self.target:
            return self._answer("Correct!", 1.0, True)
        hint = "Higher." if guess < self.target else "Lower."
        return self._answer(hint, FORMAT_REWARD, steps >= MAX_STEPS)

    def _answer(self, prompt: str, reward: float, done: bool) -> GuessObservation:
        return GuessObservation(prompt=prompt, guesses=self._state.step_count, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess_number", max_concurrent_envs=64
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"port={sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
