"""What frameworks call instead of writing through FUSE (issue 34): `put` hands a file's bytes
to the mount's daemon in a sealed memfd (put.py); `torch_io` saves and loads torch objects
with it. torch is imported only by torch_io, and only when it is called; the daemon never
imports this package."""
