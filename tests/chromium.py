"""Headless Chromium for the report tests: load a file, return its DOM and every console message.

Debian's `chromium` (installed by .ci/run) with flags that keep it offline and quiet. Console
messages come from `--enable-logging=stderr`: page errors, and Content-Security-Policy violations
(an inline script or handler that tried to run, a resource that tried to load) all show there.
A JavaScript dialog (alert) blocks a headless page, so a run that times out is a failure too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# A page that has not finished by then is blocked (a dialog) or broken.
TIMEOUT_S = 60
_CONSOLE = re.compile(r"CONSOLE[:(]\d*[)\]:]*\]?\s*(.*)")


@dataclass
class Page:
    dom: str
    console: list[str]


def browser() -> str:
    """Path of a Chromium binary, or skip the test with the reason."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium)")
    raise AssertionError("unreachable")


def load(path: Path) -> Page:
    exe = browser()
    with tempfile.TemporaryDirectory(prefix="tt-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", "--dump-dom", path.resolve().as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Chromium did not finish loading {path.name} in {TIMEOUT_S} s (a dialog such as alert() blocks it)")
    assert proc.returncode == 0, f"Chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    console = [m.group(1) for line in proc.stderr.splitlines() if ":CONSOLE" in line and (m := _CONSOLE.search(line))]
    return Page(dom=proc.stdout, console=console)


class DomScan(HTMLParser):
    """Tags, event-handler attributes and the ids of a serialized DOM."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.handlers: list[tuple[str, str]] = []
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append((tag, name))
            if name == "id" and value:
                self.ids.add(value)
            if name in ("src", "href", "xlink:href", "srcset", "poster", "data", "action", "formaction", "background"):
                self.refs.append((tag, name, value or ""))


def scan(html: str) -> DomScan:
    s = DomScan()
    s.feed(html)
    s.close()
    return s
