"""One trial's result as the lines the CLI prints (and the README shows)."""
from __future__ import annotations

from ..engine.measuring.timing import FIXED, WIDTH
from .spec import TrialSpec
from .trial import TrialResult
from .workload import metric_name


def stop_text(r: TrialResult) -> str:
    """Why the paired timing stopped, in words."""
    t = r.timing
    if t.stop == FIXED:
        return "a fixed number of pairs"
    width = f"{r.metrics['interval_rel_width']:.1%} wide"
    return f"width reached, {width}" if t.stop == WIDTH else f"{t.stop} reached, {width}"


def rounds_text(m: dict) -> str:
    """How many cost rounds, and why they stopped, where the trial logged it."""
    if "cost_rounds" not in m:
        return ""
    why = {None: "", 1: ", width reached", 0: ", cap reached"}[m.get("cost_width_reached")]
    return f" ({m['cost_rounds']} rounds{why})"


def workload_text(spec: TrialSpec, r: TrialResult) -> str:
    """n_chars=N for the single prompt; else the workload, its prompts and categories."""
    w = spec.workload
    if w.name == "single":
        return f"n_chars={spec.n_chars}"
    lengths = sorted({row["n_chars"] for row in r.prompts})
    n = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    cats = r.metrics["categories"]
    return (f"workload={w.name} ({len(r.prompts)} prompts, {cats:.0f} categor{'y' if cats == 1 else 'ies'}, "
            f"n_chars={n})")


def category_lines(spec: TrialSpec, r: TrialResult) -> list[str]:
    """A workload of several prompts: the total-time speedup over its prompts, and each category's."""
    m = r.metrics
    level = f"{r.timing.level:.0%}"
    lines = []
    if "speedup_prompts" in m:
        lines.append(f"over prompts      {m['speedup_prompts']:.2f}x [{m['speedup_prompts_lo']:.2f}-"
                     f"{m['speedup_prompts_hi']:.2f}] total baseline time / total speculative time ({level} interval: "
                     "prompts drawn within their categories, then rounds)")
    cats = list(dict.fromkeys(row["category"] for row in r.prompts))
    width = max(len(c) for c in cats)
    for cat in cats:
        name = metric_name(cat)
        speed = (f"{m[f'speedup.{name}']:.2f}x [{m[f'speedup_lo.{name}']:.2f}-{m[f'speedup_hi.{name}']:.2f}]  "
                 if f"speedup.{name}" in m else "")
        lines.append(f"  {cat:<{width}}  {speed}chars per pass {m[f'chars_per_pass.{name}']:.2f}  acceptance "
                     f"{m[f'acceptance.{name}']:.3f}  predicted {m[f'predicted_speedup.{name}']:.2f}x  "
                     f"({m[f'prompts.{name}']:.0f} prompt{'s' * (m[f'prompts.{name}'] != 1)})")
    return lines


def trial_block(spec: TrialSpec, r: TrialResult) -> str:
    m = r.metrics
    k = spec.k
    per_pos = " ".join(f"{m[f'acceptance_pos_{i}']:.2f}" for i in range(1, k + 1))
    tree = "tree_nodes" in m
    verify_size = f"1+{m['verify_nodes']:.0f} nodes" if tree else "k+1"
    many = len(r.prompts) > 1
    unit = f"round{'s' * (m['pairs_used'] != 1)} of {len(r.prompts)} prompts" if many else f"pair{'s' * (m['pairs_used'] != 1)}"
    if spec.batch > 1:
        unit = f"round{'s' * (m['pairs_used'] != 1)} of {len(r.timing.prompt_baseline_s)} batch(es)"
    lines = [
        f"draft {r.info['draft']}  k={k}  seed={spec.seed}  {workload_text(spec, r)}  temperature={spec.temperature}"
        f"  verify={r.info.get('verify', 'chain')}  engine={r.info.get('engine', 'eager')}"
        + (f"  batch={spec.batch}" if spec.batch > 1 else "")
        + (f"  policy={spec.policy.name} (k is the cap)" if spec.policy.name != "fixed" else ""),
        f"target {r.info['target_key']}: {r.info['target_params']} params, "
        + (f"val loss {r.info['target_val_loss']:.4f} nats/char" if r.info['target_val_loss'] == r.info['target_val_loss']
           else "a model from a folder (not trained here; counters are per token)"),
        f"acceptance        {m['acceptance']:.3f}  (per tested position {m['position_acceptance']:.3f}"
        + (f", analytic {m['analytic_acceptance']:.3f})" if "analytic_acceptance" in m else ")"),
        f"P(draft i kept)   {per_pos}" + ("  (tree: P(path reaches depth i))" if tree else ""),
        f"chars per pass    {m['chars_per_pass']:.2f}   target passes {m['target_passes']} (baseline {m['baseline_passes']})",
        f"cost              target pass {m['target_pass_us']:.0f} us, verify pass ({verify_size}) {m['verify_pass_us']:.0f} us, "
        f"draft {m['draft_char_us']:.1f} us/{'node' if tree else 'char'}, c = {m['c']:.3f}{rounds_text(m)}",
        f"speedup           {m['speedup_median']:.2f}x [{m['speedup_lo']:.2f}-{m['speedup_hi']:.2f}] over "
        f"{m['pairs_used']} {unit} ({m['speedup_interval_confidence']:.1%} interval for "
        f"the median; {stop_text(r)})",
        f"predicted         {m['predicted_speedup']:.2f}x  = chars per pass / (1 + "
        + (f"{m['nodes_per_pass']:.1f} nodes per pass x c)" if tree else "k c)"),
    ]
    if "drafted_mean" in m:  # an adaptive policy: how long its passes were
        first = 0 if "drafted_len_0" in m else 1   # the library's passes may draft none (no lookup match)
        dist = " ".join(f"{m[f'drafted_len_{j}']:.2f}" for j in range(first, k + 1))
        lines.insert(4, f"drafted per pass  {m['drafted_mean']:.2f} mean; share of passes drafting {first}..{k}: {dist}")
    if "seq_chars_per_pass" in m:  # a batch: each sequence's own rate beside the batch's, and throughput
        lines.insert(5, f"sequences         {spec.batch}: own chars per pass {m['seq_chars_per_pass']:.2f} mean "
                        f"[{m['seq_chars_per_pass_min']:.2f}-{m['seq_chars_per_pass_max']:.2f}], {m['seq_passes_mean']:.1f} "
                        f"passes mean (the batch waits for its slowest: {m['target_passes']})")
        lines.insert(-1, f"throughput        {m['baseline_chars_per_s']:.0f} chars/s baseline, "
                         f"{m['speculative_chars_per_s']:.0f} speculative (all {spec.batch} sequences, median runs)")
    if "assistant_forwards" in m:  # transformers' loop: what its framework adds per step
        lines.insert(6, f"library loop      plain generate {m['base_pass_us']:.0f} us/char ({m['target_per_base']:.2f} of it "
                        f"the one-char pass); loop work {m['overhead_us_per_pass']:.0f} us/pass beyond verify and "
                        f"drafting; assistant forwards {m['assistant_forwards']:.0f}")
    lines.insert(6, f"memory            target {m['memory_target_bytes'] / 2**20:.1f} MiB, draft "
                    f"{m['memory_draft_bytes'] / 2**20:.1f} MiB (weights, caches, tables); process peak "
                    f"{m['peak_rss_bytes'] / 2**20:.0f} MiB")
    if "compile_s" in m:
        lines.insert(6, f"compiled          {m['compiled_graphs']:.0f} graphs in {m['compile_s']:.1f} s (untimed: the "
                        f"counter run and the warm-ups)")
    if many:
        lines += category_lines(spec, r)
    if m["min_cpu_wall_ratio"] < 0.8:
        lines.append(f"warning: a timed run got only {m['min_cpu_wall_ratio']:.2f} CPU/wall (descheduled)")
    for arm in ("baseline", "speculative"):
        if m[f"{arm}_iqr_rel"] > 0.10:
            lines.append(f"warning: {arm} times spread {m[f'{arm}_iqr_rel']:.0%} (IQR/median)")
    if m["speedup_interval_confidence"] < r.timing.level:
        lines.append(f"note: too few pairs ({m['pairs_used']}) for a {r.timing.level:.0%} interval for the median")
    if m["speedup_lo"] < 1.0 < m["speedup_hi"]:
        lines.append("note: the interval straddles 1.0: no demonstrated speedup or slowdown")
    if "tvd_speculative" in m:
        lines.append(f"exactness         TVD speculative {m['tvd_speculative']:.4f} vs direct {m['tvd_direct']:.4f} "
                     f"({spec.exactness_samples} samples of the first char)")
    lines.append(f"text              {r.text[:80]!r}")
    return "\n".join(lines)
