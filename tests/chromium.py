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


# ---- layout ------------------------------------------------------------------------------------
# Widths a report must read well at: a desktop window and half a laptop screen.
WIDTHS = (1400, 800)
# Boxes closer than this (CSS px) are not counted as overlapping: antialiasing and rounding.
SLACK_PX = 1.0

# Runs in a wrapper page around two iframes that hold the report (srcdoc: same origin, so the
# wrapper can measure them; the report keeps its own CSP inside). Every <details> is opened first,
# so collapsed tables are measured too. Writes its findings as JSON into #tt-layout.
_MEASURE_JS = r"""
function measure(doc, win) {
  const slack = %(slack)s;
  const r = {page: [], overflow: [], cut: [], wrapped: [], split: [], overlap: [], outside: [], svgs: 0, cells: 0};
  doc.querySelectorAll('details').forEach(d => { d.open = true; });
  const where = el => {
    const s = el.closest('section[id]');
    return (s ? s.id : '') + ' <' + el.tagName.toLowerCase() + '> ' + (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 70);
  };
  const W = doc.documentElement.clientWidth;
  if (doc.documentElement.scrollWidth > W + slack) r.page.push('page is ' + doc.documentElement.scrollWidth + ' px wide in a ' + W + ' px window');
  for (const c of doc.querySelectorAll('td, th, .metric .value, dd, h1, h2, h3, h4, p, li, summary, figcaption')) {
    r.cells++;
    if (c.scrollWidth > c.clientWidth + slack) r.overflow.push(where(c));
  }
  for (const t of doc.querySelectorAll('table')) {
    const box = t.parentElement;
    const w = t.getBoundingClientRect().width;
    if (w > box.clientWidth + slack) r.cut.push(where(t.querySelector('caption, th') || t) + ': table ' + Math.round(w) + ' px in ' + box.clientWidth + ' px');
  }
  const lines = node => {
    const range = doc.createRange(); range.selectNodeContents(node);
    return new Set([...range.getClientRects()].filter(q => q.width > 0).map(q => Math.round(q.bottom))).size;
  };
  for (const c of doc.querySelectorAll('td.num, .metric .value, .badge')) if (lines(c) > 1) r.wrapped.push(where(c));
  const walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
  for (let n; (n = walker.nextNode());) {
    const el = n.parentElement;
    if (!el || el.closest('pre, svg, style, title')) continue;
    // A word is a run of letters and digits: a line may end at a space, after a hyphen or punctuation, or at a
    // <wbr> (a text node ends there), never between two letters or digits.
    const re = /[\p{L}\p{N}]+/gu; let m;
    while ((m = re.exec(n.data))) {
      if (m[0].length < 2) continue;
      const range = doc.createRange(); range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
      const rows = new Set([...range.getClientRects()].filter(q => q.width > 0).map(q => Math.round(q.bottom)));
      if (rows.size > 1) r.split.push('"' + m[0].slice(0, 40) + '" in ' + where(el));
    }
  }
  for (const svg of doc.querySelectorAll('svg')) {
    r.svgs++;
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].map(t => ({t: t.textContent.trim(), b: t.getBoundingClientRect()})).filter(x => x.t && x.b.width > 0);
    const id = where(svg.closest('section') || svg);
    for (const x of texts) {
      if (x.b.left < box.left - slack || x.b.right > box.right + slack || x.b.top < box.top - slack || x.b.bottom > box.bottom + slack)
        r.outside.push('"' + x.t + '" in ' + id);
    }
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const a = texts[i].b, b = texts[j].b;
      const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left), dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (dx > slack && dy > slack) r.overlap.push('"' + texts[i].t + '" and "' + texts[j].t + '" in ' + id);
    }
  }
  return r;
}
window.addEventListener('load', () => {
  const out = {};
  for (const f of document.querySelectorAll('iframe')) out[f.dataset.width] = measure(f.contentDocument, f.contentWindow);
  document.getElementById('tt-layout').textContent = JSON.stringify(out);
});
"""


@dataclass
class Layout:
    """What a report looks like in Chromium at one width: every defect found, by kind."""

    width: int
    page: list[str]  # the page is wider than the window
    overflow: list[str]  # an element whose content is wider than its box
    cut: list[str]  # a table wider than its container (cut off, or only readable by scrolling)
    wrapped: list[str]  # a number (or headline value) broken over lines
    split: list[str]  # a word broken across lines
    overlap: list[str]  # two text boxes of one figure overlapping
    outside: list[str]  # figure text outside its figure
    svgs: int
    cells: int

    def defects(self) -> dict[str, list[str]]:
        kinds = ("page", "overflow", "cut", "wrapped", "split", "overlap", "outside")
        return {k: getattr(self, k) for k in kinds if getattr(self, k)}


@dataclass
class LayoutRun:
    console: list[str]
    widths: dict[int, Layout]


def layout(path: Path, widths: tuple[int, ...] = WIDTHS) -> LayoutRun:
    """Render the report at each width in one headless Chromium and measure its layout."""
    import html
    import json

    exe = browser()
    report = path.read_text(encoding="utf-8")
    frames = "".join(f'<iframe data-width="{w}" style="display:block;width:{w}px;height:900px;border:0" srcdoc="{html.escape(report, quote=True)}"></iframe>'
                     for w in widths)
    script = _MEASURE_JS % {"slack": SLACK_PX}
    wrapper = (f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">{frames}'
               f'<pre id="tt-layout"></pre><script>{script}</script></body></html>')
    with tempfile.TemporaryDirectory(prefix="tt-layout-") as tmp:
        page = Path(tmp) / "layout.html"
        page.write_text(wrapper, encoding="utf-8")
        profile = Path(tmp) / "profile"
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               f"--window-size={max(widths) + 40},1000", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S * 2, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Chromium did not finish laying out {path.name} in {TIMEOUT_S * 2} s")
    assert proc.returncode == 0, f"Chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    m = re.search(r'<pre id="tt-layout">(.*?)</pre>', proc.stdout, flags=re.S)
    assert m and m.group(1).strip(), f"the layout script wrote nothing for {path.name}: {proc.stderr[-2000:]}"
    found = json.loads(html.unescape(m.group(1)))
    console = [m.group(1) for line in proc.stderr.splitlines() if ":CONSOLE" in line and (m := _CONSOLE.search(line))]
    return LayoutRun(console=console, widths={int(w): Layout(width=int(w), **v) for w, v in found.items()})
