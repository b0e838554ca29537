"""Renderers: each takes the report document (docs/report-schema.md) and writes one output format."""
