"""`make bench-predict`: the prediction's held-out error, its probes taking turns with the sweep's seed rounds.

    python -m src.bench.predict_rounds --sweep batch engine=eager batch=1 draft=int8,distilled k=2,4
    python -m src.bench.predict_rounds --sweep paper --seeds 0,1,2,3,4 --probe-runs 2 -- --seqs 16 --rounds 21

A named sweep of sweeps/ runs one round of seeds at a time (--seeds in --probe-runs rounds of
consecutive seeds, default one per seed, `seed_rounds`; one trial at a time; resume=false, so that
every trial is timed anew), and after each round comes one probe run of every cell of the first
round (src.predict --validate with one probe run per round: run r right after round r,
`validate_sweep`'s `between`). The trials and the probes that
predict them then sample the machine in the same stretch of time: on the 2-core machine a draft's
in-loop cost moved by 20% within minutes (docs/results-history.md, "Three probe runs, seeds
outermost"), so probes run after a whole sweep are judged against trials run in other spells.
Nothing of the sweep enters a prediction: the probes
sample their own sequences (`probe_seed`) and time their own rounds. At the end, src.predict's
validation report over every round's trials (the rounds' sweeps read as one, `load_sweeps`), with
when each round ran and how long after it its probe run began.

Before `--`: this tool's flags and the sweep's Hydra overrides (as for `python -m src.run`;
the seeds are --seeds', the store src.predict's). After `--`: src.predict's flags and
overrides (--seqs, --rounds, --fit-sweep ...; the sweep's target and settings, its file's and its
command line's, are passed on, `passed_on`); --validate, --runs and --sweep-id are this tool's. The arguments
are checked before the first trial.
"""
from __future__ import annotations

import re
import subprocess
import sys

from ..door import ArgParser, check_sweep, command, refuse
from ..engine.errors import SpecsweepError
from ..paths import REPO

OWN_FLAGS = ("--validate", "--runs", "--sweep-id")   # src.predict's flags this tool sets
OWN_KEYS = ("seed", "resume", "tracking.uri", "tracking.experiment", "hydra.launcher.n_jobs",
            "hydra.sweeper.params.seed")   # sweep overrides this tool sets


def split_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments before the first `--`, those after it)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_seeds(text: str) -> list[int]:
    """--seeds: distinct integers >= 0 separated by commas, in the order given, else bad input."""
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise SpecsweepError(f"--seeds takes seeds separated by commas, e.g. 0,1,2; got {text!r}")
    seeds = [int(s) for s in text.split(",")]
    if len(set(seeds)) != len(seeds):
        raise SpecsweepError(f"--seeds names a seed twice: {text}")
    return seeds


def check_overrides(sweep_overrides: list[str], predict_argv: list[str]) -> None:
    """The keys and flags this tool sets itself may not be given (a second value would be ignored
    or refused halfway)."""
    for o in sweep_overrides:
        key = o.lstrip("+~").partition("=")[0]
        if key in OWN_KEYS:
            raise SpecsweepError(f"{key}= is set by this tool (--seeds for the seeds; --tracking-uri and "
                                 f"--experiment after -- for the store): drop {o!r}")
    for a in predict_argv:
        if a.partition("=")[0] in OWN_FLAGS:
            raise SpecsweepError(f"{a.partition('=')[0]} is set by this tool: drop it after --")


TARGET_GROUPS = ("model", "data", "train")   # the config groups that make the target
SETTINGS = ("prompt", "train_seed", "device", "threads")   # other keys a trial runs under; the rest
# of what varies (draft, k, engine, batch, policy, tree, temperature, n_chars, batch prompts) each
# validated cell takes from its trials


def key_of(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def forwarded(key: str) -> bool:
    return key.split(".")[0] in TARGET_GROUPS or key in SETTINGS


def quoted(text: str) -> str:
    """A string as a Hydra override's quoted value (its quotes escaped; everything else, newlines
    included, as it is)."""
    return "'" + text.replace("'", "\\'") + "'"


def file_overrides(sweep: str) -> list[str]:
    """What the sweep file sets of its target and settings, as overrides: its defaults list's
    target groups (`- override model: medium` -> `model=medium`) and its top-level SETTINGS."""
    from omegaconf import OmegaConf
    from ..paths import SWEEPS_DIR
    conf = OmegaConf.to_container(OmegaConf.load(SWEEPS_DIR / f"{sweep}.yaml"))
    found = []
    for entry in conf.get("defaults") or []:
        if isinstance(entry, dict):
            for k, v in entry.items():
                if k.removeprefix("override ").strip() in TARGET_GROUPS:
                    found.append(f"{k.removeprefix('override ').strip()}={v}")
    found += [f"{k}={quoted(v) if isinstance(v, str) else v}" for k, v in conf.items() if k in SETTINGS]
    return found


def passed_on(sweep: str, sweep_overrides: list[str], predict_overrides: list[str]) -> list[str]:
    """The sweep's target and settings (its file's, then its command line's, which win) that the
    predictions' own overrides do not set: src.predict composes each cell with them, so that
    it predicts the trials the sweep ran (the same target, prompt and threads)."""
    given, command = {key_of(o) for o in predict_overrides}, {key_of(o) for o in sweep_overrides}
    ours = [o for o in file_overrides(sweep) if key_of(o) not in command] + sweep_overrides
    return [o for o in ours if forwarded(key_of(o)) and key_of(o) not in given]


def seed_rounds(seeds: list[int], runs: int | None) -> list[list[int]]:
    """The seeds in `runs` rounds of consecutive seeds, as even as they go (the first rounds one
    seed more); None: one round per seed."""
    runs = len(seeds) if runs is None else runs
    if not 1 <= runs <= len(seeds):
        raise SpecsweepError(f"--probe-runs must be between 1 and the {len(seeds)} seeds; got {runs}")
    size, extra = divmod(len(seeds), runs)
    bounds = [r * size + min(r, extra) for r in range(runs + 1)]
    return [seeds[a:b] for a, b in zip(bounds, bounds[1:])]


def round_command(sweep: str, seeds: list[int], overrides: list[str], uri: str, experiment: str) -> list[str]:
    """One round: the sweep at its seeds, one trial at a time, every trial run anew, into the
    store src.predict reads."""
    return [sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", sweep,
            "hydra.launcher.n_jobs=1", "resume=false", f"seed={','.join(map(str, seeds))}", f"tracking.uri={uri}",
            f"tracking.experiment={experiment}", *overrides]


def run_round(sweep: str, rounds: list[list[int]], r: int, overrides: list[str], uri: str, experiment: str) -> str:
    """Round r's sweep (its output shown as it runs) and its sweep id: the newest sweep of the
    experiment once it is done, which must have started after the round did."""
    import pandas as pd
    from analysis.sweep_data import connect, find_sweep
    seeds = ",".join(map(str, rounds[r]))
    print(f"\n=== round {r + 1}/{len(rounds)}: the {sweep} sweep at seed{'s' * (len(rounds[r]) > 1)} {seeds} ===",
          flush=True)
    started = pd.Timestamp.now(tz="UTC")
    rc = subprocess.run(round_command(sweep, rounds[r], overrides, uri, experiment), cwd=REPO).returncode
    if rc:   # the sweep said why (a refusal before any work: its one line)
        raise SystemExit(rc)
    connect(uri)
    found = find_sweep(experiment)
    if found.start_time < started.floor("s"):
        raise SpecsweepError(f"round {r + 1}'s sweep left no sweep run in {experiment!r}")
    print(f"=== round {r + 1}/{len(rounds)} done (sweep {found.sweep_id}); probe run {r + 1} of every cell ===",
          flush=True)
    return found.sweep_id


def main(argv: list[str] | None = None) -> None:
    before, after = split_dashes(sys.argv[1:] if argv is None else argv)
    ap = ArgParser(prog="python -m src.bench.predict_rounds", description=__doc__.splitlines()[0],
                   epilog="After --: src.predict's arguments (python -m src.predict --help).")
    ap.add_argument("--sweep", required=True, help="a sweep of sweeps/ by name")
    ap.add_argument("--seeds", default="0,1,2", help="the sweep's seeds (default: %(default)s)")
    ap.add_argument("--probe-runs", type=int, help="rounds of consecutive seeds, each followed by a probe run of "
                                                   "every cell (default: one per seed)")
    ap.add_argument("overrides", nargs="*", help="the sweep's Hydra overrides")
    args = ap.parse_args(before)
    from ..predict import prepare, validate_sweep
    try:
        check_sweep(args.sweep)
        rounds = seed_rounds(parse_seeds(args.seeds), args.probe_runs)
        check_overrides(args.overrides, after)
        pargs, poverrides, _, _, _, o = prepare([*after, "--validate", "--runs", str(len(rounds))])
        poverrides += passed_on(args.sweep, args.overrides, poverrides)
    except SpecsweepError as e:
        refuse(str(e))

    def take_turns() -> None:
        pargs.sweep_id = run_round(args.sweep, rounds, 0, args.overrides, pargs.uri, pargs.experiment)
        validate_sweep(pargs, poverrides, o,
                       between=lambda r: run_round(args.sweep, rounds, r, args.overrides, pargs.uri, pargs.experiment))
    sys.exit(command(take_turns, reads_store=True, quiet=True))


if __name__ == "__main__":
    main()
