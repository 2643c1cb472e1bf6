"""Configuration files: ``relax train --config run.yaml`` (or ``.toml``, or the ``config.json``
of a run directory) with the sections as keys, and old flat config.json files read back.

    algorithm:
      advantage_estimator: grpo
    rollout:
      sampling: {rollout_temperature: 0.7}
    batches: {rollout_batch_size: 16}

Flags given on the command line override the file; several files merge in order (the later
wins). A key that is no section or field, a removed flag's key, a key given twice in one mapping
and a flag set twice (flat and in its section) are each one line naming the file and the key:
a file is read as written or refused, never half-read. A file may also use the flags' flat
names (``rollout_temperature: 0.7``), which is how config.json was written before sections;
both forms read back to the same configuration. A field's name is its flag's; the shorter names
some fields had before (``algorithm: {estimator: grpo}``) are read through :data:`RENAMED`, so a
config.json or a checkpoint written before still loads, and a mapping giving both names of one
field is refused. Torch-free (PyYAML and tomllib only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from relax.config.flags import REMOVED
from relax.config.schema import TrainConfig
from relax.config.section import dest_of, flat_index, followers, is_section
from relax.config.sections.batches import EPOCHS_WHEN_UNSET
from relax.errors import ConfigError

SUFFIXES = (".yaml", ".yml", ".toml", ".json")

# The one table of renamed fields: a field's former name (path by section) -> its name now,
# the flag's (docs/configuration.md, "Field names that differ from their flags"). Read in a file or a checkpoint's saved
# configuration, never written.
RENAMED: dict[str, str] = {
    "algorithm.estimator": "advantage_estimator",
    "algorithm.disable_std_normalization": "disable_grpo_std_normalization",
    "algorithm.per_token_loss": "calculate_per_token_loss",
    "algorithm.custom_advantage_path": "custom_advantage_function_path",
    "algorithm.reward_post_process_path": "custom_reward_post_process_path",
    "rollout.data.shuffle": "rollout_shuffle",
    "rollout.sampling.max_response_len": "rollout_max_response_len",
    "rollout.sampling.temperature": "rollout_temperature",
    "rollout.sampling.top_p": "rollout_top_p",
    "rollout.sampling.top_k": "rollout_top_k",
    "rollout.rewards.timeout": "reward_timeout",
    "rollout.rewards.error_policy": "reward_error_policy",
    "rollout.rewards.url": "rm_url",
    "rollout.rewards.max_concurrency": "reward_max_concurrency",
    "rollout.rewards.batch_size": "rm_batch_size",
    "rollout.rewards.retries": "rm_retries",
    "rollout.rewards.retry_backoff": "rm_retry_backoff",
    "rollout.episodes.step_timeout": "env_step_timeout",
    "rollout.episodes.agentic": "use_agentic_rollout",
    "rollout.off_policy.mismatch_metrics": "get_mismatch_metrics",
    "rollout.off_policy.custom_tis_path": "custom_tis_function_path",
    "rollout.partial.enabled": "partial_rollout",
    "rollout.partial.max_aborted_count": "partial_rollout_max_aborted_count",
    "rollout.partial.mask_off_policy": "mask_offpolicy_in_partial_rollout",
    "rollout.backend.name": "rollout_backend",
    "batches.samples_per_prompt": "n_samples_per_prompt",
    "batches.token_budget": "use_dynamic_batch_size",
    "batches.steps_per_rollout": "num_steps_per_rollout",
    "batches.filter_path": "dynamic_sampling_filter_path",
    "batches.max_rounds": "dynamic_sampling_max_rounds",
    "lora.rank": "lora_rank",
    "lora.alpha": "lora_alpha",
    "lora.dropout": "lora_dropout",
    "lora.target_modules": "lora_target_modules",
    "recompute.granularity": "recompute_granularity",
    "recompute.method": "recompute_method",
    "recompute.num_layers": "recompute_num_layers",
    "distillation.enabled": "use_opd",
    "distillation.type": "opd_type",
    "distillation.kl_coef": "opd_kl_coef",
    "distillation.teacher_load": "opd_teacher_load",
    "distillation.only": "opd_only",
    "distillation.teacher_url": "opd_teacher_url",
    "distillation.teacher_timeout": "opd_teacher_timeout",
    "distillation.privileged_info_key": "opsd_privileged_info_key",
    "critic.load": "critic_load",
    "critic.save": "critic_save",
    "critic.lr": "critic_lr",
    "critic.lr_warmup_iters": "critic_lr_warmup_iters",
    "evaluation.interval": "eval_interval",
    "evaluation.prompt_data": "eval_prompt_data",
    "evaluation.n_samples": "n_samples_per_eval_prompt",
    "evaluation.temperature": "eval_temperature",
    "evaluation.top_p": "eval_top_p",
    "evaluation.top_k": "eval_top_k",
    "evaluation.max_response_len": "eval_max_response_len",
    "evaluation.batch_size": "eval_batch_size",
    "evaluation.pass_threshold": "eval_pass_threshold",
    "evaluation.episodes": "eval_episodes",
    "checkpoint.checksums": "checkpoint_checksums",
}


class _Duplicate(Exception):
    """A key given twice in one mapping (JSON and YAML parsers keep the last one silently;
    TOML refuses it itself)."""


def _unique_pairs(pairs: list) -> dict:
    """json's ``object_pairs_hook``: the mapping, or :class:`_Duplicate` for a key twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _yaml_load(text: str):
    """``yaml.safe_load`` refusing a key given twice in one mapping."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: list = []
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise _Duplicate(key)
                seen.append(key)
            return super().construct_mapping(node, deep)

    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def _parse(path: str) -> dict:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"--config {path}", "expected a .yaml, .yml, .toml or .json file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"--config {path}", f"cannot read it ({e.strerror})") from None
    try:
        if suffix == ".toml":
            import tomllib
            value = tomllib.loads(raw.decode("utf-8"))
        elif suffix == ".json":
            value = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_pairs)
        else:
            value = _yaml_load(raw.decode("utf-8"))
    except _Duplicate as e:
        raise ConfigError(f"--config {path}: key {e.args[0]!r}", "given twice in one mapping; "
                          "keep one (the parser would silently take the last)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config {path}", f"not UTF-8 text (byte {e.start})") from None
    except Exception as e:  # each library's own syntax error, with its line
        reason = " ".join(str(e).split())
        raise ConfigError(f"--config {path}", f"not valid {suffix[1:].upper()}: {reason}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"--config {path}", "expected a mapping of sections at the top")
    return value


def flatten(values: dict, cls, where: str, strict: bool = True,
            path: tuple[str, ...] = ()) -> dict:
    """``{dest: value}`` from a mapping by section (nested keys) or by flat name; ``where``
    names the file in the error of an unknown or removed key and of a flag set twice (flat
    and in its section: which one counts would be a guess); ``path``: the section ``values``
    is, for a former field name (:data:`RENAMED`). ``strict=False`` reads a saved
    configuration leniently (a checkpoint's manifest): an unknown key is kept as it is, for
    flags since removed, and of a flag set twice the later key counts."""
    flat: dict = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    by_dest = {dest_of(f): f for f in fields.values() if not is_section(f)}
    for key, value in values.items():
        key = _current_name(values, path, key, where)
        f = fields.get(key)
        if f is not None and is_section(f):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: key {key!r}", "is a section; expected a mapping")
            found = flatten(value, f.metadata["section"], f"{where}: {key}", strict,
                            (*path, key))
        elif f is not None or key in by_dest:
            found = {dest_of(f if f is not None else by_dest[key]): value}
        elif strict or key in flat_index(cls):
            found = _flat_key(cls, key, value, where)
        else:
            found = {key: value}
        if strict:
            _merge(flat, found, where, key)
        else:
            flat.update(found)
    return flat


def _current_name(values: dict, path: tuple[str, ...], key, where: str):
    """``key``, or the name now of a field's former name (:data:`RENAMED`); a mapping that
    gives both is refused (which one counts would be a guess)."""
    new = RENAMED.get(".".join((*path, str(key))))
    if new is None:
        return key
    if new in values:
        raise ConfigError(f"{where}: keys {key!r} and {new!r}", f"both name --"
                          f"{new.replace('_', '-')} ({key!r} is its former name); keep {new!r}")
    return new


def _merge(flat: dict, found: dict, where: str, key: str) -> None:
    """Add ``found`` to ``flat``, refusing a flag that ``flat`` already sets."""
    twice = next((dest for dest in found if dest in flat), None)
    if twice is not None:
        raise ConfigError(f"{where}: key {key!r}", f"sets --{twice.replace('_', '-')} a second "
                          "time (flat and in its section, or by field and by flag name); keep "
                          "one")
    flat.update(found)


def _flat_key(cls, key: str, value, where: str) -> dict:
    """A flat name (``rollout_temperature``) anywhere below ``cls``, else the error line."""
    if key in flat_index(cls):
        return {key: value}
    flag = "--" + str(key).replace("_", "-")
    if flag in REMOVED:
        raise ConfigError(f"{where}: key {key!r}", f"{flag} is {REMOVED[flag]} (the key)")
    raise ConfigError(f"{where}: unknown key {key!r}", "not a section, field or flag name of "
                      "the configuration; see relax train --help (groups are sections)")


def load_file(path: str, cls) -> dict:
    """The ``{dest: value}`` a configuration file sets (YAML, TOML or JSON)."""
    return flatten(_parse(path), cls, f"--config {path}")


# resolved value -> unset, where resolution (relax/config/validate.py resolve_and_validate)
# derives it from another field (``option(follows=...)``): a saved config.json then validates
# as its input did and resolves to itself
_FOLLOWS = followers(TrainConfig)
_RESOLVED_DEFAULTS = {"num_epoch": EPOCHS_WHEN_UNSET, "get_mismatch_metrics": True, "builtin_task": None}
_DERIVED = ("world_size", "builtin_preset_applied")


def unresolved(flat: dict) -> dict:
    """The settings of a (possibly resolved) configuration file as a command line would give
    them: derived and follower values dropped, ``--eval-prompt-data`` pairs as tokens."""
    out = {k: v for k, v in flat.items() if k not in _DERIVED}
    for dest, source in _FOLLOWS.items():
        if dest in out and source in out and out[dest] == out[source]:
            del out[dest]
    for dest, value in _RESOLVED_DEFAULTS.items():
        if dest in out and out[dest] == value:
            del out[dest]
    pairs = out.get("eval_prompt_data")
    if pairs and all(isinstance(p, (list, tuple)) for p in pairs):
        out["eval_prompt_data"] = [token for pair in pairs for token in pair]
    return out


def as_argv(flat: dict, parser) -> list[str]:
    """The command line that sets ``flat`` (``{dest: value}``), so a file's values are
    type-checked by the flags' own parsers, with the same one-line errors."""
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    argv: list[str] = []
    for dest, value in flat.items():
        action = actions[dest]
        flag = action.option_strings[0]
        if value is None:
            if action.default is not None:
                raise ConfigError(f"{flag} null", "not a value of this flag; leave the key out "
                                  "for its default")
            continue
        if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{flag} {value!r}", "a switch: expected true or false")
            if value or isinstance(action, argparse.BooleanOptionalAction):
                argv.append(flag if value else action.option_strings[1])
        elif action.nargs == "+":
            items = value if isinstance(value, (list, tuple)) else [value]
            argv += [flag, *map(str, items)]
        elif isinstance(value, (list, tuple, dict)):
            raise ConfigError(f"{flag} {value!r}", "expected one value")
        else:
            argv.append(f"{flag}={value}")
    return argv
