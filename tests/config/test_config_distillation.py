"""reinforce_plus_plus.md §7b flags: each bad value is exit 2 with one line naming the flag,
before anything is loaded (``--dry-run`` resolves and prints the config only)."""

from __future__ import annotations

import pytest


@pytest.fixture
def teacher_dir(tmp_path):
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text("{}")
    return str(tmp_path / "teacher")


def _rows(teacher, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2", "solution": "2"}\n')
    self_ = ["--use-opd", "--opd-type", "self", "--prompt-data", str(data), "--rm-type", "math",
             "--opsd-privileged-info-key", "solution"]
    return {
        "negative-coef": (["--use-opd", "--opd-teacher-load", teacher, "--opd-kl-coef", "-0.5"],
                          ("--opd-kl-coef -0.5", "must be >= 0")),
        "nan-coef": (["--use-opd", "--opd-teacher-load", teacher, "--opd-kl-coef", "nan"],
                     ("--opd-kl-coef", "finite")),
        "huge-coef": (["--use-opd", "--opd-teacher-load", teacher, "--opd-kl-coef", "1e39"],
                      ("--opd-kl-coef 1e+39", "float32")),
        "no-teacher": (["--use-opd"], ("--use-opd", "--opd-teacher-load DIR")),
        "missing-teacher": (["--use-opd", "--opd-teacher-load", str(tmp_path / "gone")],
                            ("--opd-teacher-load", "gone", "no such directory")),
        "not-a-model-dir": (["--use-opd", "--opd-teacher-load", str(tmp_path)],
                            ("--opd-teacher-load", "no config.json")),
        "self-without-key": (self_[:-2], ("--opd-type self", "--opsd-privileged-info-key KEY")),
        "beta-above-1": ([*self_, "--opsd-beta", "1.5"], ("--opsd-beta 1.5", "[0, 1]")),
        "beta-below-0": ([*self_, "--opsd-beta", "-0.1"], ("--opsd-beta -0.1", "[0, 1]")),
        "clip-zero": ([*self_, "--opsd-jsd-clip", "0"], ("--opsd-jsd-clip 0", "must be > 0")),
        "clip-negative": ([*self_, "--opsd-jsd-clip", "-1"], ("--opsd-jsd-clip -1", "> 0")),
        "self-builtin-task": (["--use-opd", "--opd-type", "self", "--opsd-privileged-info-key",
                               "solution"], ("--opsd-privileged-info-key", "--prompt-data file")),
        "self-partial": ([*self_, "--partial-rollout", "--over-sampling-batch-size", "64",
                          "--mask-offpolicy-in-partial-rollout"], ("--opd-type self", "--partial-rollout")),
        "beta-without-self": (["--use-opd", "--opd-teacher-load", teacher, "--opsd-beta", "0.2"],
                              ("--opsd-beta 0.2", "without --opd-type self")),
        "key-without-opd": (["--opsd-privileged-info-key", "s"],
                            ("--opsd-privileged-info-key", "without --use-opd")),
        "server-without-teacher": (["--use-opd", "--opd-type", "server"],
                                   ("--opd-type server", "--opd-teacher-url URL")),
        "server-url-and-dir": (["--use-opd", "--opd-type", "server", "--opd-teacher-url",
                                "http://127.0.0.1:8000", "--opd-teacher-load", teacher],
                               ("--opd-teacher-url", "--opd-teacher-load", "one of the two")),
        "server-bad-url": (["--use-opd", "--opd-type", "server", "--opd-teacher-url", "host:1"],
                           ("--opd-teacher-url", "not an http(s) URL")),
        # urlsplit itself raises on it: refused in one line, not a traceback
        "server-unparsable-url": (["--use-opd", "--opd-type", "server", "--opd-teacher-url",
                                   "http://[::1"], ("--opd-teacher-url http://[::1",
                                                    "not a URL (Invalid IPv6 URL)")),
        "server-temperature": (["--use-opd", "--opd-type", "server", "--opd-teacher-url",
                                "http://127.0.0.1:8000", "--rollout-temperature", "0.7"],
                               ("--rollout-temperature 0.7", "temperature 1 only")),
        "server-timeout": (["--use-opd", "--opd-type", "server", "--opd-teacher-url",
                            "http://127.0.0.1:8000", "--opd-teacher-timeout", "0"],
                           ("--opd-teacher-timeout 0", "(0, 86400]")),
        "url-without-server": (["--use-opd", "--opd-teacher-load", teacher, "--opd-teacher-url",
                                "http://127.0.0.1:8000"],
                               ("--opd-teacher-url", "without --opd-type server")),
        "coef-without-opd": (["--opd-kl-coef", "0.5"], ("--opd-kl-coef 0.5", "without --use-opd")),
        "teacher-without-opd": (["--opd-teacher-load", teacher],
                                ("--opd-teacher-load", "without --use-opd")),
        "only-without-opd": (["--opd-only"], ("--opd-only", "without --use-opd")),
        "only-with-zero-coef": (["--use-opd", "--opd-teacher-load", teacher, "--opd-only",
                                 "--opd-kl-coef", "0"], ("--opd-only", "--opd-kl-coef 0")),
    }


ROW_NAMES = [
    "negative-coef", "nan-coef", "huge-coef", "no-teacher", "missing-teacher", "not-a-model-dir",
    "self-without-key", "beta-above-1", "beta-below-0", "clip-zero", "clip-negative",
    "self-builtin-task", "self-partial", "beta-without-self", "key-without-opd",
    "server-without-teacher", "server-url-and-dir", "server-bad-url", "server-unparsable-url",
    "server-temperature",
    "server-timeout", "url-without-server", "coef-without-opd", "teacher-without-opd", "only-without-opd",
    "only-with-zero-coef"]


@pytest.mark.parametrize("row", ROW_NAMES)
def test_bad_distillation_flags_are_one_line(cli, rejected, row, teacher_dir, tmp_path):
    flags, needles = _rows(teacher_dir, tmp_path)[row]
    rejected(cli(["train", *flags, "--dry-run"]), *needles)


def test_good_distillation_flags_resolve(cli, teacher_dir):
    cfg = cli(["train", "--use-opd", "--opd-teacher-load", teacher_dir, "--opd-kl-coef", "0.5",
               "--opd-only", "--dry-run"]).config()
    assert cfg["use_opd"] and cfg["opd_only"] and cfg["opd_type"] == "model"
    assert (cfg["opd_kl_coef"], cfg["opd_teacher_load"]) == (0.5, teacher_dir)
    off = cli(["train", "--dry-run"]).config()
    assert not off["use_opd"] and off["opd_kl_coef"] == 1.0


def test_the_distillation_section_reads_the_flags(teacher_dir):
    from relax.config import parse_train_config

    cfg = parse_train_config(["--use-opd", "--opd-teacher-load", teacher_dir, "--opd-kl-coef",
                              "0.25", "--opd-only"])
    d = cfg.distillation
    assert (d.use_opd, d.opd_type, d.opd_kl_coef, d.opd_teacher_load, d.opd_only) == (
        True, "model", 0.25, teacher_dir, True)


def test_self_mode_resolves_without_a_teacher_directory(cli, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2", "solution": "2"}\n')
    cfg = cli(["train", "--use-opd", "--opd-type", "self", "--prompt-data", str(data),
               "--rm-type", "math", "--opsd-privileged-info-key", "solution", "--opsd-beta",
               "0", "--opsd-jsd-clip", "0.1", "--dry-run"]).config()
    assert (cfg["opd_type"], cfg["opd_teacher_load"], cfg["opsd_beta"]) == ("self", None, 0.0)
    assert (cfg["opsd_jsd_clip"], cfg["opsd_privileged_info_key"]) == (0.1, "solution")
