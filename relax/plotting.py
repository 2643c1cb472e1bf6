"""``relax plot RUN_DIR [RUN_DIR ...] --output FILE.png``: training curves from metrics.jsonl.

Each RUN_DIR is an ``--output-dir`` of ``relax train`` (``metrics.jsonl`` and ``config.json``).
Runs are grouped by the ``advantage_estimator`` of their ``config.json`` (marked ``+ opd`` or
``opd only (...)`` for on-policy distillation runs): a group of several
runs (seeds) is drawn as the mean over its runs with a min..max band, a group of one run as
its curve, so estimators are compared at a glance. Steps are aligned by ``rollout/step``; a
group's mean uses the steps every run of the group logged. Panels without data in any run are
left out unless asked for by ``--panels``.

matplotlib (the ``train`` extra) is imported only when a figure is drawn, with the Agg
backend, so the command works without a display.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

from relax.config.files import flatten
from relax.config.flags import OneLineParser, integer, text
from relax.config.schema import TrainConfig
from relax.errors import ConfigError
from relax.metrics.sinks import read_rows

# panel -> (title, [(metric, linestyle)]); two series in a panel differ by line style
PANELS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "reward": ("rollout/raw_reward", [("rollout/raw_reward", "-")]),
    "returns": ("rollout/returns (solid) vs raw_reward (dashed)",
                [("rollout/returns", "-"), ("rollout/raw_reward", "--")]),
    "advantage_raw": ("raw advantage mean (solid), std (dashed)",
                      [("rollout/advantage_raw_mean", "-"), ("rollout/advantage_raw_std", "--")]),
    "advantage_normalized": ("normalized advantage mean (solid), std (dashed)",
                             [("rollout/advantage_normalized_mean", "-"),
                              ("rollout/advantage_normalized_std", "--")]),
    "pg_loss": ("train/pg_loss", [("train/pg_loss", "-")]),
    "kl_loss": ("train/kl_loss (k2, when on)", [("train/kl_loss", "-")]),
    "ppo_kl": ("train/ppo_kl (policy drift)", [("train/ppo_kl", "-")]),
    "clipfrac": ("train/pg_clipfrac", [("train/pg_clipfrac", "-")]),
    "grad_norm": ("train/grad_norm", [("train/grad_norm", "-")]),
    "response_length": ("rollout/response_length", [("rollout/response_length", "-")]),
    "throughput": ("perf/generated_tokens_per_s", [("perf/generated_tokens_per_s", "-")]),
    "eval": ("eval pass@1 (solid), mean reward (dashed)", []),  # filled from the data
}


class PlotError(ValueError):
    """A bad run directory or argument; ``str(e)`` is one line."""


@dataclass
class Run:
    path: str
    estimator: str
    series: dict[str, dict[int, float]] = field(default_factory=dict)  # metric -> step -> value


def _group_name(saved: dict, default: str, where: str) -> str:
    """The estimator of a config.json (by section, under its fields' names of now or before,
    or flat as written before sections), marked when distillation changes what it trains on
    (§7b): a run with ``--use-opd`` is not drawn in one band with runs of its estimator alone."""
    flat = flatten(saved, TrainConfig, where, strict=False)
    estimator = str(flat.get("advantage_estimator", default))
    if not flat.get("use_opd"):
        return estimator
    return f"opd only ({estimator})" if flat.get("opd_only") else f"{estimator} + opd"


def load_run(path: str) -> Run:
    """Read ``path/metrics.jsonl`` (later rows win for a repeated step, as after a resume)."""
    metrics_path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        raise PlotError(f"{path}: no metrics.jsonl; give the --output-dir of a relax train run")
    estimator = os.path.basename(os.path.normpath(path))
    config_path = os.path.join(path, "config.json")
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                estimator = _group_name(json.load(f), estimator, config_path)
        except UnicodeDecodeError as e:
            raise PlotError(f"{config_path}: not UTF-8 text (byte {e.start})") from None
        except (json.JSONDecodeError, AttributeError) as e:
            raise PlotError(f"{config_path}: not a JSON object ({e})") from None
        except OSError as e:
            raise PlotError(f"{config_path}: cannot read it ({e.strerror})") from None
    run = Run(path, str(estimator))
    try:
        lines = read_rows(metrics_path)
    except UnicodeDecodeError as e:
        raise PlotError(f"{metrics_path}: not UTF-8 text (byte {e.start}); it was not written "
                        "by relax train") from None
    except OSError as e:
        raise PlotError(f"{metrics_path}: cannot read it ({e.strerror})") from None
    for index, (lineno, line, row) in enumerate(lines):
        if row is None:
            if index == len(lines) - 1 and not line.endswith("\n"):
                # A run killed mid-write leaves an unterminated last line; the trainer cuts it
                # off on resume, and a plot of the killed run skips it the same way.
                print(f"relax plot: warning: {metrics_path}:{lineno}: skipping the torn last "
                      "line of an interrupted run", file=sys.stderr)
                continue
            raise PlotError(f"{metrics_path}:{lineno}: expected a JSON object with "
                            "rollout/step")
        step = row["rollout/step"]
        for key, value in row.items():
            if key == "rollout/step" or not (value is None or isinstance(value, (int, float))):
                continue
            try:
                number = math.nan if value is None else float(value)
            except OverflowError:  # an integer beyond float range
                number = math.inf if value > 0 else -math.inf
            run.series.setdefault(key, {})[step] = number
    if not run.series:
        raise PlotError(f"{metrics_path}: no metrics in it")
    return run


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.estimator, []).append(run)
    return groups


def _smooth(values, window: int):
    import numpy as np

    if window <= 1 or len(values) < 2:
        return values
    out = np.empty_like(values)
    for i in range(len(values)):  # trailing mean; NaNs (non-finite logs) are skipped
        chunk = values[max(0, i - window + 1): i + 1]
        finite = chunk[np.isfinite(chunk)]
        out[i] = finite.mean() if finite.size else np.nan
    return out


def group_curve(runs: list[Run], metric: str, smooth: int = 1):
    """``(steps, mean, low, high)`` over the steps every run logged; None without data."""
    import numpy as np

    step_sets = [set(r.series.get(metric, {})) for r in runs]
    steps = sorted(set.intersection(*step_sets)) if step_sets else []
    if not steps:
        return None
    table = np.array([_smooth(np.array([r.series[metric][s] for s in steps]), smooth)
                      for r in runs])
    return np.array(steps), table.mean(0), table.min(0), table.max(0)


def _panel_series(name: str, runs: list[Run]) -> list[tuple[str, str]]:
    if name != "eval":
        return PANELS[name][1]
    keys = sorted({k for r in runs for k in r.series if k.startswith("eval/")})
    return ([(k, "-") for k in keys if k.endswith("/pass@1")]
            + [(k, "--") for k in keys if k.endswith("/mean_reward")])


def plot_runs(run_dirs: list[str], output: str, *, panels: list[str] | None = None,
              smooth: int = 1, title: str | None = None, dpi: int = 80) -> list[str]:
    """Draw the panels (all with data when ``panels`` is None) into ``output``; return them."""
    runs = [load_run(d) for d in run_dirs]
    groups = group_runs(runs)
    wanted = panels or list(PANELS)
    drawn = [p for p in wanted if panels or any(
        m in r.series for m, _ in _panel_series(p, runs) for r in runs)]
    if not drawn:
        raise PlotError("none of the panels has data in these runs")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, len(drawn))
    nrows = -(-len(drawn) // ncols)
    legend_cols = min(ncols, len(groups))
    # a header band (in inches) above the panels holds the title and the legend
    header = 0.15 + 0.25 * -(-len(groups) // legend_cols) + 0.3 * bool(title)
    height = 2.9 * nrows + header
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, height), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, name in zip(axes.flat, drawn, strict=False):
        _draw_panel(ax, name, runs, groups, colors, smooth)
    for ax in list(axes.flat)[len(drawn):]:
        ax.axis("off")
    _add_legend(fig, plt, groups, colors, title=title, height=height, legend_cols=legend_cols)
    fig.tight_layout(rect=(0, 0, 1, 1 - header / height))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        fig.savefig(output, dpi=dpi)
    except OSError as e:
        raise PlotError(f"--output {output}: cannot write the image ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return drawn


def _draw_panel(ax, name: str, runs: list[Run], groups: dict, colors, smooth: int) -> None:
    """One panel: each group's mean curve of the panel's metrics, with its band over seeds."""
    ax.set_title(PANELS[name][0], fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    any_data = False
    for g, members in enumerate(groups.values()):
        for metric, style in _panel_series(name, runs):
            curve = group_curve(members, metric, smooth)
            if curve is None:
                continue
            steps, mean, low, high = curve
            ax.plot(steps, mean, style, color=colors[g % len(colors)], lw=1.3)
            if len(members) > 1:
                ax.fill_between(steps, low, high, color=colors[g % len(colors)], alpha=0.18,
                                lw=0)
            any_data = True
    if not any_data:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("rollout step", fontsize=8)


def _add_legend(fig, plt, groups: dict, colors, *, title, height: float,
                legend_cols: int) -> None:
    """The title and one legend entry per group in the header band above the panels."""
    handles = [plt.Line2D([], [], color=colors[g % len(colors)], lw=2) for g in range(len(groups))]
    labels = [f"{est} ({len(m)} runs: mean, min..max)" if len(m) > 1 else est
              for est, m in groups.items()]
    if title:
        fig.suptitle(title, fontsize=10, y=1 - 0.06 / height, va="top")
    fig.legend(handles, labels, loc="upper center", ncol=legend_cols, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 1 - (0.3 * bool(title) + 0.02) / height))


def build_plot_parser():
    parser = OneLineParser(prog="relax plot", allow_abbrev=False, description=(
        "Curves from the metrics.jsonl of one or more relax train runs; runs of one "
        "estimator (config.json) are drawn as mean and min..max band."))
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="--output-dir of a run")
    parser.add_argument("--output", type=text, required=True,
                        help="Image file to write (.png, .svg or .pdf).")
    parser.add_argument("--panels", type=text, default=None,
                        help=f"Default: all with data. Comma list of {', '.join(PANELS)}.")
    parser.add_argument("--smooth", type=integer, default=1,
                        help="Default 1 (off). Trailing moving-average window in steps.")
    parser.add_argument("--title", type=text, default=None, help="Default none. Figure title.")
    parser.add_argument("--dpi", type=integer, default=80, help="Default 80. Image resolution.")
    return parser


def parse_plot_args(argv: list[str]) -> argparse.Namespace:
    ns = build_plot_parser().parse_strict(list(argv))
    if os.path.isdir(ns.output):
        raise ConfigError(f"--output {ns.output}", "is a directory; give an image file name")
    if os.path.splitext(ns.output)[1].lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"--output {ns.output}", "expected a .png, .svg or .pdf file name")
    if ns.panels is not None:
        ns.panels = [p.strip() for p in ns.panels.split(",") if p.strip()]
        unknown = [p for p in ns.panels if p not in PANELS]
        if unknown or not ns.panels:
            raise ConfigError(f"--panels {','.join(ns.panels)}", f"unknown panel "
                              f"{', '.join(unknown) or '(none)'}; choose from {', '.join(PANELS)}")
    if ns.smooth < 1:
        raise ConfigError(f"--smooth {ns.smooth}", "must be >= 1 (1 is no smoothing)")
    if not 20 <= ns.dpi <= 600:
        raise ConfigError(f"--dpi {ns.dpi}", "must lie in [20, 600]")
    return ns
