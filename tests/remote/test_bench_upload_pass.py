"""tools/bench/upload_pass.py against the real RGW: an arm's passes each upload the new file
with the requests a pass makes now (two LISTs of gc/, three PUTs, no HEAD for a small pack),
and the table gives each arm's figures."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.docs import REPO
from tools.bench.upload_pass import main, run_arm, table

pytestmark = pytest.mark.usefixtures("aws_env")  # the engine's keys in AWS_* (conftest.py)


def test_an_arms_passes_and_their_requests(tmp_path, rgw, s3_bucket):
    r = run_arm(REPO, tmp_path, rgw.credentials.endpoint, f"s3://{s3_bucket.name}/arm", 2, 1)
    assert len(r["wall"]) == len(r["cpu"]) == 2 and all(w > 0 for w in r["wall"])
    # gc/ at the start and after the PUT (and before it, and index/, only if the pass was
    # slow: the clock is real here; tests/remote/test_pass_looks.py moves one); no HEAD
    for req in r["requests"]:
        assert req.get("PutObject") == 3 and "HeadObject" not in req and 2 <= req["ListObjectsV2"] <= 4, req
    rows = table([(REPO, r), (Path("/other"), r)]).splitlines()
    assert len(rows) == 4 and rows[2].startswith(f"| {REPO} |") and "PutObject 3" in rows[2]


def test_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--passes", "0"])
    with pytest.raises(SystemExit):
        main(["--code", str(tmp_path)])
    assert "no cowfs/ there" in capsys.readouterr().err
