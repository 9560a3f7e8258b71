"""Renderers: an Analysis as HTML, Markdown, JSON, terminal text and an annotated trace. No analysis here.

The flow, like pyinstrument's session -> renderer: `view.build(analyses)` reads the detectors' typed
results (and the metrics registry for the headline) into a report view (`model`): a summary
(`summary`), one section per question (`sections/`, one module each, registered in
`sections.SECTIONS`) and an appendix. `render.py` picks the renderer for a format; each renderer
module (`html`, `markdown`, `terminal`) turns the view into text. `figures` draws the figures the
sections describe; `tables` turns result DataFrames into report tables by named columns.
"""
