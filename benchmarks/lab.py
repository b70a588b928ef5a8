"""JupyterLab extension benchmark: time to a ready shell with vs without the extension (paired
runs, one sitting), bundle sizes (gzipped; loaded at start vs loaded with the panels), and the
requests the status bar costs per update interval, visible and hidden.

    .venv/bin/python benchmarks/lab.py                  # 8 pairs, 20 s of traffic counting
    .venv/bin/python benchmarks/lab.py --pairs 12 --traffic 30

Two real ``jupyter lab`` servers (one with the extension, one with it disabled through
page_config, same JupyterLab, same machine) are loaded alternately in fresh Chromium contexts
(Debian's /usr/bin/chromium, headless); the time is ``performance.now()`` when
``#jp-main-dock-panel`` and the status bar are attached. Bundle sizes come from what the browser
actually fetched from ``/lab/extensions/jupyter-gpushare/`` before and after opening the panels.
Figures are printed (and written to benchmarks/out/lab.json), not asserted. Targets: shell
time +5 % at most, start bundle <= 80 KB gzipped, <= 1 request per interval, 0 while hidden.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from labkit import (  # noqa: E402
    OUT,
    browser,
    chromium_available,
    ensure_built,
    grant_env,
    start_lab,
)

READY = """() => new Promise(resolve => {
  const done = () => document.querySelector('#jp-main-dock-panel')
    && document.querySelector('#jp-main-statusbar') && resolve(performance.now());
  if (!done()) { const t = setInterval(() => done() && clearInterval(t), 10); }
})"""
HIDE = """() => {
  Object.defineProperty(document, 'hidden', {value: true, configurable: true});
  Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def shell_ms(b: Any, url: str) -> float:
    ctx = b.new_context(viewport={"width": 1400, "height": 850})
    page = ctx.new_page()
    page.goto(url)
    ms = float(page.evaluate(READY))
    ctx.close()
    return ms


def gz(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), 9))


def bundles(b: Any, url: str) -> dict[str, Any]:
    ctx = b.new_context(viewport={"width": 1400, "height": 850})
    page = ctx.new_page()
    fetched: list[str] = []
    page.on("request", lambda r: fetched.append(r.url.split("?")[0])
            if "/lab/extensions/jupyter-gpushare/" in r.url else None)
    page.goto(url)
    page.wait_for_selector(".jp-gpushare-status", timeout=60000)
    page.wait_for_timeout(2000)
    start = sorted({u.rsplit("/", 1)[-1] for u in fetched})
    page.locator(".jp-gpushare-status").click()
    page.wait_for_selector(".jp-gpushare-chart", timeout=30000)
    page.locator(".lm-TabBar-tab[data-id='jp-gpushare-jobs']").click()
    page.wait_for_timeout(2000)
    after = sorted({u.rsplit("/", 1)[-1] for u in fetched} - set(start))
    ctx.close()
    static = OUT / "static"

    def size(names: list[str]) -> int:
        return sum(gz(static / n) for n in names if (static / n).exists())

    every = [p.name for p in static.glob("*.js")]
    return {
        "start_files": start, "start_gzip_bytes": size(start),
        "lazy_files": after, "lazy_gzip_bytes": size(after),
        "never_loaded": sorted(set(every) - set(start) - set(after)),
        "all_gzip_bytes": size(every),
    }


def traffic(b: Any, url: str, seconds: float) -> dict[str, Any]:
    ctx = b.new_context(viewport={"width": 1400, "height": 850})
    page = ctx.new_page()
    seen = {"http": 0, "frames": 0, "ws": 0}

    def on_ws(ws: Any) -> None:
        if "/gpushare/" in ws.url:
            seen["ws"] += 1
            ws.on("framereceived", lambda _f: seen.__setitem__("frames", seen["frames"] + 1))

    page.on("request", lambda r: seen.__setitem__("http", seen["http"] + 1)
            if "/gpushare/" in r.url else None)
    page.on("websocket", on_ws)
    page.goto(url)
    page.wait_for_selector(".jp-gpushare-status[data-level]", timeout=60000)
    # Playwright delivers page events only inside its own calls: wait with it, not sleep
    page.wait_for_timeout(3000)  # start-up reads (job list) are over
    h0, f0 = seen["http"], seen["frames"]
    page.wait_for_timeout(seconds * 1000)
    visible = {"http": seen["http"] - h0, "frames": seen["frames"] - f0}
    page.evaluate(HIDE)
    page.wait_for_timeout(1000)
    h1, f1 = seen["http"], seen["frames"]
    page.wait_for_timeout(seconds * 500)
    hidden = {"http": seen["http"] - h1, "frames": seen["frames"] - f1}
    ctx.close()
    interval = 1.0
    return {
        "interval_s": interval,
        "visible_s": seconds,
        "visible_http_requests": visible["http"],
        "visible_stream_messages": visible["frames"],
        "per_interval": round((visible["http"] + visible["frames"]) / (seconds / interval), 2),
        "hidden_s": seconds / 2,
        "hidden_http_requests": hidden["http"],
        "hidden_stream_messages": hidden["frames"],
        "websockets_opened": seen["ws"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--traffic", type=float, default=20.0, help="seconds of visible counting")
    a = ap.parse_args()
    reason = chromium_available()
    if reason:
        print(f"cannot run: {reason}")
        return 1
    ensure_built()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        with start_lab(t / "with", grant_env()) as lab_on, \
                start_lab(t / "without", grant_env(), with_extension=False) as lab_off, \
                browser() as b:
            url_on, url_off = lab_on.url("lab"), lab_off.url("lab")
            for u in (url_on, url_off):  # warm both (server caches, chromium caches off)
                shell_ms(b, u)
            on, off = [], []
            for i in range(a.pairs):
                order = [(url_on, on), (url_off, off)]
                if i % 2:
                    order.reverse()
                for u, acc in order:
                    acc.append(shell_ms(b, u))
            ratios = [x / y for x, y in zip(on, off, strict=True)]
            out["shell"] = {
                "pairs": a.pairs,
                "with_ms_median": round(statistics.median(on), 1),
                "without_ms_median": round(statistics.median(off), 1),
                "ratio_median": round(statistics.median(ratios), 3),
                "ratio_mean": round(statistics.fmean(ratios), 3),
                "with_ms": [round(x) for x in on], "without_ms": [round(x) for x in off],
            }
            out["bundles"] = bundles(b, url_on)
            out["traffic"] = traffic(b, url_on, a.traffic)
    s, bd, tr = out["shell"], out["bundles"], out["traffic"]
    print(f"ready shell, {s['pairs']} paired loads: with {s['with_ms_median']} ms, without "
          f"{s['without_ms_median']} ms (median); ratio median {s['ratio_median']} "
          f"(mean {s['ratio_mean']}), target <= 1.05")
    print(f"bundle gzipped: start {bd['start_gzip_bytes'] / 1024:.1f} KB "
          f"({', '.join(bd['start_files'])}); lazy {bd['lazy_gzip_bytes'] / 1024:.1f} KB "
          f"({', '.join(bd['lazy_files'])}); all {bd['all_gzip_bytes'] / 1024:.1f} KB; "
          f"target start <= 80 KB")
    print(f"status bar traffic: {tr['visible_http_requests']} HTTP requests + "
          f"{tr['visible_stream_messages']} stream messages in {tr['visible_s']:.0f} s visible "
          f"= {tr['per_interval']} per {tr['interval_s']:.0f} s interval; hidden "
          f"{tr['hidden_s']:.0f} s: {tr['hidden_http_requests']} requests, "
          f"{tr['hidden_stream_messages']} messages; websockets opened: "
          f"{tr['websockets_opened']}")
    dest = Path(__file__).resolve().parent / "out"
    dest.mkdir(exist_ok=True)
    (dest / "lab.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
