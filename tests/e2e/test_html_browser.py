"""The HTML report in a real browser: Debian's headless Chromium, driven over the DevTools
protocol on a pipe (``--remote-debugging-pipe``: no extra package, no port). The runs under test
are real: tiny scripts run by the torchrepro command. Run alone with
``python -m pytest tests/e2e/test_html_browser.py``."""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCRIPTS = Path(__file__).parents[1] / "scripts"
MARKUP = '<img src=x onerror=alert(1)> & "q" \x1b[31mred\x1b[0m'

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs chromium (apt-get install chromium)"),
    pytest.mark.xdist_group("html-browser"),  # one worker starts the browser and makes each run once
]

SCRIPT = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    def forward(self, x):
        h = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(h)

torch.manual_seed(0)
model = Net()
compiled = torch.compile(model, backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, batch in enumerate([8, 8, 3, 8]):
    loss = compiled(torch.randn(batch, 4)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
raise RuntimeError(MESSAGE)
"""


def _above_ten(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    """Headless Chromium with one page, over the DevTools protocol (NUL-separated JSON on fds 3/4)."""

    def __init__(self, profile: Path):
        # the browser reads commands on fd 3 and writes replies on fd 4 (pipe ends first moved above 10,
        # so that the spawn's dup2 onto 3 and 4 never meets them)
        to_browser_r, self._to_browser, self._from_browser, from_browser_w = map(_above_ten, (*os.pipe(), *os.pipe()))
        argv = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--mute-audio",
            "--hide-scrollbars",
            "about:blank",
        ]
        self.pid = os.posix_spawn(
            CHROMIUM,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
                (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._messages: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=self.session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=self.session,
        )

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self._messages.put(json.loads(message))

    def _wait(self, match, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            message = self._messages.get(timeout=max(0.1, deadline - time.monotonic()))
            if "method" in message:
                self.events.append(message)
            if match(message):
                return message

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        reply = self._wait(lambda m, i=self._next_id: m.get("id") == i)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def open(self, path: Path) -> str:
        """Load a file and wait for its load event; returns its URL."""
        self.events.clear()
        url = path.resolve().as_uri()
        self.call("Page.navigate", {"url": url}, session=self.session)
        self._wait(lambda m: m.get("method") == "Page.loadEventFired")
        time.sleep(0.3)  # let late console messages arrive
        self.call("Runtime.evaluate", {"expression": "1"}, session=self.session)  # drain the queue up to now
        return url

    def js(self, expression: str):
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        return reply["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "exception"))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(str(p.get("args")))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(p["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def blocked(self) -> dict[str, str]:
        """URL -> why the browser refused to load it."""
        urls = {
            e["params"]["requestId"]: e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        }
        return {
            urls.get(e["params"]["requestId"], "?"): e["params"].get("blockedReason")
            for e in self.events
            if e["method"] == "Network.loadingFailed"
        }

    def screenshot(self, path: Path) -> Path:
        data = self.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=self.session
        )["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, queue.Empty, OSError):
            pass
        deadline = time.monotonic() + 20
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.1)
        os.close(self._to_browser)


def torchrepro(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="session")
def doctor_run(tmp_path_factory) -> Path:
    """A compiled run whose script name and exception message carry markup and ANSI codes."""
    root = tmp_path_factory.mktemp("doctor")
    script = root / "train <b class=x> & 'q'.py"
    script.write_text(f"MESSAGE = {MARKUP!r}\n" + SCRIPT)
    proc = torchrepro("doctor", "--out", str(root / "run"), str(script), cwd=root)
    assert proc.returncode == 3, proc.stderr  # the script failed; the report is still written
    return root / "run"


@pytest.fixture(scope="session")
def check_run(noise_check) -> Path:
    proc, out = noise_check  # made once, shared with test_check.py (conftest)
    assert proc.returncode == 1, proc.stderr
    return out


@pytest.fixture(scope="session")
def drift_run(tmp_path_factory) -> Path:
    """A real tiny drift experiment (2 init seeds, each eager and compiled) of a script whose name has markup."""
    root = tmp_path_factory.mktemp("drift")
    script = root / "toy <b class=x> & 'q'.py"
    script.write_text((SCRIPTS / "drift_toy.py").read_text())
    proc = torchrepro(
        "drift",
        "--vary",
        "init,compile",
        "--runs",
        "2",
        "--jobs",
        "2",
        "--out",
        str(root / "exp"),
        str(script),
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    return root / "exp"


@pytest.fixture(scope="session")
def nan_run(tmp_path_factory) -> Path:
    """``doctor`` of an eager script whose loss turns NaN at step 2."""
    root = tmp_path_factory.mktemp("nan")
    proc = torchrepro("doctor", "--out", str(root / "run"), str(SCRIPTS / "nan_loss.py"), "2", cwd=root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # a NaN loss fails doctor
    return root / "run"


def _clean(browser: Browser, url: str) -> None:
    assert browser.errors() == []
    assert set(browser.requests()) <= {url}  # the page itself, nothing else


def test_doctor_page(browser, doctor_run, tmp_path):
    report = json.loads((doctor_run / "report.json").read_text())
    url = browser.open(doctor_run / "report.html")
    _clean(browser, url)
    assert browser.js("document.querySelector('#verdict h1').textContent") == report["verdict"]
    codes = browser.js("[...document.querySelectorAll('#findings .finding')].map(f => f.dataset.code)")
    assert codes == [f["code"] for f in report["findings"]] and "SCRIPT_FAILED" in codes
    fixes = browser.js("[...document.querySelectorAll('#findings .fix')].map(f => f.textContent)")
    assert fixes == [f["hint"] for f in report["findings"] if f["hint"]]
    # markup from the script's name and its exception message is text, not elements
    assert browser.js("document.querySelectorAll('img, [onerror], b.x, script').length") == 0
    shown = browser.js("document.body.innerText")
    assert "train <b class=x> & 'q'.py" in shown
    assert 'RuntimeError: <img src=x onerror=alert(1)> & "q" \\x1b[31mred\\x1b[0m' in shown
    # graph breaks by source line, with the line of code; the recompile with its guard text
    assert "torch._dynamo.graph_break()" in browser.js("document.querySelector('#graph-breaks pre.source').textContent")
    guards = browser.js("[...document.querySelectorAll('#recompiles tr.recompile code')].map(c => c.textContent)")
    assert any("size mismatch at index 0" in g for g in guards)
    assert browser.js("document.querySelectorAll('#timeline svg rect.bar').length") == report["compile"]["compiles"]
    assert browser.js("document.querySelectorAll('#loss svg path[d^=M]').length") == len(report["steps"]["losses"]) == 1
    assert report["provenance"]["torch"] in browser.js("document.querySelector('#provenance').innerText")
    _check_screenshot(browser.screenshot(tmp_path / "doctor.png"))


def test_check_page(browser, check_run, tmp_path):
    report = json.loads((check_run / "report.json").read_text())
    url = browser.open(check_run / "report.html")
    _clean(browser, url)
    verdict = browser.js("document.querySelector('#verdict h1').textContent")
    assert verdict == report["verdict"] and verdict.startswith("DIVERGED at step 0")
    facts = browser.js("document.querySelector('#first-divergence').innerText")
    assert "Net.noise" in facts and "aten.randn.generator" in facts
    assert browser.js("document.querySelectorAll('#curves svg path').length") >= 3  # both losses and |Δloss|
    assert browser.js("document.querySelectorAll('#sides .side').length") == 2
    _check_screenshot(browser.screenshot(tmp_path / "check.png"))


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_drift_page(browser, drift_run, tmp_path):
    d = json.loads((drift_run / "report.json").read_text())["drift"]
    url = browser.open(drift_run / "report.html")
    _clean(browser, url)
    assert browser.js("document.querySelector('#verdict h1').textContent") == d["verdict"]
    assert browser.js("document.querySelectorAll('#plots svg').length") == len(d["plots"]) == 2
    assert browser.js("document.querySelectorAll('#plots svg circle').length") == 2 + 2 * 2  # runs, pairs
    assert browser.js("document.querySelectorAll('#runs tr').length") == 1 + len(d["runs"]) == 5
    assert browser.js("document.querySelectorAll('b.x, img, script').length") == 0
    assert "toy <b class=x> & 'q'.py" in browser.js("document.querySelector('#verdict').innerText")
    _check_screenshot(browser.screenshot(tmp_path / "drift.png"))


def test_a_nan_loss_page_draws_the_curve_up_to_it_and_says_where_it_ends(browser, nan_run, tmp_path):
    url = browser.open(nan_run / "report.html")
    _clean(browser, url)
    assert browser.js("document.querySelector('#loss text.nonfinite').textContent") == "rank 0: nan from step 2"
    assert browser.js("document.querySelector('#loss svg path[d^=M]').getAttribute('d').split('L').length") == 2
    box = browser.js("JSON.stringify(document.querySelector('#loss svg').getBoundingClientRect())")
    assert json.loads(box)["width"] > 600  # drawn, at the page's width
    _check_screenshot(browser.screenshot(tmp_path / "nan.png"))


def test_compare_page_plots_b_against_as_band(browser, tmp_path):
    """A compare report judged on logs built here (the command end to end: test_compare_runs.py)."""
    from synthetic_runs import loss_config

    from torchrepro.analysis.equivalence import compare_report, judge
    from torchrepro.render.html import render_html

    a1, a2, b = [1.0, 0.9, 0.8, 0.7, 0.6], [1.0, 0.9000001, 0.8000001, 0.7, 0.6000001], [1.0, 0.9, 0.85, 0.75, 0.6]
    section = judge(*(loss_config(tmp_path, label, x) for label, x in (("a-1", a1), ("a-2", a2), ("b", b))))
    page = tmp_path / "compare.html"
    page.write_text(render_html(compare_report(section, {}, {}, {})))
    url = browser.open(page)
    _clean(browser, url)
    assert browser.js("document.querySelectorAll('#band svg').length") == 2
    assert browser.js("document.querySelectorAll('#band svg polygon.band').length") >= 2  # A's band; what is allowed
    labels = browser.js("[...document.querySelectorAll('#band text.mark-label')].map(t => t.textContent)")
    assert labels == ["first step out of A's band: step 2"] * 2
    assert "step 2" in browser.js("document.querySelector('#first-out').innerText")
    _check_screenshot(browser.screenshot(tmp_path / "compare.png"))


def test_the_page_forbids_remote_loads(browser, doctor_run, tmp_path):
    """The harness sees what it must: a page that tries to load from the network (here: an image
    slipped into a copy of the report) shows the attempt and an error, and the page's policy refuses it."""
    tampered = tmp_path / "tampered.html"
    page = (doctor_run / "report.html").read_text()
    remote = "http://127.0.0.1:9/pixel.png"
    tampered.write_text(page.replace("<main>", f'<main><img src="{remote}">', 1))
    url = browser.open(tampered)
    assert any("Content Security Policy" in e for e in browser.errors()), browser.errors()
    assert set(browser.requests()) == {url, remote}
    assert browser.blocked() == {remote: "csp"}


def _check_screenshot(path: Path) -> None:
    from PIL import Image

    assert path.stat().st_size > 20_000
    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
    assert image.width == 1200 and image.height > 900
    small = image.resize((120, image.height // 10))
    colours = small.getcolors(maxcolors=1 << 16) or []
    background = max(colours)[0] / (small.width * small.height)
    assert len(colours) > 50 and background < 0.9, (len(colours), background)
