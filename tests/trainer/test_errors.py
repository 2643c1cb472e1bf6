"""Bad input reaches the user as one line ``relax train: error: ...`` with exit status 2 (input)
or 1 (failure during training); nothing saved is overwritten."""

import hashlib

import pytest

from relax import models
from relax.trainer import train
from tests.trainer.helpers import make_config, write_jsonl, write_reward


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model gets loaded: these errors must come first."""

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_policy", boom)
    monkeypatch.setattr(models, "load_tokenizer", boom)


def _error(cfg, capsys, status):
    assert train(cfg) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("relax train: error: "), err
    return err[0]


def _data_cfg(tmp_path, path, **overrides):
    return make_config("--prompt-data", write_jsonl(tmp_path, [{"input": "x", "label": 1}]),
                       "--rm-type", "math", output_dir=tmp_path / "run", prompt_data=path,
                       **overrides)


def test_missing_model_dir(tmp_path, capsys, no_model_load):
    cfg = make_config(output_dir=tmp_path / "run", hf_checkpoint=str(tmp_path / "nope"))
    assert "--hf-checkpoint" in _error(cfg, capsys, 2)


def test_missing_ref_dir(tmp_path, capsys, no_model_load):
    cfg = make_config(output_dir=tmp_path / "run", ref_load=str(tmp_path / "nope"))
    assert "--ref-load" in _error(cfg, capsys, 2)


def test_missing_data_file(tmp_path, capsys, no_model_load):
    msg = _error(_data_cfg(tmp_path, str(tmp_path / "gone.jsonl")), capsys, 2)
    assert "gone.jsonl: no such file" in msg


def test_bad_json_row_names_file_line(tmp_path, capsys, no_model_load):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "a", "label": 1}\n{"input": "b", "label": 2,\n')
    assert "bad.jsonl:2: not valid JSON" in _error(_data_cfg(tmp_path, str(path)), capsys, 2)


def test_missing_input_key_names_file_line_and_key(tmp_path, capsys, no_model_load):
    path = write_jsonl(tmp_path, [{"input": "a", "label": 1}, {"text": "b", "label": 2}], "k.jsonl")
    msg = _error(_data_cfg(tmp_path, path), capsys, 2)
    assert "k.jsonl:2: missing key 'input'" in msg


def test_empty_dataset(tmp_path, capsys, no_model_load):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert "empty" in _error(_data_cfg(tmp_path, str(path)), capsys, 2)


def test_interval_checkpoints_count_as_a_relax_save(tmp_path):
    from relax.trainer.state.checkpoint import MARKER, check_save_dir

    (tmp_path / "rollout_000003").mkdir(parents=True)
    (tmp_path / "rollout_000003" / MARKER).write_text('{"rollout_step": 3}')
    check_save_dir(str(tmp_path))  # a crashed run's --save DIR can be resumed into


def test_foreign_save_dir_is_refused(tmp_path, capsys, no_model_load):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    cfg = make_config("--save", str(tmp_path / "mine"), output_dir=tmp_path / "run")
    assert "holds no Relax save" in _error(cfg, capsys, 2)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("body,needle", [
    ("def f(p, r, l):\n    return [1 / 0 if 'd' in x else 0.0 for x in p]\n",
     "ZeroDivisionError"),
    ("def f(p, r, l):\n    return [0.0] * (len(p) - 1)\n", "returned 15 values for 16"),
    ("def f(p, r, l):\n    return [float('nan')] * len(p)\n", "returned nan for sample 0"),
])
def test_bad_reward_function(tmp_path, capsys, body, needle):
    reward = write_reward(tmp_path, body)
    cfg = make_config("--custom-rm-path", f"{reward}:f", output_dir=tmp_path / "run")
    msg = _error(cfg, capsys, 1)
    assert needle in msg
    if "Zero" in needle:  # the batch raised; the message names the first failing sample
        assert "raised on sample" in msg and "(prompt '" in msg and "d" in msg.split("prompt")[1]


@pytest.mark.parametrize("flag,body", [
    ("--custom-rm-path", "def f(prompts, responses):\n    return [0.0] * len(prompts)\n"),
    ("--custom-advantage-function-path", "def f(rewards, group_index):\n    return rewards\n"),
])
def test_a_plugin_that_cannot_take_its_arguments_stops_before_the_model(
        tmp_path, capsys, no_model_load, flag, body):
    plugin = write_reward(tmp_path, body, "plugin.py")
    extra = [] if flag == "--custom-rm-path" else ["--custom-rm-path",
                                                   f"{write_reward(tmp_path)}:parity"]
    cfg = make_config(flag, f"{plugin}:f", *extra, output_dir=tmp_path / "run")
    msg = _error(cfg, capsys, 2)
    assert f"{flag} {plugin}:f: the function takes" in msg and "3 positional arguments" in msg


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_non_finite_loss_stops_before_the_step_and_keeps_the_save(tmp_path, capsys):
    reward = write_reward(tmp_path)
    save = tmp_path / "save"
    ok = make_config("--custom-rm-path", f"{reward}:parity", "--num-rollout", "1", "--save",
                     str(save), output_dir=tmp_path / "run")
    assert train(ok) == 0
    capsys.readouterr()
    before = _digest(save)
    nan_adv = write_reward(tmp_path, "import torch\ndef adv(rewards, group_index, mask):\n"
                           "    return torch.full(mask.shape, float('nan'))\n", "adv.py")
    bad = make_config("--custom-rm-path", f"{reward}:parity", "--custom-advantage-function-path",
                      f"{nan_adv}:adv", "--save", str(save), output_dir=tmp_path / "run2")
    msg = _error(bad, capsys, 1)
    assert "non-finite" in msg and "train/loss=nan" in msg
    assert _digest(save) == before


def test_chat_template_missing(tmp_path, capsys):
    from relax.tiny_model import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    build_tiny_model(tok, seed=0, num_hidden_layers=1).save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    cfg = make_config("--hf-checkpoint", str(tmp_path / "hf"), "--apply-chat-template",
                      "--prompt-data", write_jsonl(tmp_path, [{"input": "x", "label": 1}] * 4),
                      "--rm-type", "math", output_dir=tmp_path / "run")
    capsys.readouterr()  # drop the test's own save_pretrained output
    assert "no chat template" in _error(cfg, capsys, 2)
