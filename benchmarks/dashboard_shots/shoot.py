"""Screenshots of a running optuna-dashboard: the trial list, the trial table and the best-trial card.

A real headless Chromium (Debian's ``chromium``) opens each page, driven over the Chrome DevTools
Protocol (aiohttp's websocket client; aiohttp comes with ``ray[default]``). Next to the PNGs it
writes ``shots.json``: what the dashboard's own API served (each trial's state, values and
constraints, the best trials) and the text of the best-trial card, so that a reader can check
the pictures against the data.

    explorer dashboard studies/quickstart.yaml --port 8080 &
    .venv/bin/python benchmarks/dashboard_shots/shoot.py http://127.0.0.1:8080/dashboard/ OUT_DIR

Shots: ``trial_list.png`` (the trial list, first trial selected), ``trial_list_oom.png`` (the
first trial whose ``status`` user attr is oom, selected), ``trial_table.png`` (the trial table,
which optuna-dashboard 0.21 shows on its Smart Selection page), ``overview.png`` (the study page:
history, importances, timeline) and ``best_card.png`` (the "Best Trial" card alone).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
WAIT_S = 30.0
"""How long a page may take to show what it is waited for."""

MAX_CLIP = 2400
"""The largest width and height of a clipped shot, in CSS pixels."""
CARD_JS = """(() => {
  const heads = [...document.querySelectorAll('h1,h2,h3,h4,h5,h6')];
  const head = heads.find(h => h.textContent.startsWith('Best Trial'));
  if (!head) return null;
  const card = head.closest('.MuiCard-root') || head.parentElement;
  card.scrollIntoView({block: 'center'});  // clear of the sticky app bar
  const r = card.getBoundingClientRect();
  return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height,
          text: card.innerText};
})()"""
TABLE_JS = """(() => {
  const table = document.querySelector('table');
  if (!table) return null;
  const card = table.closest('.MuiCard-root') || table;
  const r = card.getBoundingClientRect();
  const rows = [...table.querySelectorAll('tr')].map(tr => [...tr.cells].map(c => c.innerText.trim()));
  return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height, rows};
})()"""


class Page:
    """One Chromium tab over the DevTools websocket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def js(self, expression: str) -> Any:
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    async def open(self, url: str, ready_js: str) -> None:
        """Go to ``url`` and wait until ``ready_js`` is true, then a second for plotly to draw."""
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + WAIT_S
        while not await self.js(ready_js):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: not ready after {WAIT_S:.0f} s ({ready_js})")
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.5)

    async def shot(self, path: Path, clip: dict[str, float] | None = None) -> None:
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            box = {**clip, "width": min(clip["width"], MAX_CLIP), "height": min(clip["height"], MAX_CLIP)}
            params.update(clip={**box, "scale": 1}, captureBeyondViewport=True)
        data = await self.call("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(data["data"]))


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def _chromium(explicit: str | None) -> str:
    for name in [explicit] if explicit else ["chromium", "chromium-browser", "google-chrome"]:
        found = shutil.which(name) if name else None
        if found:
            return found
    raise SystemExit("shoot: no Chromium found (apt-get install -y chromium, or --chromium PATH)")


def _debugger_port(profile: Path, proc: subprocess.Popen[bytes]) -> int:
    """The DevTools port Chromium chose (``--remote-debugging-port=0``), from its profile folder."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + WAIT_S
    while not marker.exists() or not marker.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"shoot: Chromium did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return int(marker.read_text().split()[0])


def _trial_summary(detail: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for t in detail["trials"]:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        rows.append(
            {
                "number": t["number"],
                "state": t["state"],
                "values": t.get("values"),
                "constraints": t["constraints"],
                "status": attrs.get("status"),
                "params": {p["name"]: p["param_external_value"] for p in t["params"]},
            }
        )
    return rows


async def _shoot(base: str, study_id: int, out: Path, chromium: str, size: tuple[int, int]) -> dict[str, Any]:
    import aiohttp

    api = base.split("/dashboard", 1)[0]
    detail = _get_json(f"{api}/api/studies/{study_id}")
    trials = _trial_summary(detail)
    oom = next((t["number"] for t in trials if t["status"] == "oom"), None)
    with tempfile.TemporaryDirectory(prefix="shoot-") as profile:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"]
        proc = subprocess.Popen([*cmd, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = _debugger_port(Path(profile), proc)
            tab = next(t for t in _get_json(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page")
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws,
            ):
                page = Page(ws)
                await page.call("Page.enable")
                w, h = size
                await page.call(
                    "Emulation.setDeviceMetricsOverride", width=w, height=h, deviceScaleFactor=1, mobile=False
                )
                study = f"{base.rstrip('/')}/studies/{study_id}"
                listed = (
                    "document.body.innerText.includes('Trial 0') && !!document.querySelector('.MuiChip-root')"
                )
                await page.open(f"{study}/trials", listed)
                await page.shot(out / "trial_list.png")
                if oom is not None:
                    await page.open(
                        f"{study}/trials?numbers={oom}", f"document.body.innerText.includes('Trial {oom} (')"
                    )
                    await page.shot(out / "trial_list_oom.png")
                # optuna-dashboard 0.21 shows its trial table on the Smart Selection page
                await page.open(f"{study}/smartSelection", "!!document.querySelector('table tbody tr')")
                table = await page.js(TABLE_JS)
                await page.shot(out / "trial_table.png", {k: table[k] for k in ("x", "y", "width", "height")})
                best = "document.body.innerText.includes('Best Trial')"
                await page.open(study, best + " && !!document.querySelector('.js-plotly-plot')")
                await page.shot(out / "overview.png")
                card = await page.js(CARD_JS)
                if card is not None:
                    await asyncio.sleep(0.5)
                    clip = {k: card[k] for k in ("x", "y", "width", "height")}
                    await page.shot(out / "best_card.png", clip)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {
        "url": base,
        "study_id": study_id,
        "best_trials": [t["number"] for t in detail["best_trials"]],
        "best_card_text": card["text"] if card else None,
        "trial_table": [row[:3] for row in table["rows"]],
        "trials": trials,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the dashboard, e.g. http://127.0.0.1:8080/dashboard/")
    parser.add_argument("out", type=Path, help="folder for the PNGs and shots.json")
    parser.add_argument("--study-id", type=int, help="default: the first study the dashboard lists")
    parser.add_argument("--chromium", help="the browser binary (default: chromium on PATH)")
    parser.add_argument("--size", default="1600x1200", help="window WIDTHxHEIGHT (default 1600x1200)")
    args = parser.parse_args()
    base = args.url if "/dashboard" in args.url else args.url.rstrip("/") + "/dashboard"
    study_id = args.study_id
    if study_id is None:
        studies = _get_json(base.split("/dashboard", 1)[0] + "/api/studies")["study_summaries"]
        if not studies:
            print(f"shoot: {args.url}: the dashboard lists no study", file=sys.stderr)
            return 2
        study_id = int(studies[0]["study_id"])
    width, _, height = args.size.partition("x")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = asyncio.run(
        _shoot(base, study_id, args.out, _chromium(args.chromium), (int(width), int(height)))
    )
    (args.out / "shots.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"shoot: wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
