"""`rft serve tinker` SIGKILLed between forward_backward and optim_step, then restarted on the same
port: the client's next call fails clearly, and a client resumed from the last checkpoint continues
from that checkpoint's step (the lost gradients are gone; no step is applied twice)."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import tinker
from tinker import types

from tests.support.redis_server import free_port

from .conftest import API_KEY, start_server

pytestmark = pytest.mark.timeout(300)


def test_sigkill_between_forward_backward_and_optim_step(tmp_path) -> None:
    tokens = [5, 6, 7, 8, 9]
    d = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.array(tokens[1:]), "weights": np.ones(4, dtype=np.float32)},
    )
    adam = types.AdamParams(learning_rate=1e-3)
    port = free_port()
    proc, url = start_server(tmp_path, port)
    try:
        sc = tinker.ServiceClient(base_url=url, api_key=API_KEY)
        tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
        tc.forward_backward([d], "cross_entropy").result()
        assert tc.optim_step(adam).result().metrics["step:max"] == 1
        path = tc.save_state("after-1").result().path
        tc.forward_backward([d], "cross_entropy").result()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, url2 = start_server(tmp_path, port)
        assert url2 == url
        with pytest.raises(tinker.RequestFailedError, match="unknown model_id"):
            tc.optim_step(adam).result()
        sc2 = tinker.ServiceClient(base_url=url, api_key=API_KEY)
        resumed = sc2.create_training_client_from_state_with_optimizer(path).result()
        resumed.forward_backward([d], "cross_entropy").result()
        assert resumed.optim_step(adam).result().metrics["step:max"] == 2  # step 1 once, then this one
    finally:
        proc.kill()
        proc.wait()
