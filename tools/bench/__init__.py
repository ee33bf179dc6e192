"""cowfs benchmark (issue 6): `python -m tools.bench [--full]`, run by `make bench`. See docs/benchmarks.md."""
