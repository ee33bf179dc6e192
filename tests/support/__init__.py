"""Helpers the tests import: stores (storeutil), real mounts (mountutil), a simulated disk
that loses power (powerloss_device)."""
