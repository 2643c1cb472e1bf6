"""The remote reward model's and --group-rm's flags (relax/config/sections/rewards.py): each bad
value is exit 2 with one line naming the flag; --dry-run never touches the network."""

from __future__ import annotations

import pytest

URL = "http://127.0.0.1:9/reward"  # the discard port: nothing listens, --dry-run must not care


def remote(*flags):
    return ["--prompt-data", "README.md", "--rm-type", "remote_rm", *flags]


ROWS = {
    "no-url": (remote(), ("--rm-type remote_rm", "needs --rm-url")),
    "url-without-remote": (["--rm-url", URL], (f"--rm-url {URL}", "--rm-type remote_rm")),
    "not-http": (remote("--rm-url", "ftp://host/reward"), ("--rm-url ftp://host/reward",
                                                           "http:// or https://")),
    "no-host": (remote("--rm-url", "http:///reward"), ("--rm-url http:///reward", "with a host")),
    "bad-port": (remote("--rm-url", "http://host:99999/r"), ("--rm-url http://host:99999/r",
                                                             "not a URL")),
    "concurrency-zero": (remote("--rm-url", URL, "--reward-max-concurrency", "0"),
                         ("--reward-max-concurrency 0", ">= 1")),
    "batch-zero": (remote("--rm-url", URL, "--rm-batch-size", "0"), ("--rm-batch-size 0",)),
    "retries-negative": (remote("--rm-url", URL, "--rm-retries", "-1"), ("--rm-retries -1",)),
    "backoff-zero": (remote("--rm-url", URL, "--rm-retry-backoff", "0"),
                     ("--rm-retry-backoff 0", "(0, 30]")),
    "retries-without-remote": (["--rm-retries", "2"], ("--rm-retries 2", "remote_rm")),
    "group-without-function": (["--group-rm"], ("--group-rm", "--custom-rm-path")),
    "group-with-remote": (remote("--rm-url", URL, "--group-rm"), ("--group-rm",
                                                                   "--custom-rm-path")),
    "genrm-without-model": (["--prompt-data", "README.md", "--rm-type", "genrm"],
                            ("--rm-type genrm", "needs --genrm-model-path")),
    "genrm-not-a-model": (["--prompt-data", "README.md", "--rm-type", "genrm",
                           "--genrm-model-path", "docs"],
                          ("--genrm-model-path docs", "not a Hugging Face model directory")),
    "genrm-flag-without-genrm": (["--genrm-max-response-len", "8"],
                                 ("--genrm-max-response-len 8", "--rm-type genrm")),
}


@pytest.mark.parametrize("row", ROWS)
def test_bad_reward_service_flags_are_one_line(cli, rejected, row):
    flags, needles = ROWS[row]
    rejected(cli(["train", *flags, "--dry-run"]), *needles)


def test_good_reward_service_flags_resolve_without_a_server(cli, tmp_path):
    cfg = cli(["train", *remote("--rm-url", URL, "--reward-max-concurrency", "8",
                                "--rm-batch-size", "4", "--rm-retries", "0"),
               "--dry-run"]).config()
    assert (cfg["rm_type"], cfg["rm_url"], cfg["reward_max_concurrency"]) == (
        "remote_rm", URL, 8)
    assert (cfg["rm_batch_size"], cfg["rm_retries"], cfg["rm_retry_backoff"]) == (4, 0, 1.0)
    reward = tmp_path / "judge.py"
    reward.write_text("def judge(prompts, responses, labels):\n    return [0.0] * len(prompts)\n")
    cfg = cli(["train", "--prompt-data", "README.md", "--custom-rm-path", f"{reward}:judge",
               "--group-rm", "--dry-run"]).config()
    assert cfg["group_rm"] is True


def test_relax_eval_refuses_the_remote_reward_model(cli, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = cli(["eval", str(tmp_path), "--eval-prompt-data", "README.md", "--rm-type",
                  "remote_rm"])
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith("relax eval: error: --rm-type remote_rm: ") and (
        "relax train" in result.err)


@pytest.fixture
def judge_dir(tmp_path):
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "config.json").write_text("{}")
    return str(tmp_path / "judge")


def genrm(judge_dir, *flags):
    return ["train", "--prompt-data", "README.md", "--rm-type", "genrm", "--genrm-model-path",
            judge_dir, *flags, "--dry-run"]


@pytest.mark.parametrize("text,needle", [
    ("Is {prompt} right?", "has no {response} field"),
    ("{response} vs {answer}", "unknown field {answer}"),
    ("{response} {", "not a template"),
    # parsed as they are filled: a spec, a conversion or a nested field is refused
    ("{response:d}", "field {response:d} has a format spec; write {response} alone"),
    ("{response:{foo}}", "field {response:{foo}} has a format spec"),
    ("{response:>10000000}", "field {response:>10000000} has a format spec"),
    ("{response!r}", "field {response!r} has a conversion; write {response} alone"),
    ("{prompt!s:>9} {response}", "field {prompt!s:>9} has a format spec"),
    ("{response.upper}", "unknown field {response.upper}"),
    ("{response[0]}", "unknown field {response[0]}")])
def test_a_template_without_the_fields_it_needs_is_one_line(cli, rejected, judge_dir, tmp_path,
                                                             text, needle):
    template = tmp_path / "t.txt"
    template.write_text(text)
    rejected(cli(genrm(judge_dir, "--genrm-prompt-template", str(template))),
             f"--genrm-prompt-template {template}", needle)


def test_a_missing_template_file_and_evaluation_are_refused(cli, rejected, judge_dir, tmp_path):
    rejected(cli(genrm(judge_dir, "--genrm-prompt-template", str(tmp_path / "none.txt"))),
             "--genrm-prompt-template", "cannot read it")
    rejected(cli(genrm(judge_dir, "--eval-interval", "1", "--eval-prompt-data", "x",
                       "README.md")), "--rm-type genrm", "--eval-interval 1")


def test_good_genrm_flags_resolve(cli, judge_dir, tmp_path):
    template = tmp_path / "t.txt"
    template.write_text("Q: {prompt}\nA: {response}\nGold: {label}\nCorrect?")
    cfg = cli(genrm(judge_dir, "--genrm-prompt-template", str(template),
                    "--genrm-max-response-len", "8")).config()
    assert (cfg["rm_type"], cfg["genrm_model_path"], cfg["genrm_max_response_len"]) == (
        "genrm", judge_dir, 8)
