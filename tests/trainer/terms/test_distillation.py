"""On-policy distillation end to end on tiny models (reinforce_plus_plus.md §7b): the metrics
appear and are finite, the student moves toward the teacher, the term combines with an
estimator's own KL shaping, and a teacher of another vocabulary is refused before training."""

import math

import pytest
import torch

from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer import train
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward

OPD_METRICS = ("rollout/opd_reverse_kl", "rollout/teacher_logprob")


def _save(path, *, sharpen=1.0, vocab_size=None):
    """The seed-0 tiny model with its final norm scaled by ``sharpen`` (scaled logits: a more
    peaked distribution with the same ranking of tokens), saved with its tokenizer."""
    tok = build_tokenizer(vocab_size)
    model = build_tiny_model(tok, seed=0)
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpen)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _assert_finite(rows):
    for row in rows:
        for name in OPD_METRICS:
            assert name in row and math.isfinite(row[name]), (name, row.get(name))


def test_distillation_alone_moves_the_student_toward_the_teacher(tmp_path):
    # student: a sharpened copy of the teacher, so the reverse KL starts well above 0 and has
    # one direction to fall in (un-sharpen); with the fixed seed it falls within 3 steps
    student = _save(tmp_path / "student", sharpen=6.0)
    teacher = _save(tmp_path / "teacher")
    reward = write_reward(tmp_path)
    cfg = make_config("--hf-checkpoint", student, "--use-opd", "--opd-teacher-load", teacher,
                      "--opd-only", "--custom-rm-path", f"{reward}:parity", "--lr", "1e-2",
                      "--num-rollout", "3", "--seed", "1", output_dir=tmp_path / "run")
    assert cfg.distillation.use_opd and cfg.distillation.opd_kl_coef == 1.0
    _, _, moved = fit(cfg)
    rows = read_metrics(tmp_path / "run")
    assert moved > 1e-4 and len(rows) == 3
    _assert_finite(rows)
    kl = [r["rollout/opd_reverse_kl"] for r in rows]
    assert kl[0] > 0.5, kl  # the sharpened student is far from the teacher
    assert kl[-1] < 0.6 * kl[0], kl
    assert all(r["rollout/teacher_logprob"] < 0 for r in rows)


def test_distillation_on_top_of_reinforce_plus_plus_with_reference_kl(tmp_path):
    teacher = _save(tmp_path / "teacher", sharpen=2.0)
    reward = write_reward(tmp_path)
    cfg = make_config("--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages",
                      "--kl-coef", "0.01", "--kl-loss-type", "k1", "--use-opd",
                      "--opd-teacher-load", teacher, "--opd-kl-coef", "0.5",
                      "--custom-rm-path", f"{reward}:parity", output_dir=tmp_path / "run")
    _, _, moved = fit(cfg)
    rows = read_metrics(tmp_path / "run")
    assert moved > 1e-4 and [r["rollout/step"] for r in rows] == [1, 2]
    _assert_finite(rows)
    # the estimator's own metrics describe its advantage before the term (§7b)
    for row in rows:
        assert abs(row["rollout/advantage_normalized_mean"]) < 1e-5


def test_teacher_of_another_vocabulary_is_one_line_exit_2(tmp_path, capsys):
    teacher = _save(tmp_path / "teacher", vocab_size=128)  # the built-in vocabulary, padded
    cfg = make_config("--use-opd", "--opd-teacher-load", teacher, output_dir=tmp_path / "run")
    capsys.readouterr()  # drop the test's own save_pretrained output
    assert train(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("relax train: error: --opd-teacher-load"), err
    assert "tokens" in err[0] and "student" in err[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_teacher_with_the_same_size_but_other_ids_is_refused():
    from relax.errors import InputError
    from relax.trainer.terms.teacher import check_vocabulary

    student = build_tokenizer()

    class Swapped:
        def get_vocab(self):
            v = dict(student.get_vocab())
            v["a"], v["b"] = v["b"], v["a"]
            return v

    with pytest.raises(InputError, match=r"--opd-teacher-load T: token 'a' is id \d+ for the "
                                        r"student but \d+ for the teacher"):
        check_vocabulary("T", student, Swapped())


def test_a_seeded_distillation_run_resumes_exactly(tmp_path):
    # the teacher is frozen and read from its directory, so a resumed run scores the same
    # tokens the same way: the uninterrupted run's numbers, step for step
    teacher = _save(tmp_path / "teacher", sharpen=2.0)
    reward = write_reward(tmp_path)
    common = ["--use-opd", "--opd-teacher-load", teacher, "--opd-kl-coef", "0.5",
              "--custom-rm-path", f"{reward}:parity", "--lr", "1e-2"]
    _, uninterrupted, _ = fit(make_config(*common, "--num-rollout", "3",
                                          output_dir=tmp_path / "full"))
    fit(make_config(*common, "--num-rollout", "1", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    trainer, tail, _ = fit(make_config(*common, "--num-rollout", "3", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 1 and len(tail) == 2
    for got, want in zip(tail, uninterrupted[1:], strict=True):
        for key in (*OPD_METRICS, "rollout/raw_reward", "train/loss", "train/grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


def test_multi_turn_distils_only_the_model_tokens(tmp_path, monkeypatch):
    from relax.trainer.terms.distillation import Distillation

    seen = []
    original = Distillation.advantages

    def spy(self, exp, tracker):
        out = original(self, exp, tracker)
        seen.append((exp.response_mask.clone(), exp.attention_mask.clone(), out))
        return out

    monkeypatch.setattr(Distillation, "advantages", spy)
    teacher = _save(tmp_path / "teacher", sharpen=2.0)
    cfg = make_config("--use-opd", "--opd-teacher-load", teacher, "--opd-only", "--env",
                      "tests.rollout.agents.scripted:countdown", "--max-turns", "3",
                      "--num-rollout", "1", output_dir=tmp_path / "run")
    fit(cfg)
    _assert_finite(read_metrics(tmp_path / "run"))
    (mask, attention, adv), = seen
    env_tokens = attention[:, -mask.shape[1]:].bool() & ~mask  # read by the model, not its own
    assert env_tokens.any(), "the episodes had no environment turn"
    assert torch.equal(adv[env_tokens], torch.zeros_like(adv[env_tokens]))
    assert (adv[mask] != 0).any()
