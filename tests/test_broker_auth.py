"""broker/api/auth.py without a hub: a token the hub confirmed keeps working while the hub is down.

During the hub's shutdown its API stops answering before its servers are stopped; the
spawner's releases must still be accepted (issue 8 item 14), but only for tokens the hub
confirmed recently, and never for one it said is unknown.
"""

from __future__ import annotations

import pytest
from tornado import web

from jupyter_gpushare.broker.api.auth import Identity, TokenAuthenticator

MODEL = Identity("service", "gpushare-spawner", frozenset({"custom:gpushare:act-as-users"}))


class FlakyHub(TokenAuthenticator):
    """Answers from ``answers`` in turn: an Identity, None (unknown token) or an exception."""

    def __init__(self, answers: list[object], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.answers = list(answers)

    async def identify(self, token: str) -> Identity | None:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


DOWN = web.HTTPError(500, "Failed to connect to Hub API")


async def test_a_confirmed_token_survives_an_unreachable_hub() -> None:
    auth = FlakyHub([MODEL, DOWN, ConnectionRefusedError()])
    assert await auth.identify_and_cache("t") == MODEL
    assert await auth.identify_and_cache("t") == MODEL  # hub answered 500: the last answer
    assert await auth.identify_and_cache("t") == MODEL  # connection refused: the same


async def test_an_unknown_or_never_confirmed_token_does_not() -> None:
    auth = FlakyHub([DOWN])
    with pytest.raises(web.HTTPError):
        await auth.identify_and_cache("t")
    auth = FlakyHub([MODEL, None, DOWN])  # confirmed, then revoked, then the hub is down
    assert await auth.identify_and_cache("t") == MODEL
    assert await auth.identify_and_cache("t") is None
    with pytest.raises(web.HTTPError):
        await auth.identify_and_cache("t")


async def test_a_refusal_of_the_hub_is_not_overridden() -> None:
    auth = FlakyHub([MODEL, web.HTTPError(403, "no")])
    assert await auth.identify_and_cache("t") == MODEL
    with pytest.raises(web.HTTPError):
        await auth.identify_and_cache("t")


async def test_stale_identities_expire() -> None:
    auth = FlakyHub([MODEL, DOWN], stale_identity_s=0.0)
    assert await auth.identify_and_cache("t") == MODEL
    with pytest.raises(web.HTTPError):
        await auth.identify_and_cache("t")
