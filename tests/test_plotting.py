"""relax plot: metrics.jsonl parsing, grouping by estimator with mean and min..max band, and a
real PNG written from small metrics files."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from relax.cli import main
from relax.plotting import PlotError, group_curve, group_runs, load_run, plot_runs


def write_run(path, estimator, rows, config=True):
    path.mkdir(parents=True)
    if config:
        (path / "config.json").write_text(json.dumps({"advantage_estimator": estimator}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rows(offset, steps=6, kl=False):
    out = []
    for s in range(1, steps + 1):
        row = {"rollout/step": s, "rollout/raw_reward": offset + 0.1 * s,
               "rollout/returns": offset, "rollout/advantage_raw_mean": 0.0,
               "rollout/advantage_raw_std": 1.0 + offset, "train/pg_loss": -offset,
               "train/ppo_kl": 0.0, "perf/generated_tokens_per_s": 100.0 * s}
        if kl:
            row["train/kl_loss"] = 0.01 * s
        if s % 3 == 0:  # evaluation rows are sparse
            row.update({"eval/copy/pass@1": 0.1 * s, "eval/copy/mean_reward": 0.2 * s})
        out.append(row)
    return out


def call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_group_mean_and_band_over_common_steps(tmp_path):
    a = write_run(tmp_path / "a", "grpo", rows(0.0, steps=6))
    b = write_run(tmp_path / "b", "grpo", rows(0.3, steps=5))
    c = write_run(tmp_path / "c", "reinforce_plus_plus", rows(1.0, kl=True))
    groups = group_runs([load_run(p) for p in (a, b, c)])
    assert {k: len(v) for k, v in groups.items()} == {"grpo": 2, "reinforce_plus_plus": 1}
    steps, mean, low, high = group_curve(groups["grpo"], "rollout/raw_reward")
    assert steps.tolist() == [1, 2, 3, 4, 5]  # step 6 is missing in run b
    expect = [(0.1 * s + 0.3 + 0.1 * s) / 2 for s in range(1, 6)]
    assert mean.tolist() == pytest.approx(expect)
    assert low.tolist() == pytest.approx([0.1 * s for s in range(1, 6)])
    assert high.tolist() == pytest.approx([0.3 + 0.1 * s for s in range(1, 6)])
    assert group_curve(groups["grpo"], "train/kl_loss") is None
    smoothed = group_curve(groups["reinforce_plus_plus"], "train/kl_loss", smooth=2)[1]
    assert smoothed.tolist() == pytest.approx([0.01] + [0.01 * s - 0.005 for s in range(2, 7)])


def test_distillation_runs_are_not_grouped_with_their_estimator(tmp_path):
    paths = [write_run(tmp_path / name, "grpo", rows(0.0)) for name in ("a", "b", "c", "d")]
    for path, extra in zip(paths[1:], ({"use_opd": True, "opd_only": True},
                                       {"use_opd": True, "opd_only": False},
                                       {"use_opd": False, "opd_only": False}), strict=True):
        with open(f"{path}/config.json", "w", encoding="utf-8") as f:
            json.dump({"advantage_estimator": "grpo", **extra}, f)
    groups = group_runs([load_run(p) for p in paths])
    assert {k: len(v) for k, v in groups.items()} == {"grpo": 2, "opd only (grpo)": 1,
                                                      "grpo + opd": 1}


def test_resumed_rows_win_and_null_is_nan(tmp_path):
    data = rows(0.0, steps=3) + [{"rollout/step": 2, "rollout/raw_reward": None}]
    run = load_run(write_run(tmp_path / "r", "x", data, config=False))
    assert run.estimator == "r"  # no config.json: named after the directory
    assert math.isnan(run.series["rollout/raw_reward"][2])
    assert run.series["rollout/raw_reward"][3] == pytest.approx(0.3)


def test_torn_last_line_of_a_killed_run_is_skipped_but_a_bad_middle_line_is_an_error(tmp_path):
    path = tmp_path / "killed"
    write_run(path, "grpo", rows(0.0, steps=3))
    with open(path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"rollout/step": 4, "rollout/raw_')  # killed mid-write: no newline
    run = load_run(str(path))
    assert sorted(run.series["rollout/raw_reward"]) == [1, 2, 3]
    with open(path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("\n" + json.dumps(rows(0.0, steps=5)[4]) + "\n")  # the torn line is now inside
    with pytest.raises(PlotError, match=r"metrics.jsonl:4:"):
        load_run(str(path))


def test_relax_plot_writes_a_png(tmp_path):
    runs = [write_run(tmp_path / n, e, rows(o, kl=k)) for n, e, o, k in (
        ("g1", "grpo", 0.0, False), ("g2", "grpo", 0.2, False),
        ("r1", "reinforce_plus_plus_baseline", 0.5, True))]
    out = tmp_path / "img" / "curves.png"
    code, stdout, err = call(["plot", *runs, "--output", str(out), "--smooth", "2"])
    assert (code, err) == (0, "")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "kl_loss" in stdout and "clipfrac" not in stdout  # only panels with data
    assert "eval" in stdout.split("panels: ")[1]
    groups = group_runs([load_run(p) for p in runs])
    steps, mean, _, _ = group_curve(groups["grpo"], "eval/copy/pass@1")
    assert steps.tolist() == [3, 6] and mean.tolist() == pytest.approx([0.3, 0.6])
    drawn = plot_runs(runs[:2], str(tmp_path / "two.png"), panels=["reward", "kl_loss"])
    assert drawn == ["reward", "kl_loss"]  # asked for: drawn even without data


@pytest.mark.parametrize("argv,needle", [
    (["RUN", "--output", "x.txt"], "--output x.txt"),
    (["RUN", "--output", "x.png", "--panels", "reward,nope"], "unknown panel nope"),
    (["RUN", "--output", "x.png", "--smooth", "0"], "--smooth 0"),
    (["MISSING", "--output", "x.png"], "no metrics.jsonl"),
    (["BAD", "--output", "x.png"], "metrics.jsonl:2"),
    (["RUN"], "--output"),
])
def test_errors_are_one_line(tmp_path, argv, needle):
    run = write_run(tmp_path / "run", "grpo", rows(0.0))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"rollout/step": 1, "a": 1}\nnot json\n')
    subst = {"RUN": run, "MISSING": str(tmp_path / "missing"), "BAD": str(bad)}
    code, out, err = call(["plot", *[subst.get(a, a) for a in argv]])
    assert code == 2 and out == "" and err.count("\n") == 1, (code, err)
    assert err.startswith("relax plot: error: ") and needle in err, err
    with pytest.raises(PlotError):
        load_run(str(bad))
