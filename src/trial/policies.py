"""The trial's draft-length policy (src/engine/decoding/policy.py), built from its spec.

fixed, heuristic and confidence need nothing but their options. The cost policy needs two
things measured before the trial's counter run, never from the trial's own timed runs:
- its acceptance map (`acceptance.acceptance_map`), calibrated on text sampled from the target
  with the policy's calibration seed: exact given the target, the draft and the settings;
- its cost profile c, b, o (`measure.cost_profile`), timed once per host and cached in
  <data.cache_dir>/profiles/, keyed by the host, the target, the draft, the engine, k and the
  temperature: every later trial of the sweep on this host reads the same numbers, so a trial's
  counters stay exact given its seed and the profile (both are logged: policy_c, policy_b, policy_o).
"""
from __future__ import annotations

import hashlib
import json
import platform
import socket

from ..engine.measuring.acceptance import acceptance_map
from ..engine.atomic import write_text
from ..engine.locks import BUILD_WAIT_S, file_lock
from ..engine.measuring.measure import cost_profile
from ..engine.decoding.policy import Policy, make_policy
from .spec import TrialSpec

SIGNIFICANT = 3   # a profile's numbers are rounded to 3 significant digits: a profile, not a measurement


def profile_path(spec: TrialSpec, target_key: str):
    key = repr((socket.gethostname(), platform.processor(), target_key, spec.draft.name, sorted(spec.draft.options.items()),
                spec.engine, spec.k, spec.temperature, spec.threads, spec.device, spec.policy.options["profile_rounds"],
                spec.timing.cost_reps))
    return spec.target.data.cache_dir / "profiles" / f"{spec.draft.name}-k{spec.k}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_profile(spec: TrialSpec, target_key: str, measure) -> dict:
    """The host's cost profile of this (target, draft, engine, k, temperature): read, or measured
    with `measure()` and written (atomically, under a lock: one measurement per host)."""
    path = profile_path(spec, target_key)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(str(path) + ".lock", f"the cost profile {path.name}", BUILD_WAIT_S):
            if not path.is_file():
                raw = measure()
                write_text(path, json.dumps({k: float(f"{v:.{SIGNIFICANT}g}") for k, v in raw.items()}))
    return json.loads(path.read_text())


def build_policy(spec: TrialSpec, model, draft, prompt: list[int], target_key: str, baseline, timed_phase,
                 calibration_model) -> Policy:
    """The spec's policy for this trial; `baseline` (run, chars) is the baseline loop the cost
    profile times beside the components, inside `timed_phase` (the host's timing lock), on `model`
    (the target on the trial's engine). The acceptance map samples its calibration text from
    `calibration_model`, the target's eager model: it is off the timed path, and on the compiled
    engine its batch of calibration_seqs sequences would compile graphs of a shape nothing else
    runs (one such compile took over five minutes)."""
    p = spec.policy
    if p.name != "cost":
        return make_policy(p.name, p.options, spec.k)
    o = p.options
    accept = acceptance_map(calibration_model, draft, prompt, spec.temperature, o["calibration_seqs"],
                            min(o["calibration_chars"], model.cfg.block_size - len(prompt)), o["calibration_seed"], o["bins"])

    def measure():
        with timed_phase():
            return cost_profile(model, draft, prompt, spec.k, spec.temperature, spec.timing.cost_reps, spec.device,
                                o["profile_rounds"], baseline)
    return make_policy("cost", o, spec.k, accept, cached_profile(spec, target_key, measure))
