"""The hub's answers a broker carries over to the one that takes over from it
(broker/ops/carry.py).

With the real hub and the real supervisor (the broker outside the hub, a warm standby): a
spawner's admission answered once, the hub frozen (SIGSTOP), the broker killed: the standby
that takes over answers the next admission at once, from the token's identity and the user's
groups the killed broker learnt (before, it waited for the frozen hub). And, on the carry file
itself: a token is stored only as its hash, an answer expires when it would have in the broker
that learnt it, and a file others may write is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port
from realhub import RealHub, start_hub
from test_broker_lifecycle import wait_for
from test_broker_supervisor import children

from jupyter_gpushare.broker.api.auth import Identity, StaticTokenAuthenticator
from jupyter_gpushare.broker.client import BrokerClient, BrokerError
from jupyter_gpushare.broker.ops import carry as carry_module
from jupyter_gpushare.broker.ops.carry import Carry, token_key

POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: dbg, pool: debug, nodes: 1, gpus_per_node: 1, model: H200,
       gpu_memory: 80GiB, cpu: 16, memory: 64GiB}
pools:
  debug: {mode: debug}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 2s}
teams:
  ops:
    groups: [ops]
    quotas:
      debug: {guaranteed: 1/2}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB, max_lifetime: 30m}
"""


def hub_config(policy: Path, broker_port: int) -> str:
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, broker_managed=False,
               broker_args=["--BrokerApp.reconcile_on_start=False",
                            "--BrokerApp.reconcile_interval_s=0"])
"""


def broker_pid(hub: RealHub) -> int:
    try:
        return int(json.loads((hub.tmp / "gpushare-broker.pid").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return 0


async def admit(url: str, token: str, n: int, timeout: float) -> tuple[float, int]:
    """One admission the way the soak's prober asks (no groups: the broker reads them), and
    its release; (seconds it took, status)."""
    client = BrokerClient(
        url, token, request_timeout=timeout, connect_timeout=2, retry_window_s=timeout
    )
    t0 = time.monotonic()
    body = {
        "user": "probe",
        "profile": "debug-eighth",
        "server": "p",
        "idempotency_key": f"carry-{n}",
    }
    try:
        status, answer = await client.call("POST", "/requests", body)
    except BrokerError as exc:
        return time.monotonic() - t0, exc.status
    took = time.monotonic() - t0
    await client.call("DELETE", f"/grants/{answer['grant']['id']}")
    return took, status


def test_the_standby_answers_from_what_the_killed_broker_learnt_of_the_hub(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    hub = start_hub(tmp_path / "hub", extra_config=hub_config(policy, port))
    sup: subprocess.Popen[bytes] | None = None
    try:
        hub.create_user("probe", groups=["ops"])
        log = open(hub.tmp / "broker.log", "ab")  # noqa: SIM115 - closed below
        sup = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_gpushare.broker.ops.external",
                str(hub.tmp / "gpushare_broker.json"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        url = f"http://127.0.0.1:{port}/services/gpushare/api/v1"
        token = json.loads((hub.tmp / "gpushare_tokens.json").read_text())["spawner"]
        wait_for(lambda: broker_pid(hub) != 0, 60, "the broker serving")
        wait_for(lambda: len(children(sup.pid)) == 2, 60, "a warm standby")
        took, status = asyncio.run(admit(url, token, 1, 30))
        assert status == 201, status
        first = broker_pid(hub)
        time.sleep(1.0)  # the standby's own start (imports, the service built ahead)
        os.kill(hub.proc.pid, signal.SIGSTOP)  # the hub answers nothing from now on
        try:
            os.kill(first, signal.SIGKILL)
            took, status = asyncio.run(admit(url, token, 2, 8))
            # without the carried answers: the token's check waits for the frozen hub
            assert status == 201, (status, (hub.tmp / "broker.log").read_text()[-3000:])
            assert took < 2.0, took
            assert broker_pid(hub) not in (0, first)
        finally:
            os.kill(hub.proc.pid, signal.SIGCONT)
        text = (hub.tmp / "gpushare-carry.jsonl").read_text()
        assert token not in text and token_key(token) in text  # only the token's hash
        assert os.stat(hub.tmp / "gpushare-carry.jsonl").st_mode & 0o777 == 0o600
    finally:
        if sup is not None:
            sup.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sup.wait(30)
        hub.stop()


SPAWNER = {"kind": "service", "name": "spawner", "scopes": ["custom:gpushare:act-as-users"]}


def learnt_by_one_broker(path: Path, ttl_s: float) -> Identity:
    """A broker's authenticator learns the token ``tok-1`` (its identity kept ``ttl_s``)."""
    auth = StaticTokenAuthenticator(tokens={"tok-1": SPAWNER})
    auth.identity_ttl_s = ttl_s
    Carry(str(path), auth, None, Identity).hand_over()
    identity = asyncio.run(auth.identify_and_cache("tok-1"))
    assert identity is not None
    return identity


def next_broker(path: Path) -> StaticTokenAuthenticator:
    """The authenticator of the broker that takes over (its own table knows no token)."""
    auth = StaticTokenAuthenticator(tokens={"other": SPAWNER})
    Carry(str(path), auth, None, Identity).hand_over()
    return auth


def test_a_carried_identity_expires_when_it_would_have_in_the_broker_that_learnt_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "carry.jsonl"
    identity = learnt_by_one_broker(path, ttl_s=0.5)
    assert next_broker(path).cached("tok-1") == identity
    assert next_broker(path).cached("tok-2") is None
    time.sleep(0.6)
    assert next_broker(path).cached("tok-1") is None
    assert "tok-1" not in path.read_text()


def test_a_carry_file_others_may_write_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "carry.jsonl"
    learnt_by_one_broker(path, ttl_s=300)
    assert path.stat().st_mode & 0o777 == 0o600
    assert next_broker(path).cached("tok-1") is not None
    path.chmod(0o622)
    assert next_broker(path).cached("tok-1") is None
    path.chmod(0o600)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    assert next_broker(link).cached("tok-1") is None  # never through a link


def test_the_file_is_rewritten_from_what_is_fresh_and_a_standby_reads_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(carry_module, "COMPACT_AFTER", 4)
    path = tmp_path / "carry.jsonl"
    auth = StaticTokenAuthenticator(tokens={f"tok-{i}": SPAWNER for i in range(10)})
    auth.identity_ttl_s = 0.3
    Carry(str(path), auth, None, Identity).hand_over()
    standby = StaticTokenAuthenticator(tokens={"other": SPAWNER})
    ahead = Carry(str(path), standby, None, Identity)
    for i in range(3):
        asyncio.run(auth.identify_and_cache(f"tok-{i}"))
    ahead.read()  # read ahead, before the rewrite
    assert len(ahead.identities) == 3
    header = path.read_bytes().split(b"\n")[0]
    time.sleep(0.4)  # tok-0..2 expire
    auth.identity_ttl_s = 300
    for i in range(3, 10):
        asyncio.run(auth.identify_and_cache(f"tok-{i}"))
    assert path.read_bytes().split(b"\n")[0] != header  # rewritten along the way
    ahead.hand_over()  # the takeover: the file was replaced, so all of it is read again
    assert [standby.cached(f"tok-{i}") is not None for i in range(10)] == [False] * 3 + [True] * 7
    # a broker whose file already holds COMPACT_AFTER lines rewrites it at its first line
    for i in range(5):  # the file grows past COMPACT_AFTER lines again
        asyncio.run(auth.identify_and_cache(f"tok-{i}"))
    header = path.read_bytes().split(b"\n")[0]
    third = StaticTokenAuthenticator(tokens={"tok-x": SPAWNER})
    Carry(str(path), third, None, Identity).hand_over()
    asyncio.run(third.identify_and_cache("tok-x"))
    assert path.read_bytes().split(b"\n")[0] != header


def test_a_token_the_hub_refused_after_a_takeover_is_never_confirmed_from_the_carry(
    tmp_path: Path,
) -> None:
    path = tmp_path / "carry.jsonl"
    learnt_by_one_broker(path, ttl_s=0.2)  # confirmed now; kept 0.2 s
    time.sleep(0.3)
    auth = next_broker(path)  # its hub no longer knows tok-1: revoked
    assert asyncio.run(auth.identify_and_cache("tok-1")) is None
    for broker in (auth, next_broker(path)):  # this broker, and the next one
        broker.tokens, broker.tokens_file = {}, str(tmp_path / "missing")  # hub unreachable
        with pytest.raises(OSError):
            asyncio.run(broker.identify_and_cache("tok-1"))
