"""Tests of cowfs, by layer: engine/ (the store and pure units, no mount), mount/ (real FUSE
mounts), harness/ (the crash and load harnesses of tools/), support/ (helpers they import)."""
