"""`kvmoq demo` as a newcomer runs it: a real relay, two real sidecars, and two SmolLM2
model servers that reach the relay only through their sidecars; with `--keep`, the services
left running answer, and Ctrl-C or SIGTERM stops every one."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import IO, Any

import pytest

from sidecar.address import free_udp_port
from sidecar.moqt.aio.tls import write_certificate
from tests.support.processes import processes_with_marker, stop_marked
from tests.support.sidecar import wait_for


class Lines:
    """A process's stdout, read by a thread, so a test can wait for one line with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in stream:
                self._lines.put(line)
            self._lines.put(None)

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while (line := self._lines.get(timeout=max(end - time.monotonic(), 0.1))) is not None:
            self.seen.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"{pattern!r} never printed:\n{''.join(self.seen)[-3000:]}")

    def rest(self) -> str:
        self._reader.join(30)
        while (line := self._lines.get_nowait()) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
@pytest.mark.model
def test_demo_loads_faster_than_recompute_with_the_same_text(tmp_path: Path) -> None:
    """One run does it all (the demo takes minutes): the figures, then with --keep a request
    to the decode server left running, then Ctrl-C stops every process."""
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    report_path = tmp_path / "report.json"
    demo = subprocess.Popen(
        [
            *(sys.executable, "-m", "sidecar.cli", "demo", "--tokens", "256"),
            *("--compression", "fp16,int8", "--keep"),
            *("--out", str(tmp_path), "--json", str(report_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, key: value},
    )
    try:
        assert demo.stdout is not None
        lines = Lines(demo.stdout)
        url = lines.wait_for(r"curl -s (http://\S+/generate)", timeout=240)[1]
        status, answer = post(url, {"text": " In short,", "max_new_tokens": 8, "track": "int8"})
        assert status == 200, answer
        assert answer["reused_tokens"] == 256
        assert answer["computed_tokens"] == answer["prompt_tokens"] - 256 > 0
        assert set(answer["track_bytes"]) == {"int8"}
        assert answer["text"]
        status, refused = post(url, {"text": ""})
        assert status == 400 and "text" in refused["error"]
        assert processes_with_marker(marker)  # still up, serving
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        assert demo.wait(120) == 130
        output = lines.rest()
    finally:
        if demo.poll() is None:
            demo.kill()
        stop_marked(marker)  # what a failed run left, whatever its parent did
    assert "every process the demo started is stopped" in output
    report = json.loads(report_path.read_text())
    tracks = report["tracks"]
    for name in ("fp16", "int8"):
        assert tracks[name]["loaded_tokens"] == 256
        assert tracks[name]["load_s"] < report["recompute_s"], name
        assert tracks[name]["same_text"], name
        assert tracks[name]["stopped"] == "STOP_REASON_COMPLETE", name
    assert report["lookup"]["available_tokens"] == 256
    # The loads went through the decode sidecar, the publication through the prefill one.
    sidecars = report["sidecars"]
    for name in ("fp16", "int8"):
        assert sidecars["decode"]["loaded_bytes"][name] >= tracks[name]["wire_bytes"] > 0
        assert sidecars["prefill"]["published_bytes"][name] > 0
    assert tracks["fp16"]["kl"] < 1e-5
    assert tracks["int8"]["wire_bytes"] < tracks["fp16"]["wire_bytes"]
    reuse = report["prefix_reuse"]
    assert reuse["reused_tokens"] == 256
    assert reuse["same_text"]
    assert (tmp_path / "kvmoq-demo.png").stat().st_size > 0
    assert "same text" in output
    assert "the decode one loaded" in output
    assert processes_with_marker(marker) == []


def parent_of_two_children(
    marker: str, *, grandchild: bool, one_session: bool = False
) -> subprocess.Popen[str]:
    """A process that runs children 'one' and 'two' under `Children` (`one_session` as
    given) and waits on them, as `kvmoq demo --keep` does once it printed how to call its
    services; with `grandchild`, 'two' starts a process of its own, as a vLLM engine does.
    The parent leads a process group, as a shell's foreground job does. Returns once the
    parent waits."""
    key, value = marker.split("=")
    sleeper = '[sys.executable, "-c", "import time; time.sleep(600)"]'
    extra = "subprocess.Popen(" + sleeper + "); " if grandchild else ""
    script = (
        "import sys\n"
        "from sidecar.demo.children import Children\n"
        f"with Children(one_session={one_session}) as children:\n"
        "    for name, extra in (('one', ''), ('two', " + repr(extra) + ")):\n"
        "        children.start(name, [sys.executable, '-c', "
        "'import subprocess, sys, time; ' + extra + "
        "'print(\"ready\", flush=True); time.sleep(600)'], "
        "ready_prefix='ready', timeout=30)\n"
        "    print('waiting', flush=True)\n"
        "    children.wait_any()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, key: value},
        process_group=0,
    )
    assert parent.stdout is not None
    assert parent.stdout.readline() == "waiting\n"
    return parent


def all_marked(marker: str, count: int) -> list[int]:
    """The `count` processes carrying `marker`, once /proc shows them all: under a busy
    suite one of four just started was once not there yet to read."""

    def found() -> list[int] | None:
        marked = processes_with_marker(marker)
        return marked if len(marked) == count else None

    return wait_for(found, f"{count} processes carrying {marker}")


@pytest.mark.parametrize("one_session", [False, True], ids=["own-sessions", "one-session"])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_children_are_stopped_when_the_parent_is(stop: signal.Signals, one_session: bool) -> None:
    """The parent stops its children, and the grandchild goes with its child's group. The
    signal goes to the parent's whole group, as a terminal sends Ctrl-C to its foreground
    job: the children, in groups of their own, see only the parent's SIGTERM. Each child
    leads a session of its own, or, with `one_session`, a group in the parent's session."""
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    parent = parent_of_two_children(marker, grandchild=True, one_session=one_session)
    try:
        marked = all_marked(marker, 4)
        assert len({os.getpgid(pid) for pid in marked}) == 3  # the parent's, one per child
        sessions = {os.getsid(pid) for pid in marked}
        assert sessions == {os.getsid(parent.pid)} if one_session else len(sessions) == 3
        os.killpg(parent.pid, stop)
        assert parent.wait(60) != 0
        assert processes_with_marker(marker) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        stop_marked(marker)  # only what a failed assertion left


def test_children_stop_when_the_parent_is_killed_outright() -> None:
    """A parent killed with SIGKILL (a test's timeout, the OOM killer) runs no exit code:
    its children still stop, told by the kernel (`PR_SET_PDEATHSIG`)."""
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    parent = parent_of_two_children(marker, grandchild=False)
    try:
        all_marked(marker, 3)
        parent.kill()
        parent.wait(30)
        end = time.monotonic() + 30
        while processes_with_marker(marker) and time.monotonic() < end:
            time.sleep(0.1)
        assert processes_with_marker(marker) == []
    finally:
        stop_marked(marker)


@pytest.mark.model
def test_a_model_server_stops_on_sigterm_while_waiting_on_its_sidecar(tmp_path: Path) -> None:
    """A model server blocked in a gRPC call (here: registering its buffers with a sidecar
    that never comes up) ends within seconds of SIGTERM. The prefill server's case; the
    decode server installs the same handler (`exit_on_sigterm`) first thing too."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "sidecar.demo.prefill_server"),
            *("--sidecar", f"unix://{tmp_path / 'nobody.sock'}", "--tokens", "128"),
            *("--tracks", "int8"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = Lines(process.stdout)
        lines.wait_for(r'"event": "progress", "step": 1, "completed": 1', timeout=120)
        time.sleep(1.0)  # into the call that waits for the sidecar
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_demo_table_keeps_every_name_and_column_in_80_columns(tmp_path: Path) -> None:
    """Piped or logged, rich gives the table 80 columns: names wrap, nothing is cut."""
    from rich.console import Console

    from sidecar.commands.demo import _show

    def row(loaded: int, used: dict[str, int]) -> dict[str, Any]:
        return {
            "load_s": 0.26, "wire_bytes": 18.2e6, "ratio_vs_fp16": 1.3, "loaded_tokens": loaded,
            "compute_s": 0.1, "speedup_vs_recompute": 4.1, "kl": 1.18e-2, "top1": 0.954,
            "same_text": True, "tracks_used": used, "stopped": "STOP_REASON_DEADLINE",
        }  # fmt: skip

    tracks = {name: row(1024, {name: 1024}) for name in ("fp16", "int8", "ac")}
    tracks["adaptive"] = row(896, {"ac": 1, "fp16": 2, "int8": 3})
    report = {
        "tokens": 1024, "recompute_s": 1.07, "tracks": tracks,
        "prefix_reuse": {
            "prompt_tokens": 1224, "reused_tokens": 1024, "computed_tokens": 200, "load_s": 0.14,
            "compute_s": 0.35, "recompute_s": 1.28, "same_text": True,
        },
        "sidecars": {
            "prefill": {"published_bytes": {"fp16": 1e6}},
            "decode": {"loaded_bytes": {"fp16": 1e6}},
        },
    }  # fmt: skip
    out = io.StringIO()
    _show(Console(file=out, width=80), report, tmp_path)
    text = out.getvalue()
    assert "…" not in text, text
    assert max(map(len, text.splitlines())) <= 80
    words = text.split()
    for word in ("fp16", "int8", "ac", "adaptive", "(ac,", "fp16,", "int8)", "+128", "computed"):
        assert word in words, (word, text)
    for header in ("track", "wire", "vs", "load", "speedup", "KL", "top-1", "same", "text"):
        assert header in words, (header, text)


@pytest.mark.slow
@pytest.mark.model
def test_demo_says_which_step_failed_and_stops_what_it_started(tmp_path: Path) -> None:
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    cert = write_certificate(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar.cli",
            "demo",
            "--relay",
            f"moqt://127.0.0.1:{free_udp_port()}",  # nobody listens there
            "--ca",
            str(cert.cert),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, key: value},
        check=False,
    )
    assert result.returncode == 1
    assert "kvmoq demo failed" in result.stdout
    assert "prefill sidecar has no relay session" in result.stdout
    assert processes_with_marker(marker) == []


@pytest.mark.slow
@pytest.mark.model
def test_demo_refuses_an_unknown_compression() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "demo", "--compression", "zip"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "unknown compression zip" in result.stderr


@pytest.mark.slow
@pytest.mark.model
def test_demo_with_vllm_engines_loads_and_keeps_the_text(tmp_path: Path) -> None:
    """`kvmoq demo --engine vllm`: P serves, D loads through the sidecars and the relay on
    each track and on the connector's choice, then a longer prompt reuses the shared chunks."""
    from sidecar.demo.vllm_engines import unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)
    marker = f"KVMOQ_DEMO_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "sidecar.cli", "demo", "--engine", "vllm"),
            *("--tokens", "512", "--compression", "fp16,int8", "--json", str(report_path)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, key: value},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["engine"] == "vllm" and report["recompute_s"] > 0
    assert set(report["tracks"]) == {"fp16", "int8", "connector's choice"}
    for name in ("fp16", "int8"):
        row = report["tracks"][name]
        # The whole prompt: 4 chunks, written into every block, the last one up to the
        # prompt's last token, which vLLM computes.
        assert row["warnings"] == [], row  # the connector's own words, when it computed
        assert row["chunks"] == {name: 4}, row
        assert row["cached_tokens"] == 511, row
        assert row["same_text"], row
    reuse = report["prefix_reuse"]
    assert reuse["cached_tokens"] == 512 and sum(reuse["chunks"].values()) == 4
    assert reuse["same_text"]
    assert "P's text" in result.stdout
    assert processes_with_marker(marker) == []
