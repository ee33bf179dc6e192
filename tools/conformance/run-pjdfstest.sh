#!/bin/bash
# Run the pjdfstest POSIX conformance suite (https://github.com/pjd/pjdfstest, built
# beforehand: autoreconf -ifs && ./configure && make pjdfstest) on a fresh cowfs mount of
# this checkout, as root, mounted with --allow-other; docs/design.md has the last results.
#
#   usage: tools/conformance/run-pjdfstest.sh PJDFSTEST_DIR OUT_DIR
#
# OUT_DIR gets summary.txt (per .t file: planned and failed assertions, then the totals
# and the store's fsck after unmounting), failures.txt (the failing assertions) and the
# raw TAP output (tap/). Settings: T_TIMEOUT (seconds per .t file, default 300; a
# timeout counts its whole plan as failed), TESTS (a list of .t files relative to tests/,
# default all), KEEP_STORE=1 (keep the store), PYTHON (default: this checkout's venv).
# The mount is always unmounted, also when the run fails or is interrupted.

set -u

if [ $# -ne 2 ]; then
	echo "usage: $0 PJDFSTEST_DIR OUT_DIR" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "$0: must run as root" >&2
	exit 2
fi

CODE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PJD=$(cd "$1" && pwd) || { echo "$0: no directory $1" >&2; exit 2; }
OUT_DIR=$2
PY=${PYTHON:-$CODE_DIR/.venv/bin/python}
T_TIMEOUT=${T_TIMEOUT:-300}

[ -x "$PY" ] || { echo "$0: no $PY (run make setup first)" >&2; exit 2; }
[ -x "$PJD/pjdfstest" ] && [ -d "$PJD/tests" ] || { echo "$0: $PJD has no built pjdfstest binary and tests/" >&2; exit 2; }

mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
rm -rf "$OUT_DIR/tap"
mkdir -p "$OUT_DIR/tap"
SUMMARY=$OUT_DIR/summary.txt
FAILURES=$OUT_DIR/failures.txt
: > "$SUMMARY"
: > "$FAILURES"

RUN_DIR=$(mktemp -d /var/tmp/cowfs-conformance.XXXXXX) || exit 2
STORE=$RUN_DIR/store
MNT=$RUN_DIR/mnt
mkdir -p "$MNT" || exit 2

cowfs() {
	(cd "$CODE_DIR" && PYTHONPATH="$CODE_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m cowfs.cli "$@")
}

is_mounted() {
	grep -q " $MNT " /proc/self/mounts
}

MOUNTED=0
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	cd /
	if is_mounted; then
		echo "unmounting $MNT" >&2
		if ! timeout 300 bash -c "cd '$CODE_DIR' && PYTHONPATH='$CODE_DIR' '$PY' -m cowfs.cli umount '$MNT'"; then
			echo "cowfs umount failed; falling back to fusermount -u" >&2
			fusermount3 -u "$MNT" 2>/dev/null || fusermount -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null \
				|| umount -l "$MNT"
		fi
	fi
	if [ "$MOUNTED" = 1 ]; then
		{
			echo
			echo "== fsck (cowfs fsck $STORE, after unmount) =="
			out=$(cowfs fsck "$STORE" 2>&1); frc=$?
			echo "$out"
			if [ $frc -eq 0 ]; then echo "fsck: CLEAN (exit 0)"; else echo "fsck: NOT CLEAN (exit $frc)"; fi
		} >> "$SUMMARY"
		tail -n 3 "$SUMMARY"
	fi
	if [ "${KEEP_STORE:-0}" != 1 ] && ! is_mounted; then
		rm -rf "$RUN_DIR"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "cowfs from: $(cd "$CODE_DIR" && PYTHONPATH="$CODE_DIR" "$PY" -c 'import cowfs; print(cowfs.__file__)')"
cowfs init "$STORE" >/dev/null || { echo "cowfs init failed" >&2; exit 1; }
cowfs mount "$STORE" "$MNT" --allow-other --compact-idle off || { echo "cowfs mount failed" >&2; exit 1; }
MOUNTED=1
is_mounted || { echo "mount did not appear in /proc/mounts" >&2; exit 1; }
chmod 0755 "$MNT"

HEAD0=$(cd "$CODE_DIR" && git rev-parse --short HEAD 2>/dev/null || echo no-git)

if [ -n "${TESTS:-}" ]; then
	LIST=$(for t in $TESTS; do echo "$t"; done)
else
	LIST=$(cd "$PJD/tests" && find . -name '*.t' | sed 's|^\./||' | sort)
fi

{
	echo "pjdfstest on cowfs"
	echo "code dir : $CODE_DIR ($HEAD0)"
	echo "store    : $STORE"
	echo "mount    : $MNT ($(grep " $MNT " /proc/self/mounts | awk '{print $3}'))"
	echo "fs type  : $(cd "$MNT" && df -PT . | tail -1 | awk '{print toupper($2)}') (as seen by tests/conf)"
	echo "timeout  : ${T_TIMEOUT}s per .t"
	echo "started  : $(date -Is)"
	echo
	printf '%-26s %8s %8s  %s\n' FILE PLANNED FAILED STATUS
} >> "$SUMMARY"

TOTAL=0
FAILED_TOTAL=0
NFILES=0
NBAD=0
for t in $LIST; do
	tap=$OUT_DIR/tap/$(echo "$t" | tr / _).tap
	start=$(date +%s)
	# Each .t runs in its own scratch directory on the mount.
	work=$MNT/run.$(echo "$t" | tr /. __)
	mkdir -p "$work"
	(cd "$work" && timeout -k 15 "$T_TIMEOUT" "$PJD/tests/$t" > "$tap" 2>"$tap.err" < /dev/null)
	trc=$?
	dur=$(( $(date +%s) - start ))
	# Parse the TAP stream.
	read -r planned nresults notok <<EOF
$(awk '
	/^1\.\.[0-9]+/ { if (!seen) { split($1, a, "\\.\\."); plan = a[2]; seen = 1 } next }
	/^not ok/ { n++; if ($0 !~ /# *TODO/) bad++; next }
	/^ok/ { n++; next }
	END { printf "%d %d %d\n", (seen ? plan : -1), n, bad }' "$tap")
EOF
	status=ok
	failed=$notok
	if [ "$trc" = 124 ] || [ "$trc" = 137 ]; then
		status=TIMEOUT
		[ "$planned" -lt 1 ] && planned=1
		failed=$planned
	elif [ "$planned" -lt 0 ]; then
		status=NOPLAN
		planned=1
		failed=1
	else
		missing=$(( planned - nresults ))
		[ $missing -lt 0 ] && missing=0
		failed=$(( notok + missing ))
		[ $failed -gt $planned ] && failed=$planned
		if [ $missing -gt 0 ]; then
			status="FAIL (only $nresults of $planned results, exit $trc)"
		elif [ $failed -gt 0 ]; then
			status=FAIL
		fi
	fi
	TOTAL=$(( TOTAL + planned ))
	FAILED_TOTAL=$(( FAILED_TOTAL + failed ))
	NFILES=$(( NFILES + 1 ))
	[ "$status" != ok ] && NBAD=$(( NBAD + 1 ))
	printf '%-26s %8d %8d  %s (%ds)\n' "$t" "$planned" "$failed" "$status" "$dur" >> "$SUMMARY"
	printf '%-26s %5d/%-5d %s (%ds)\n' "$t" "$failed" "$planned" "$status" "$dur"
	if [ "$status" != ok ]; then
		{
			echo "== $t: $failed of $planned failed [$status]"
			grep '^not ok' "$tap" | grep -v '# *TODO'
			case "$status" in
			TIMEOUT) echo "   (timed out after ${T_TIMEOUT}s; whole plan counted as failed; last TAP line: $(tail -n 1 "$tap"))";;
			NOPLAN) echo "   (no TAP plan; stderr: $(head -c 300 "$tap.err" | tr '\n' ' '))";;
			FAIL\ \(*) echo "   (script stopped early; last TAP line: $(tail -n 1 "$tap"); stderr: $(tail -n 3 "$tap.err" | tr '\n' ' '))";;
			esac
			echo
		} >> "$FAILURES"
	fi
	rm -rf "$work" 2>/dev/null
done

PASSED=$(( TOTAL - FAILED_TOTAL ))
PCT=$(awk -v p=$PASSED -v t=$TOTAL 'BEGIN { if (t) printf "%.2f", 100*p/t; else print "0" }')
{
	echo
	echo "finished : $(date -Is)"
	echo "files    : $NFILES run, $NBAD with failures"
	echo "TOTAL    : $PASSED / $TOTAL assertions passed ($PCT%), $FAILED_TOTAL failed"
	HEAD1=$(cd "$CODE_DIR" && git rev-parse --short HEAD 2>/dev/null || echo no-git)
	[ "$HEAD1" != "$HEAD0" ] && echo "WARNING  : $CODE_DIR moved from $HEAD0 to $HEAD1 during the run (the mount kept running $HEAD0's code; fsck below uses $HEAD1's)"
} >> "$SUMMARY"
echo
echo "TOTAL: $PASSED / $TOTAL assertions passed ($PCT%), $FAILED_TOTAL failed; $NBAD of $NFILES files with failures"
exit 0
