# cowfs developer entry points. Non-interactive: safe for CI (no tty, no stdin).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# ceph-*/radosgw: tests/remote bring up a one-node Ceph cluster with RGW on 127.0.0.1
# (tests/support/rgw.py, docs/remote-tests.md); no ceph-mgr is needed for that
APT_PACKAGES := fuse3 libfuse3-dev pkg-config libisal-dev strace patch ceph-mon ceph-osd radosgw ceph-common
# Pinned CPU wheel; installed on its own first so nothing resolves a CUDA torch.
TORCH := torch==2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NATIVE_SRC := $(wildcard native/*.c native/*.h native/*.map native/blake3/*.c native/blake3/*.h native/blake3/*.S)

.PHONY: setup apt-deps mount-helper test sanitize demo bench bench-remote bench-union crashtest loadtest clean

setup: $(STAMP) mount-helper

# Runs every time (cheap dpkg check), but as an order-only prerequisite it
# never makes the stamp out of date by itself.
apt-deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg -s "$$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "apt packages missing:$$missing"; \
	  $(SUDO) apt-get update; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(APT_PACKAGES); \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Re-running the editable install when a native/ source changes rebuilds the extension. Then
# pyfuse3 is rebuilt from its source release with the GIL released around its copies
# (cowfs/fs/binding.py); tools/pyfuse3_build.py does nothing when that build is there already.
$(STAMP): pyproject.toml setup.py $(NATIVE_SRC) native/pyfuse3/cowfs.patch tools/pyfuse3_build.py | apt-deps $(VPY)
	$(VPY) -m pip install --no-input $(TORCH)
	$(VPY) -m pip install --no-input -e '.[test]'
	$(VPY) tools/pyfuse3_build.py
	touch $@

# mount(8) and /etc/fstab run /sbin/mount.fuse.cowfs for type fuse.cowfs (README): link it to the
# venv's mount.cowfs. Root only; again changes nothing; another file there is left (and said).
mount-helper: $(STAMP)
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "not root: /sbin/mount.fuse.cowfs not linked (sudo make mount-helper); tests through mount(8) are skipped"; \
	else \
	  $(VPY) -m cowfs.mount_helper --install || echo "mount(8) runs the /sbin/mount.fuse.cowfs that is there"; \
	fi

# two test processes (pytest-xdist): most tests wait on mounts, daemons and subprocesses, so
# two keep both cores of a 2-core machine busy (22 min instead of 30 with two busy loops beside
# them, docs/reliability.md); every test has its own tmp dirs, ports and mounts
TEST_WORKERS ?= 2
test: setup
	$(VPY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

# native/ built with ASan and UBSan into build/sanitize (the package's Python beside it), then the
# native unit tests against it: any leak-free memory error or undefined behaviour fails the run
SAN_DIR := build/sanitize
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g
sanitize: setup
	rm -rf $(SAN_DIR) && mkdir -p $(SAN_DIR)
	cp -r cowfs $(SAN_DIR)/cowfs && rm -f $(SAN_DIR)/cowfs/_native*.so
	CFLAGS="$(SAN_FLAGS)" LDFLAGS="$(SAN_FLAGS)" $(VPY) setup.py -q build_ext --build-lib $(SAN_DIR) --build-temp $(SAN_DIR)/tmp
	cd $(SAN_DIR) && PYTHONPATH=$(CURDIR)/$(SAN_DIR):$(CURDIR) PYTHONMALLOC=malloc \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  $(CURDIR)/$(VPY) -m pytest -q -p no:cacheprovider --rootdir $(CURDIR) --import-mode=append -o pythonpath=$(SAN_DIR) \
	  $(CURDIR)/tests/engine/test_native.py $(CURDIR)/tests/engine/test_native_blake3.py $(CURDIR)/tests/engine/test_native_floatcodec.py $(CURDIR)/tests/engine/test_native_dataplane.py $(CURDIR)/tests/engine/test_native_fixed_cuts.py $(CURDIR)/tests/engine/test_native_osutil.py \
	  $(CURDIR)/tests/engine/test_sanitized_build.py

demo: setup
	$(VPY) tools/demo.py

# issue 6 and 14 benchmark (tools/bench, docs/benchmarks.md): quick mode by default;
# make bench ARGS=--full for GPT-2 small; ARGS="--full --update-docs" refreshes docs/benchmarks.md;
# ARGS="--only compaction" runs the issue-14 (compaction) targets alone
ARGS ?=
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(VPY) -m pip install --no-input -e '.[test,bench]'
	touch $@

bench: $(BENCH_STAMP)
	COWFS_BENCH_COMMAND='make bench$(if $(ARGS), ARGS="$(ARGS)")' $(VPY) -m tools.bench $(ARGS)

# issue 17: the remote tier against a Ceph RGW it starts on 127.0.0.1 (docs/benchmarks.md, "Remote tier")
bench-remote: $(BENCH_STAMP)
	$(VPY) -m tools.bench.remote $(ARGS)

# issue 35: a checkpoint written by 2, 4 and 8 producers, seen whole by an --all-stores consumer
bench-union: $(BENCH_STAMP)
	$(VPY) -m tools.bench.union $(ARGS)

# kill -9 cycles through a real mount (tools/crashtest/); CI runs 20 of them in make test
N ?= 100
crashtest: setup
	$(VPY) -m tools.crashtest --cycles $(N)

# 8 processes saving and reading checkpoints through one mount while snapshots and gc run
SECONDS_LOAD ?= 300
loadtest: setup
	$(VPY) -m tools.loadtest --procs 8 --seconds $(SECONDS_LOAD)

clean:
	rm -rf $(VENV) build *.egg-info cowfs/_native*.so .pytest_cache .hypothesis
	find . -name .git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
