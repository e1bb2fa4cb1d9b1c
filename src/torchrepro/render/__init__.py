"""Rendering: reports computed by analysis, shown as JSON, terminal, JUnit or HTML."""
