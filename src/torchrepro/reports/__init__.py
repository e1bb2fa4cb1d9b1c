"""The typed reports: what analysis builds and the renderers read."""
