"""The FUSE layer: a thin translation of pyfuse3 requests to the engine's Store API."""
