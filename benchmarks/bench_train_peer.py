"""Training throughput, specdraft vs vllm-project/speculators 0.9.0, side by side on one machine.

Same drafter (SmolLM2 shape: H 576, 9/3 heads, head_dim 64, intermediate 1536, one layer,
verifier vocab 49152, draft vocab 32000), rows of ``--seq`` (2048) tokens (one row per step,
the first 25 % prompt, the rest supervised), TTT 3, AdamW, fp32, ``--threads`` (2) threads.
Each trainer runs its FULL step in its own process, data loading included, from its own on-disk
format built once from the same random rows (cached under ``--work``):

- specdraft: ``RUN/extract``-shaped shards (bf16) read by :class:`DiskSource`, the real
  :class:`specdraft.artifacts.batches.Collator` (teacher from the verifier head) and
  :meth:`specdraft.train.loop.Trainer.train_step`;
- speculators: its offline format (``benchmarks/peer_data.py``, bf16 ``hs_{i}.safetensors``)
  read by its own trainer (``benchmarks/peer_speculators.py``) in its own venv
  (``.venv-speculators``, built when missing, as ``tests/export/test_speculators_conformance.py``).

Runs are interleaved A B A B (the machine is shared); each prints tokens/s (steps after the
first) and the child's peak RSS (``os.wait4``), then medians, ratios and the load average.

    python benchmarks/bench_train_peer.py [--reps 2] [--steps 3] [--seq 2048] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import peer_data  # noqa: E402

H, V, K, LAYERS, AUX = 576, 49152, 32000, 30, (2, 15, 27)


def smollm2_config():
    """A SmolLM2-135M-shaped LlamaConfig (the drafter and the peer copy their shape from it)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=1536,
                       num_hidden_layers=LAYERS, num_attention_heads=9, num_key_value_heads=3,
                       head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu")


def random_rows(n: int, T: int, seed: int = 0) -> list[dict]:
    """``n`` random rows: ids [T], mask [T] (1 from 25 %), aux [T, 3H], final [n_sup, H]."""
    from specdraft.core.conventions import supervised_positions

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        mask = torch.zeros(T, dtype=torch.uint8)
        mask[T // 4:] = 1
        n_sup = supervised_positions(mask).numel()
        rows.append({"key": f"r{i}/0", "ids": torch.randint(0, V, (T,), generator=g),
                     "mask": mask, "aux": torch.randn(T, len(AUX) * H, generator=g),
                     "final": torch.randn(n_sup, H, generator=g)})
    return rows


def write_extract(out: Path, rows: list[dict]) -> None:
    """``RUN/extract``'s shards and ``index.jsonl`` (bf16), as ``specdraft extract`` writes."""
    from specdraft.core.storage import CODECS, ShardBuffer, encode

    codec = CODECS["bf16"]
    buf = ShardBuffer(codec)
    for i, r in enumerate(rows):
        buf.add(r["key"], i, r["ids"], r["mask"], encode(r["aux"].view(len(r["ids"]), len(AUX), H),
                                                          codec),
                encode(r["final"].unsqueeze(1), codec))
    (out / "shards").mkdir(parents=True, exist_ok=True)
    entries = buf.write(out / "shards" / "rank00000-000000.safetensors", {})
    with open(out / "index.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)


def build(work: Path, n_rows: int, T: int) -> dict:
    """Both trainers' inputs under ``work`` (cached: rebuilt when the settings change)."""
    from specdraft.artifacts.hidden_states import DiskSource

    stamp = {"rows": n_rows, "seq": T, "v": 1}
    if (work / "stamp.json").exists() and json.loads((work / "stamp.json").read_text()) == stamp:
        return stamp
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    g = torch.Generator().manual_seed(1)
    embed = torch.randn(V, H, generator=g) * 0.02
    gain = 0.5 + torch.rand(H, generator=g)
    ids = torch.randperm(V, generator=g)[:K].sort().values
    d2t, t2d = ids - torch.arange(K), torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    write_extract(work / "extract", random_rows(n_rows, T))
    torch.save({"lm_head": embed, "gain": gain, "d2t": d2t, "t2d": t2d}, work / "head.pt")
    src = DiskSource.from_index(work / "extract", AUX, H, "bf16")
    peer_data.convert_source(src, list(range(n_rows)), work / "peer", gain, torch.bfloat16)
    peer_data.write_vocab(work / "peer", d2t, t2d)
    peer_data.write_verifier_dir(work / "verifier", smollm2_config(), embed, embed, gain)
    (work / "stamp.json").write_text(json.dumps(stamp))
    return stamp


# --------------------------------------------------------------------- the specdraft child
def specdraft_child(work: Path, steps: int, T: int, result: Path) -> None:
    """specdraft's real Trainer/Data path over the DiskSource; per-step wall times to ``result``."""
    from specdraft.core.profile import resolve_profile
    from specdraft.artifacts.hidden_states import DiskSource
    from specdraft.train.config import TrainConfig
    from specdraft.artifacts.batches import Collator
    from specdraft.train.data import row_lengths
    from specdraft.core.context import context_from_env
    from specdraft.train.loop import Data, Trainer, Window
    from specdraft.train.objective import TTTObjective
    from specdraft.train.run import build_drafter

    head = torch.load(work / "head.pt")
    src = DiskSource.from_index(work / "extract", AUX, H, "bf16")
    cfg = TrainConfig(run_dir=work / "sd-run", ttt_steps=3, batch_tokens=T, warmup_steps=10,
                      val_fraction=0.0, device="cpu", dtype="float32")
    env = context_from_env("cpu")
    drafter = build_drafter(cfg, resolve_profile(smollm2_config()), src,
                            {"embed_tokens.weight": head["lm_head"],
                             "lm_head.weight": head["lm_head"]},  # tied, as SmolLM2's
                            head["d2t"], head["t2d"])
    obj = TTTObjective(drafter, steps=3)
    lengths = row_lengths(src)
    data = Data(src, Collator(head["lm_head"], head["d2t"], env.device),
                list(range(len(src))), [], lengths)
    tr = Trainer(cfg, env, obj, obj, data, work / "sd-run")
    marks = [time.perf_counter()]
    for _ in range(steps + 1):
        tr.train_step(Window(3))
        tr.step_in_epoch += 1
        marks.append(time.perf_counter())
    result.write_text(json.dumps({"step_s": [b - a for a, b in zip(marks, marks[1:])]}))


# --------------------------------------------------------------------- the peer child
def peer_args(verifier: Path, data: Path, save: Path, *, aux: list[int], draft_vocab: int,
              seq: int, ttt: int, epochs: int, lr: float, max_steps: int | None = None,
              norms: bool = False) -> list[str]:
    """speculators' flags for our recipe on CPU: the drafter of specdraft's default EAGLE-3
    architecture (no norm before fc, no norm on the fed-back state, no norm before the
    residual), our vocab map (``peer_data.write_vocab``), AdamW, fp32, TTT ``ttt``, and the CPU
    flags of ``../shared/reference/peer-speculators-cpu.md``. ``norms``: speculators 0.9's own
    default EAGLE-3 instead (``norm_before_residual``, ``norm_before_fc`` and ``norm_output``
    on, ``speculators/train/config/schema.py`` ``TrainConfig`` defaults; specdraft trains the
    same with ``--norm-before-residual --norm-before-fc --norm-output``)."""
    args = ["--verifier-name-or-path", str(verifier), "--data-path", str(data),
            "--speculator-type", "eagle3", "--target-layer-ids", *map(str, aux),
            "--draft-vocab-size", str(draft_vocab),
            "--d2t-path", str(data / "d2t.npy"), "--t2d-path", str(data / "t2d.npy"),
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
            "--optimizer", "adamw", "--lr", str(lr), "--hidden-states-dtype", "float32",
            "--num-workers", "0", "--mask-token-id", "0", "--total-seq-len", str(seq),
            "--ttt-steps", str(ttt), "--epochs", str(epochs),
            *(() if norms else ("--no-norm-before-residual", "--no-norm-before-fc",
                                 "--no-norm-output")),
            "--save-path", str(save), "--log-dir", str(save / "logs"),
            "--no-resume-from-checkpoint"]
    return args + (["--max-steps", str(max_steps)] if max_steps else [])


# --------------------------------------------------------------------- the parent
def run_child(cmd: list[str], env: dict, result: Path, log: Path) -> dict:
    """Run one child; its per-step times and ``wait4`` peak RSS (GiB)."""
    result.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(p.pid, 0)
    if status != 0 or not result.exists():
        raise SystemExit(f"child failed ({status}): {' '.join(cmd[:3])}...; see {log}:\n"
                         + log.read_text()[-2000:])
    times = json.loads(result.read_text())["step_s"]
    return {"step_s": [round(t, 2) for t in times], "peak_rss_gib": usage.ru_maxrss / 2 ** 20,
            "load": load}


def child_env(threads: int, src: Path | None, *, pin: bool = True) -> dict:
    """The environment of a child: ``threads`` OpenMP/MKL threads (``pin`` False: the
    environment as it is, as an independent launcher would run it); specdraft from ``src``
    (none: the peer, which must not see specdraft)."""
    env = {**os.environ}
    if pin:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    return env


def summary(runs: dict[str, list[dict]], T: int) -> None:
    med = {}
    for name, rs in runs.items():
        tps = [T * (len(r["step_s"]) - 1) / sum(r["step_s"][1:]) for r in rs]
        med[name] = (statistics.median(tps), statistics.median(r["peak_rss_gib"] for r in rs))
        print(f"  {name:<12} tokens/s {med[name][0]:7.1f} (runs {', '.join(f'{x:.1f}' for x in tps)})"
              f"   peak RSS {med[name][1]:.2f} GiB")
    b, mb = med["speculators"]
    for name in (n for n in med if n != "speculators"):
        a, ma = med[name]
        print(f"  ratio {name}/speculators: tokens/s {a / b:.2f}x (goal >= 1.2), "
              f"peak RSS {ma / mb:.2f}x (goal <= 1.0)")
    loads = [r["load"] for rs in runs.values() for r in rs]
    print(f"  load average (1 min) at the runs' starts: {min(loads):.1f}-{max(loads):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after 1 warm-up)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "bench-train-peer")
    ap.add_argument("--only", choices=["specdraft", "speculators"], default=None)
    ap.add_argument("--before-src", type=Path, default=None,
                    help="also time specdraft from this src/ tree (e.g. the previous commit's, "
                         "`git archive HEAD~1 src | tar -x -C DIR`): before/after a change")
    ap.add_argument("--peer-unpinned", action="store_true",
                    help="also time speculators launched as an independent launcher would: no "
                         "OMP/MKL_NUM_THREADS in its environment, no torch.set_num_threads "
                         "(the run named speculators-unpinned)")
    ap.add_argument("--child", choices=["specdraft"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        torch.set_num_threads(a.threads)
        specdraft_child(a.work, a.steps, a.seq, a.result)
        return
    n_rows = a.steps + 4  # the peer trains on int(0.9 * n) rows, one per step
    build(a.work, n_rows, a.seq)
    peer_py = peer_data.peer_python(REPO)
    cmds = {"specdraft": [sys.executable, str(Path(__file__).resolve()), "--child", "specdraft",
                          "--work", str(a.work), "--steps", str(a.steps), "--seq", str(a.seq),
                          "--threads", str(a.threads), "--result", str(a.work / "res-sd.json")],
            "speculators": [str(peer_py), str(HERE / "peer_speculators.py"), "--time-steps",
                            str(a.steps), "--result", str(a.work / "res-peer.json"),
                            "--threads", str(a.threads), "--",
                            *peer_args(a.work / "verifier", a.work / "peer",
                                       a.work / "peer-save", aux=list(AUX), draft_vocab=K,
                                       seq=a.seq, ttt=3, epochs=1, lr=1e-4)]}
    srcs = {"specdraft": REPO / "src", "speculators": None}
    pinned = {name: True for name in cmds}
    if a.peer_unpinned:
        unpinned = list(cmds["speculators"])
        i = unpinned.index("--threads")
        cmds["speculators-unpinned"] = unpinned[:i] + unpinned[i + 2:]
        srcs["speculators-unpinned"], pinned["speculators-unpinned"] = None, False
    if a.before_src:
        cmds["specdraft-before"] = cmds["specdraft"]
        srcs["specdraft-before"] = a.before_src / "src"
    runs: dict[str, list[dict]] = {k: [] for k in cmds if a.only in (None, k.split("-")[0])}
    for rep in range(a.reps):
        for name in runs:
            res = a.work / ("res-peer.json" if name.startswith("speculators") else "res-sd.json")
            r = run_child(cmds[name], child_env(a.threads, srcs[name], pin=pinned.get(name, True)),
                          res, a.work / f"log-{name}-{rep}.txt")
            runs[name].append(r)
            print(json.dumps({"run": name, "rep": rep, "seq": a.seq, **r}), flush=True)
    print(f"\nbench_train_peer: seq {a.seq}, TTT 3, draft vocab {K}, V {V}, {a.threads} threads, "
          f"{a.steps} timed steps per run, {a.reps} interleaved reps, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if "speculators" in runs and len(runs) > 1:
        summary(runs, a.seq)


if __name__ == "__main__":
    main()
