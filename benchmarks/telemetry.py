"""Telemetry benchmark: sampler CPU cost at 1 Hz, and stream delay to 100 clients.

    .venv/bin/python benchmarks/telemetry.py                 # both parts, 30 s each
    .venv/bin/python benchmarks/telemetry.py --duration 60 --clients 100

Part 1 runs the sampler thread (NVML where a GPU exists, else simulated) at 1 Hz and
reports its CPU time (``time.thread_time`` inside the thread) as % of one core, alone
and with the server's per-sample work (process-tree walk and attribution); it also
reports the whole process's CPU delta against an idle baseline measured in the same run.
Part 2 starts a real jupyter server with the extension on 127.0.0.1, connects N
WebSocket clients (tornado.websocket) to /gpushare/api/metrics/stream and reports the
delay from sample time to client receipt (p50 / p99 / max). Figures are printed, not
asserted; targets: <= 1 % of one core, p99 < 50 ms.

Part 3 (``--startup N``) measures the server extension's own start-up cost directly, in
N fresh processes: importing it, linking and loading it into a real ``ServerApp``
(``initialize_settings``, handlers) and its start hook, timed by wrappers around exactly
those calls while jupyter_server loads it as usual. The broker URL points at an address
that never answers and the sampler is ``auto`` (NVML, else simulated), so anything on that
path that waited for the broker or NVML would show. The baseline is the same server's own
``initialize()`` in the same process (target: the extension under 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from jupyter_gpushare.telemetry.attribution import attribute, collect_process_tree
from jupyter_gpushare.telemetry.factory import make_sampler
from jupyter_gpushare.telemetry.grant import GrantInfo
from jupyter_gpushare.telemetry.sampler import Sampler


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure_sampler(duration: float, interval: float, kind: str, server_work: bool) -> dict:
    """Sampler thread CPU while sampling for ``duration`` s, and process CPU vs idle."""
    idle0, w0 = _cpu(), time.monotonic()
    time.sleep(duration)
    idle_cpu = (_cpu() - idle0) / (time.monotonic() - w0)

    s: Sampler = make_sampler(kind, interval_s=interval)
    grant = GrantInfo.from_env()
    if server_work:
        pid = os.getpid()

        def server_side(x: Any) -> None:
            attribute(x, grant.gpu_uuids, collect_process_tree(pid, []))

        s.add_listener(server_side)
    s.start()
    s.wait_ready(60)
    c0, w0 = _cpu(), time.monotonic()
    time.sleep(duration)
    wall = time.monotonic() - w0
    busy_cpu = (_cpu() - c0) / wall
    thread_cpu = s.cpu_seconds
    ticks = s.ticks
    desc = s.describe()
    s.stop()
    return {
        "source": desc["source"],
        "simulated": desc["simulated"],
        "server_work": server_work,
        "ticks": ticks,
        "thread_cpu_pct_of_core": 100 * thread_cpu / max(ticks * interval, 1e-9),
        "thread_cpu_ms_per_sample": 1000 * thread_cpu / max(ticks, 1),
        "process_cpu_pct_vs_idle": 100 * (busy_cpu - idle_cpu),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def stream_delays(port: int, token: str, clients: int, duration: float) -> list[float]:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{port}/gpushare/api/metrics/stream"
    delays: list[float] = []
    prep: list[float] = []

    async def client() -> None:
        req = HTTPRequest(url, headers={"Authorization": f"token {token}"})
        ws = await websocket_connect(req)
        first = True
        end = time.time() + duration
        while time.time() < end:
            try:
                raw = await asyncio.wait_for(ws.read_message(), max(0.1, end - time.time()))
            except asyncio.TimeoutError:
                break
            now = time.time()
            if raw is None:
                break
            msg = json.loads(raw)
            if msg.get("type") != "sample":
                continue
            if first:  # the replayed current sample on subscribe is not a live delivery
                first = False
                continue
            delays.append(1000 * (now - msg["ts"]))
            prep.append(1000 * (msg.get("sent_ts", msg["ts"]) - msg["ts"]))
        ws.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    if prep:
        prep.sort()
        print(f"  server-side prep (sample -> first write) p50 {prep[len(prep) // 2]:.1f} ms, "
              f"p99 {prep[int(0.99 * len(prep))]:.1f} ms", flush=True)
    return delays


def _client_proc(args: tuple[int, str, int, float]) -> list[float]:
    return asyncio.run(stream_delays(*args))


def run_clients(port: int, token: str, clients: int, duration: float, procs: int) -> list[float]:
    """Clients spread over ``procs`` processes (as real browsers would be)."""
    if procs <= 1:
        return asyncio.run(stream_delays(port, token, clients, duration))
    from multiprocessing import get_context

    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    with get_context("spawn").Pool(procs) as pool:
        parts = pool.map(_client_proc, [(port, token, n, duration) for n in shares if n])
    return [d for part in parts for d in part]


def measure_stream(
    clients: int, duration: float, interval: float, kind: str, client_procs: int = 1
) -> dict:
    """Start a jupyter server with the extension; N clients; delay sample -> client."""
    port, token = free_port(), "bench-token"
    env = dict(os.environ)
    if kind == "simulated":
        env["GPUSHARE_SIMULATED"] = "1"
    root = tempfile.mkdtemp(prefix="gpushare-bench-")
    cfg = os.path.join(root, "jupyter_server_config.json")
    with open(cfg, "w") as f:
        ext = {"jupyter_gpushare.serverextension": True}
        json.dump({"ServerApp": {"jpserver_extensions": ext}}, f)
    cmd = [
        sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.allow_root=True",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--config={cfg}",
        f"--GPUShareServerApp.sample_interval_s={interval}",
        f"--GPUShareServerApp.sampler={kind}",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                    raise RuntimeError(f"jupyter server did not start:\n{err}") from None
                time.sleep(0.2)
        delays = run_clients(port, token, clients, duration, client_procs)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    delays.sort()
    n = len(delays)
    q = (lambda p: delays[min(n - 1, int(p * n))]) if n else (lambda p: float("nan"))
    return {
        "clients": clients,
        "messages": n,
        "p50_ms": q(0.50),
        "p99_ms": q(0.99),
        "max_ms": delays[-1] if n else float("nan"),
        "mean_ms": statistics.fmean(delays) if n else float("nan"),
    }


STARTUP_PROBE = r"""
import asyncio, inspect, json, os, sys, tempfile, time
clock = time.perf_counter if os.environ.get("GPUSHARE_BENCH_CLOCK") == "wall" else time.process_time
t0 = clock()
import jupyter_server.serverapp as serverapp
t1 = clock()
import jupyter_gpushare.serverextension as ext
t2 = clock()
from jupyter_gpushare.serverextension.app import GPUShareServerApp
spent = {"link": 0.0, "load": 0.0, "start": 0.0}

def timed(name, fn):
    def wrapper(*a, **kw):
        t = clock()
        try:
            return fn(*a, **kw)
        finally:
            spent[name] += clock() - t
    return wrapper

def timed_async(name, fn):
    async def wrapper(*a, **kw):
        t = clock()
        try:
            return await fn(*a, **kw)
        finally:
            spent[name] += clock() - t
    return wrapper

def patch(name, key, wrap):
    raw = inspect.getattr_static(GPUShareServerApp, name)
    if isinstance(raw, classmethod):
        setattr(GPUShareServerApp, name, classmethod(wrap(key, raw.__func__)))
    else:
        setattr(GPUShareServerApp, name, wrap(key, raw))

patch("_link_jupyter_server_extension", "link", timed)
patch("_load_jupyter_server_extension", "load", timed)
patch("_start_jupyter_server_extension", "start", timed_async)
root = tempfile.mkdtemp()
app = serverapp.ServerApp.instance()
t3 = clock()
app.initialize(argv=["--ServerApp.root_dir=" + root, "--ServerApp.open_browser=False",
                     "--ServerApp.port=0", "--ServerApp.token=bench", "--allow-root"],
               new_httpserver=False)
t4 = clock()
loaded = "jupyter_gpushare.serverextension" in app.extension_manager.extensions
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
loop.run_until_complete(app.extension_manager.start_all_extensions())
svc = app.web_app.settings.get("gpushare_service")
started = svc is not None and bool(svc._started)
if svc is not None:
    loop.run_until_complete(svc.stop())
print(json.dumps({
    "loaded": loaded and started,
    "import_ms": (t2 - t1) * 1e3,
    "link_ms": spent["link"] * 1e3,
    "load_ms": spent["load"] * 1e3,
    "start_ms": spent["start"] * 1e3,
    "server_initialize_ms": (t4 - t3) * 1e3,
}))
"""


def measure_startup(rounds: int, clock: str = "cpu") -> dict[str, Any]:
    """The extension's own start-up cost in ``rounds`` fresh processes (see the docstring);
    ``clock`` "cpu" (process CPU time: what the work costs, whatever else runs on the
    machine) or "wall" (elapsed, which a loaded machine inflates)."""
    env = dict(os.environ)
    env["GPUSHARE_BENCH_CLOCK"] = clock
    for k in list(env):
        if k.startswith("GPUSHARE_"):
            del env[k]
    with socket.socket() as s:  # a port that accepts nothing: connect attempts hang
        s.bind(("127.0.0.1", 0))
        s.listen(0)
        blackhole = s.getsockname()[1]
        env.update({
            "GPUSHARE_GRANT_ID": "g-bench", "GPUSHARE_GPU_UUIDS": "GPU-sim-bench-0",
            "GPUSHARE_MEMORY_LIMIT_MIB": "18022", "GPUSHARE_COMPUTE_PCT": "12.5",
            "GPUSHARE_SIMULATED": "1", "GPUSHARE_ENFORCEMENT": "env",
            "GPUSHARE_BROKER_URL": f"http://10.255.255.1:{blackhole}/services/gpushare/api/v1",
            "JUPYTERHUB_API_TOKEN": "bench",
        })
        runs = []
        for _ in range(rounds):
            out = subprocess.run([sys.executable, "-c", STARTUP_PROBE], env=env,
                                 capture_output=True, text=True, timeout=120, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    keys = ["import_ms", "link_ms", "load_ms", "start_ms", "server_initialize_ms"]
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    own = [r["import_ms"] + r["link_ms"] + r["load_ms"] + r["start_ms"] for r in runs]
    ratio = [
        (r["import_ms"] + r["link_ms"] + r["load_ms"] + r["start_ms"]) / r["server_initialize_ms"]
        for r in runs
    ]
    return {
        "rounds": rounds,
        "clock": clock,
        "loaded": all(r["loaded"] for r in runs),
        **med,
        "own_ms_median": statistics.median(own),
        "own_ms_max": max(own),
        "own_vs_server_initialize": statistics.median(ratio),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per measurement")
    ap.add_argument("--interval", type=float, default=1.0, help="sample interval (s)")
    ap.add_argument("--clients", type=int, default=100, help="stream clients")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="processes the stream clients are spread over (default 1)")
    ap.add_argument("--sampler", default="auto", choices=["auto", "nvml", "simulated"])
    ap.add_argument("--skip-stream", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--startup", type=int, default=0, metavar="N",
                    help="measure the extension's start-up cost in N fresh processes")
    args = ap.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, sampler={args.sampler}")
    if not args.skip_cpu:
        for work in (False, True):
            r = measure_sampler(args.duration, args.interval, args.sampler, work)
            label = "sampler + attribution" if work else "sampler alone"
            print(
                f"[cpu] {label:22s} source={r['source']:9s} simulated={r['simulated']!s:5s} "
                f"samples={r['ticks']:4d}  thread CPU {r['thread_cpu_pct_of_core']:.3f} % "
                f"of one core ({r['thread_cpu_ms_per_sample']:.3f} ms/sample); process CPU "
                f"vs idle baseline {r['process_cpu_pct_vs_idle']:+.3f} %  (target <= 1 %)"
            )
    for clock in ("cpu", "wall") if args.startup else ():
        r = measure_startup(args.startup, clock)
        print(
            f"[startup {clock:4s}] {r['rounds']} fresh processes, loaded={r['loaded']}: "
            f"import {r['import_ms']:.1f} ms, link {r['link_ms']:.2f} ms, load "
            f"{r['load_ms']:.2f} ms, start {r['start_ms']:.2f} ms (medians); own total "
            f"median {r['own_ms_median']:.1f} ms, max {r['own_ms_max']:.1f} ms (target < 50 ms) "
            f"= {100 * r['own_vs_server_initialize']:.1f} % of the server's own initialize "
            f"({r['server_initialize_ms']:.0f} ms, baseline, same processes)"
        )
    if not args.skip_stream:
        kind = args.sampler
        r = measure_stream(args.clients, args.duration, args.interval, kind, args.client_procs)
        print(
            f"[stream] {r['clients']} clients in {args.client_procs} process(es), "
            f"{r['messages']} deliveries: sample->client "
            f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms "
            f"(target p99 < 50 ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
