"""Helpers the tests import: stores (storeutil), real mounts (mountutil), a simulated disk
that loses power (powerloss_device), a real one-node Ceph cluster with RGW (rgw)."""
