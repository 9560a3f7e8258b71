"""A trace whose names are markup produces reports that run nothing and show the names as text.

The payloads go into every string a report prints: kernel, op and annotation names, Python frames
and recorded call stacks, the GPU name, capture metadata and the file name. Checked statically
(no unescaped markup anywhere, also inside the inline SVG), in headless Chromium (no dialog, no
console message, no script element or handler in the DOM, with and without the page's CSP), and
in the Markdown and terminal outputs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from chromium import load, scan
from report_traces import Names, llm_trace

import tokentrace
from tokentrace.reports import figures
from tokentrace.reports.html import render_html
from tokentrace.reports.markdown import md_escape, render_markdown
from tokentrace.reports.terminal import render_terminal

SCRIPT = "<script>alert(1)</script>"
ATTR = '"><img src=x onerror=alert(1)>'
SVG = "<svg/onload=alert(1)>"
QUOTE = "' onmouseover='alert(1)"
NAMES = Names(
    kernel=f"gemv{SCRIPT}",
    kernel2=f"elementwise{ATTR}",
    op=f"aten::linear{ATTR}",
    sync_op=f"aten::item{SCRIPT}",
    frame=f"model.py(1): {SVG}{QUOTE}",
    annotation=f"sampling{SCRIPT}{ATTR}",
    gpu=f"H100{SCRIPT}",
    model=f"llama{ATTR}$x$",
    file="trace'\"><img src=x onerror=alert(1)>.json",
)


@pytest.fixture(scope="module")
def xss_analysis(tmp_path_factory):
    return tokentrace.analyze(llm_trace(tmp_path_factory.mktemp("xss"), names=NAMES))


@pytest.fixture(scope="module")
def xss_html(xss_analysis):
    return render_html(xss_analysis)


@pytest.fixture(scope="module")
def xss_text(xss_html):
    """The page with the <wbr> break points that long names get between their escaped pieces taken out."""
    return xss_html.replace("<wbr>", "")


def test_html_has_no_unescaped_markup(xss_html, xss_text):
    assert not re.search(r"<script", xss_html, re.I)
    assert "<img" not in xss_html and "<svg/" not in xss_html
    dom = scan(xss_html)
    assert dom.tags.get("script", 0) == 0 and dom.tags.get("img", 0) == 0
    assert dom.handlers == []
    # The names are there, as text: the escaping did not just drop them.
    for raw in (SCRIPT, ATTR):
        assert raw.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;") in xss_text
    assert "gemv&lt;script&gt;" in xss_text and "H100&lt;script&gt;" in xss_text


def test_payloads_reach_the_report(xss_text):
    """Guard against a vacuous pass: each kind of name really is printed somewhere."""
    for needle in ("gemv&lt;script&gt;", "aten::item&lt;script&gt;", "model.py(1): &lt;svg/onload=alert(1)&gt;", "llama&#34;&gt;&lt;img"):
        assert needle in xss_text, needle


def test_svg_text_is_escaped_and_checked():
    label = f"{SCRIPT}{ATTR}{QUOTE}]]><!--"
    svg = figures.scaling(figures.ScalingData([figures.Series(label, np.array([64.0, 128, 256]), np.array([1.0, 4, 16]), exponent=2.0,
                                                              stderr=0.01, coefficient=1 / 4096, law=True)], "sequence length"))
    assert "<script" not in svg and "<img" not in svg
    assert "&lt;script&gt;" in svg  # the label is in the SVG, as text
    svg2 = figures.roofline(figures.RooflineData([figures.RoofPoint(label, SCRIPT, 10.0, 50.0, total=False, name=True)], 900.0, 3000.0))
    assert "<script" not in svg2 and "&lt;script&gt;" in svg2


@pytest.mark.parametrize("bad", [
    '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><use xlink:href="http://x/a.svg#b"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><rect style="fill: url(http://x/p)"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><style>@import url(http://x/s.css);</style></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><foreignObject><div/></foreignObject></svg>',
])
def test_sanitize_svg_refuses_active_content(bad):
    with pytest.raises(figures.UnsafeSVG):
        figures.sanitize_svg(bad)


def test_html_runs_nothing_in_chromium(tmp_path, xss_html):
    out = tmp_path / "xss.html"
    out.write_text(xss_html)
    page = load(out)  # an alert() would block the page: load() fails on the timeout
    assert page.console == [], page.console
    dom = scan(page.dom)
    assert dom.tags.get("script", 0) == 0 and dom.tags.get("img", 0) == 0 and dom.handlers == []


def test_escaping_alone_holds_without_the_csp(tmp_path, xss_html):
    """The CSP is a second wall; the escaping must hold without it."""
    out = tmp_path / "xss-no-csp.html"
    out.write_text(xss_html.replace('http-equiv="Content-Security-Policy"', 'name="csp-removed-for-test"'))
    page = load(out)
    assert page.console == [], page.console
    dom = scan(page.dom)
    assert dom.tags.get("script", 0) == 0 and dom.tags.get("img", 0) == 0 and dom.handlers == []


def test_markdown_is_inert(xss_analysis):
    md = render_markdown(xss_analysis)
    # Commands are shown verbatim inside fenced code blocks (literal text in Markdown); everything
    # outside them must hold no raw angle bracket, so no HTML that a Markdown renderer would pass.
    blocks = re.findall(r"^(`{3,})\n(.*?)\n\1$", md, flags=re.S | re.M)
    assert blocks and all(fence not in body for fence, body in blocks)
    prose = re.sub(r"^(`{3,})\n.*?\n\1$", "", md, flags=re.S | re.M)
    assert "<" not in prose.replace("&lt;", "")
    assert "](" not in md and "![" not in md  # no link or image syntax
    assert md_escape(f"[x](http://e.com) {SCRIPT} a|b") == r"\[x\](http\:\/\/e.com) &lt;script&gt;alert(1)&lt;/script&gt; a\|b"


def test_terminal_strips_control_characters(tmp_path):
    names = Names(kernel="k\x1b[2J\x1b]0;pwned\x07", op="aten::linear\r\x1b[31m", file="t.json")
    out = render_terminal(tokentrace.analyze(llm_trace(tmp_path, names=names)), color=False)
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
