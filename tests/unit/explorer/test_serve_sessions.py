"""The served endpoint's session store: multi-turn sequences with masks, groups of n choices, rewards,
and the exactly-once commit (services/explorer/serve/sessions.py)."""

from __future__ import annotations

import pytest
import torch

from services.explorer.serve.sessions import Call, Choice, SessionError, SessionStore


def _choice(i: int, tokens: list[int], version: int = 0, finish: str = "stop") -> Choice:
    return Choice(i, tokens, [-0.5 - t / 100 for t in tokens], version, finish, text=f"c{i}")


def test_an_agent_loop_is_one_experience_with_only_the_model_tokens_masked_in():
    store = SessionStore("ex")
    store.record("s", Call("c1", [1, 2, 3], [_choice(0, [10, 11], version=1)]))
    # the next prompt = history + answer + a tool/user turn [20, 21]
    store.record("s", Call("c2", [1, 2, 3, 10, 11, 20, 21], [_choice(0, [12], version=2, finish="length")]))
    store.feedback(0.75, session_id="s")
    [exp], sessions = store.begin_commit(["s"])
    assert exp.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 12]
    assert exp.prompt_length == 3
    assert exp.action_mask.tolist() == [True, True, False, False, True]
    assert torch.allclose(exp.logprobs, torch.tensor([-0.6, -0.61, 0.0, 0.0, -0.62]))
    assert exp.reward == 0.75 and exp.truncated and exp.model_version == 1
    assert exp.eid.task_id == "s" and exp.eid.explorer_id == "ex" and exp.metrics["turns"] == 2.0
    store.end_commit(sessions, ok=True)
    assert store.sessions["s"].state == "committed"


def test_n_choices_are_one_group_and_rewards_per_choice_win_over_the_session_reward():
    store = SessionStore()
    store.record("s", Call("c1", [1, 2], [_choice(0, [5]), _choice(1, [6]), _choice(2, [7])]))
    store.feedback(1.0, response_id="c1", choice_index=1)
    store.feedback(0.25, session_id="s")
    exps, _ = store.begin_commit(["s"])
    assert [e.tokens.tolist() for e in exps] == [[1, 2, 5], [1, 2, 6], [1, 2, 7]]
    assert [e.reward for e in exps] == [0.25, 1.0, 0.25]
    assert len({e.eid.group_id for e in exps}) == 1
    assert len({e.eid.uid for e in exps}) == 3


def test_a_call_that_continues_nothing_starts_its_own_sequence():
    store = SessionStore()
    store.record("s", Call("c1", [1, 2], [_choice(0, [5])]))
    store.record("s", Call("c2", [9, 9], [_choice(0, [6])]))  # the template rewrote the history
    store.feedback(1.0, session_id="s")
    exps, _ = store.begin_commit(["s"])
    assert [e.tokens.tolist() for e in exps] == [[1, 2, 5], [9, 9, 6]]
    assert exps[0].eid.group_id != exps[1].eid.group_id


def test_commit_refuses_unknown_unrewarded_and_repeated_sessions_and_changes_nothing():
    store = SessionStore()
    store.record("a", Call("c1", [1], [_choice(0, [2])]))
    store.record("b", Call("c2", [1], [_choice(0, [3])]))
    store.feedback(1.0, session_id="a")
    with pytest.raises(SessionError, match="unknown session 'zz'") as err:
        store.begin_commit(["a", "zz"])
    assert err.value.status == 404
    with pytest.raises(SessionError, match="session 'b' has no reward") as err:
        store.begin_commit(["a", "b"])
    assert err.value.status == 400 and store.sessions["a"].state == "open"
    exps, sessions = store.begin_commit(["a"])
    with pytest.raises(SessionError, match="committing"):  # a concurrent commit
        store.begin_commit(["a"])
    store.end_commit(sessions, ok=True)
    with pytest.raises(SessionError, match="committed") as err:
        store.begin_commit(["a"])
    assert err.value.status == 409
    with pytest.raises(SessionError, match="start a new session id"):
        store.record("a", Call("c3", [1], [_choice(0, [2])]))


def test_a_failed_put_leaves_the_session_committable():
    store = SessionStore()
    store.record("a", Call("c1", [1], [_choice(0, [2])]))
    store.feedback(0.0, response_id="c1")
    _, sessions = store.begin_commit(["a"])
    store.end_commit(sessions, ok=False)
    again, _ = store.begin_commit(["a"])
    assert len(again) == 1 and again[0].eid.step == 2


def test_feedback_names_what_is_wrong():
    store = SessionStore()
    store.record("a", Call("c1", [1], [_choice(0, [2])]))
    with pytest.raises(SessionError, match="exactly one"):
        store.feedback(1.0)
    with pytest.raises(SessionError, match="unknown response_id 'nope'"):
        store.feedback(1.0, response_id="nope")
    with pytest.raises(SessionError, match=r"choice_index 3 is not in \[0, 1\)") as err:
        store.feedback(1.0, response_id="c1", choice_index=3)
    assert err.value.param == "choice_index"
    with pytest.raises(SessionError, match="unknown session_id 'b'"):
        store.feedback(1.0, session_id="b")


def test_a_prompt_continuing_an_answer_as_text_reuses_its_token_ids():
    store = SessionStore()
    call = Call("c1", [1, 2], [_choice(0, [5, 6])], prompt_text="user: hi\nassistant: ")
    call.choices[0].text = "yo"
    store.record("s", call)
    decode = {(5, 6): "yo<eos>"}.get
    text = "user: hi\nassistant: yo\nuser: more\nassistant: "
    assert store.continuation("s", text, lambda ids: decode(tuple(ids))) == (
        [1, 2, 5, 6],
        len(call.prompt_text) + 2,
    )
    assert store.continuation("s", "user: other", lambda ids: "yo") is None
    assert store.continuation("unknown", text, lambda ids: "yo") is None


def test_open_sessions_are_bounded_and_a_commit_frees_a_place():
    store = SessionStore(max_open=1)
    store.record("a", Call("c1", [1], [_choice(0, [2])]))
    with pytest.raises(SessionError, match="max_open_sessions") as err:
        store.check_open("b")
    assert err.value.status == 429
    store.record("a", Call("c2", [1, 2], [_choice(0, [3])]))  # the open session takes more calls
    store.feedback(1.0, session_id="a")
    _, sessions = store.begin_commit(["a"])
    store.end_commit(sessions, ok=True)
    store.record("b", Call("c3", [1], [_choice(0, [2])]))
