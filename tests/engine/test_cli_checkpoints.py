"""`cowfs checkpoints`, `snapshot list` with checkpoints, `prune --keep-best` and a directory
restore on an unmounted store: outputs, JSON keys and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cowfs.store import Store

from tests.support.checkpointutil import dcp_save, deepspeed_save, lightning_save, rmtree, save
from tests.support.storeutil import assert_clean, new_store

LOSSES = {100: 0.9, 200: 0.4, 300: 0.6, 400: 0.7}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cowfs.cli", *args], capture_output=True, timeout=120)


def ok(*args: str) -> str:
    r = run(*args)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


@pytest.fixture
def trained(tmp_path):
    """A store as `--snapshot-on checkpoint` leaves it: checkpoints 100-400 of /run1 (eval_loss
    LOSSES), each in its snapshot run1@step-N pinned at its commit, two kept live (rotation);
    plus a snapshot "manual" with no checkpoint. fsck'ed clean at teardown."""
    path = new_store(tmp_path / "store")
    with Store.open(path) as s:
        s.snapshot_create("manual")
        for step, loss in LOSSES.items():
            g = save(s, "/run1", step, loss)
            s.snapshot_create(f"run1@step-{step}", g)
            if step >= 300:
                rmtree(s, f"/run1/checkpoint-{step - 200}")
    yield path
    assert_clean(path)


def test_snapshot_list_shows_each_snapshots_checkpoint(trained):
    snaps = {s["name"]: s for s in json.loads(ok("snapshot", "list", str(trained), "--json"))}
    assert snaps["manual"]["checkpoint"] is None and snaps["manual"]["checkpoints"] == []
    c = snaps["run1@step-300"]["checkpoint"]
    assert (c["path"], c["step"], c["epoch"], c["metrics"]["eval_loss"]) == ("/run1/checkpoint-300", 300, 3.0, 0.6)
    assert set(c) == {"path", "step", "epoch", "metrics", "metrics_step", "best_metric", "best_model_checkpoint"}
    # pinned at trainer_state.json's commit: before the rotation that followed it
    assert snaps["run1@step-300"]["checkpoints"] == ["/run1/checkpoint-300", "/run1/checkpoint-200",
                                                     "/run1/checkpoint-100"]
    table = ok("snapshot", "list", str(trained))
    assert "run1@step-200" in table and "step 200, epoch 2.00, eval_loss=0.4" in table and "(+2 more)" in table


def test_checkpoints_lists_each_save_once_newest_first(trained):
    found = json.loads(ok("checkpoints", str(trained), "--json"))
    assert [c["step"] for c in found] == [400, 300, 200, 100]
    by = {c["step"]: c for c in found}
    assert by[100]["live"] is False and by[100]["snapshot"] == "run1@step-100"
    assert by[100]["snapshots"] == ["run1@step-100", "run1@step-200", "run1@step-300"]
    assert by[400]["live"] is True and by[400]["snapshot_path"] == "/run1/checkpoint-400"
    assert {"kind", "type", "restore", "path", "step", "epoch", "metrics", "generation", "saved", "live", "snapshot", "snapshot_path",
            "snapshots", "best_metric", "best_model_checkpoint", "metrics_step"} == set(by[100])
    ranked = json.loads(ok("checkpoints", str(trained), "/run1", "--sort", "eval_loss", "--json"))
    assert [c["step"] for c in ranked] == [200, 300, 400, 100]
    table = ok("checkpoints", str(trained), "--sort", "eval_loss")
    assert table.splitlines()[1].split()[0] == "200"
    assert f"cowfs restore {trained} /run1/checkpoint-200 --snapshot run1@step-200" in table


def test_prune_keep_best_keeps_the_best_checkpoints_snapshot(trained):
    # run1@step-400 (kept by --keep-last) was pinned before the rotation of checkpoint-200: it holds the best too
    r = json.loads(ok("prune", str(trained), "--keep-best", "eval_loss", "1", "--keep-last", "1", "--dry-run", "--json"))
    keep = {s["name"]: s["reasons"] for s in r["snapshots"] if s["keep"]}
    assert keep == {"run1@step-400": ["last 1", "best eval_loss #1 (0.4, step 200)"]}
    assert r["best"] == [{"rank": 1, "metric": "eval_loss", "value": 0.4, "step": 200, "path": "/run1/checkpoint-200",
                          "snapshot": "run1@step-400"}]
    r = json.loads(ok("prune", str(trained), "--keep-best", "eval_loss", "2", "--dry-run", "--json"))
    assert {s["name"]: s["reasons"] for s in r["snapshots"] if s["keep"]} == {
        "run1@step-200": ["best eval_loss #1 (0.4, step 200)"], "run1@step-300": ["best eval_loss #2 (0.6, step 300)"]}
    out = ok("prune", str(trained), "--keep-best", "eval_loss", "1")
    assert "best eval_loss #1 (0.4, step 200)" in out
    with Store.open(trained) as s:
        assert [x.name for x in s.snapshot_list()] == ["run1@step-200"]
    found = json.loads(ok("checkpoints", str(trained), "--json"))
    assert sorted(c["step"] for c in found) == [100, 200, 300, 400]  # 100 is in run1@step-200 too; 300, 400 live


def test_restore_a_checkpoint_directory(trained):
    out = ok("restore", str(trained), "/run1/checkpoint-200", "--snapshot", "run1@step-200")
    assert "restored /run1/checkpoint-200/" in out and "3 files" in out and "one transaction" in out
    with Store.open(trained) as s:
        for f in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
            assert s.read_file(f"/run1/checkpoint-200/{f}") == s.read_file(
                f"/run1/checkpoint-200/{f}", s.snapshot("run1@step-200").gen)
    live = {c["step"]: c["live"] for c in json.loads(ok("checkpoints", str(trained), "--json"))}
    assert live == {400: True, 300: True, 200: True, 100: False}


@pytest.mark.parametrize("args, message", [
    (("prune", "{s}", "--keep-best", "eval_accuracy", "1"), "say whether lower or higher is better"),
    (("prune", "{s}", "--keep-best", "eval_loss:best", "1"), "bad metric 'eval_loss:best'"),
    (("prune", "{s}", "--keep-best", "eval_los:min", "1"), "no checkpoint in a snapshot has the metric 'eval_los'"),
    (("prune", "{s}", "--keep-best", "eval_loss", "x"), "N must be a whole number"),
    (("prune", "{s}", "--keep-best", "eval_loss", "0"), "N must be at least 1"),
    (("checkpoints", "{s}", "/nope"), "/nope: not in the live tree nor in any snapshot"),
    (("checkpoints", "{s}", "--sort", "eval_accuracy"), "say whether lower or higher is better"),
    (("restore", "{s}", "/run1/checkpoint-400", "--snapshot", "run1@step-400"), "already exists; remove it first"),
    (("restore", "{s}", "/run1/checkpoint-100", "--snapshot", "nope"), "no snapshot named 'nope'"),
    (("restore", "{s}", "/run1/checkpoint-100", "--snapshot", "run1@step-100", "--to", "/gone/x"), "no such file"),
    (("checkpoints", "{tmp}"), "not a cowfs store"),
])
def test_bad_input_is_one_line_exit_2(trained, tmp_path, args, message):
    r = run(*(a.format(s=trained, tmp=tmp_path) for a in args))
    err = r.stderr.decode()
    assert r.returncode == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    with Store.open(trained) as s:  # nothing changed
        assert len(s.snapshot_list()) == 5 and s.resolve("/run1/checkpoint-400").is_dir


def test_keep_best_on_a_store_without_checkpoints(tmp_path):
    path = new_store(tmp_path / "store")
    with Store.open(path) as s:
        s.snapshot_create("one")
    r = run("prune", str(path), "--keep-best", "eval_loss", "1")
    assert r.returncode == 2 and b"no snapshot holds an HF Trainer checkpoint" in r.stderr
    assert b"no complete checkpoint (HF Trainer" in run("checkpoints", str(path)).stdout
    assert json.loads(ok("checkpoints", str(path), "--json")) == []
    assert_clean(path)


def test_checkpoints_of_every_kind_with_their_restore_commands(tmp_path):
    path = new_store(tmp_path / "store")
    ck = "/lt/checkpoints"
    with Store.open(path) as s:
        s.snapshot_create("lt@step-100", lightning_save(s, ck, "epoch=0-step=100.ckpt", 1))
        s.unlink(s.resolve(ck).ino, b"epoch=0-step=100.ckpt")
        s.snapshot_create("dcp@step-7", dcp_save(s, "/dcp/step-7", 10))
        rmtree(s, "/dcp/step-7")
        s.snapshot_create("ds@step-10", deepspeed_save(s, "/ds", "global_step10", 30))
        s.snapshot_create("ds@step-20", deepspeed_save(s, "/ds", "global_step20", 40))
        rmtree(s, "/ds/global_step10")
        s.snapshot_create("run1@step-300", save(s, "/run1", 300, 0.6))
    found = json.loads(ok("checkpoints", str(path), "--json"))
    assert [(c["kind"], c["type"], c["path"], c["step"], c["live"]) for c in found] == [
        ("trainer", "dir", "/run1/checkpoint-300", 300, True),
        ("deepspeed", "dir", "/ds/global_step20", 20, True),
        ("deepspeed", "dir", "/ds/global_step10", 10, False),
        ("dcp", "dir", "/dcp/step-7", 7, False),
        ("lightning", "file", f"{ck}/epoch=0-step=100.ckpt", 100, False)]
    by = {c["path"]: c for c in found}
    assert by["/dcp/step-7"]["metrics"] == {} and by["/dcp/step-7"]["epoch"] is None
    assert by["/ds/global_step10"]["snapshots"] == ["ds@step-10", "ds@step-20"]
    assert by["/ds/global_step20"]["restore"] == f"cowfs restore {path} /ds/global_step20 --snapshot ds@step-20"
    # --sort ranks by a Trainer metric: the others come last, newest first
    ranked = json.loads(ok("checkpoints", str(path), "--sort", "eval_loss", "--json"))
    assert [c["kind"] for c in ranked] == ["trainer", "deepspeed", "deepspeed", "dcp", "lightning"]
    table = ok("checkpoints", str(path))
    assert "KIND" in table and "lightning" in table and "/dcp/step-7/" in table
    for c in found:
        if not c["live"]:
            assert c["restore"] in table
            out = ok(*c["restore"].split()[1:])
            assert ("restored " + c["path"] + ("/" if c["type"] == "dir" else "")) in out
    assert all(c["live"] for c in json.loads(ok("checkpoints", str(path), "--json")))
    with Store.open(path) as s:
        assert s.read_file(f"{ck}/epoch=0-step=100.ckpt") == s.read_file(f"{ck}/epoch=0-step=100.ckpt",
                                                                           s.snapshot("lt@step-100").gen)
    # --keep-best ranks only the Trainer checkpoints
    r = json.loads(ok("prune", str(path), "--keep-best", "eval_loss", "1", "--dry-run", "--json"))
    assert {s["name"] for s in r["snapshots"] if s["keep"]} == {"run1@step-300"}
    assert_clean(path)


def test_help_and_usage_errors():
    for args in (("checkpoints", "--help"), ("prune", "--help"), ("restore", "--help")):
        out = ok(*args)
        assert "example:" in out and ("--keep-best" in out or args[0] != "prune")
    for args in (("prune", "/tmp", "--keep-best", "eval_loss"), ("checkpoints",)):
        r = run(*args)
        err = r.stderr.decode()
        assert r.returncode == 2 and err.startswith("cowfs: ") and len(err.splitlines()) == 1, err


def test_mount_snapshot_on_help_and_usage_error():
    assert "--snapshot-on" in ok("mount", "--help")
    r = run("mount", "/tmp", "/tmp/x", "--snapshot-on", "every-save")
    err = r.stderr.decode()
    assert r.returncode == 2 and "invalid choice: 'every-save'" in err and len(err.splitlines()) == 1, err
