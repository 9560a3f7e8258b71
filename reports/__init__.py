"""Renderers: the Analysis in HTML, Markdown, JSON, terminal text and an annotated trace. No analysis here."""
