"""The real-script corpus: unmodified public training scripts, each run small and checked three ways
against ground truth that torchrepro does not compute:

1. counts: `torchrepro doctor`'s compiles, recompiles, graph breaks and unique graphs against
   Dynamo's own counters from a plain run of the same script (realworld/dynamo_counters.py);
2. verdict: `torchrepro check`'s verdict against two plain runs' printed losses (identical printed
   losses: BIT-EXACT expected; different: anything but BIT-EXACT);
3. non-perturbation: the losses the script prints under `doctor` are the plain run's.

Plus, on every compiled script, `torchrepro check --against eager`: its verdict and headline are
recorded as they are (a localisation, or the reason it gives).

    python realworld/run.py [--only NAME,...] [--work DIR] [--table FILE]

Each script is copied with its folder into a fresh work directory (build/realworld/<name>), where a
prep step writes the synthetic data it expects; every run starts there. The upstream files are
never edited: realworld/manifest.json holds their sha256 (tests/realworld checks them). Exit 0 when
every script passes its three checks, 1 otherwise; the table goes to stdout and --table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STUBS = HERE / "stubs"
WORDS = [f"w{i}" for i in range(40)]


def _words(path: Path, lines: int, rng: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) + "\n" for _ in range(lines)))


def prep_wikitext(work: Path) -> None:
    """data/wikitext-2/{train,valid,test}.txt: lines of random words (the script builds its vocabulary)."""
    rng = random.Random(0)
    for split, lines in (("train", 40), ("valid", 12), ("test", 12)):
        _words(work / "data" / "wikitext-2" / f"{split}.txt", lines, rng)


def prep_sine(work: Path) -> None:
    """traindata.pt as generate_sine_wave.py writes it (a pickled float64 numpy array of shifted sine
    waves), but 8 waves of 40 points instead of 100 of 1000."""
    import torch

    rng = np.random.RandomState(2)
    t, n, length = 20, 8, 40
    x = np.empty((n, length), "int64")
    x[:] = np.array(range(length)) + rng.randint(-4 * t, 4 * t, n).reshape(n, 1)
    torch.save(np.sin(x / 1.0 / t).astype("float64"), work / "traindata.pt")


def prep_nanogpt(work: Path) -> None:
    """data/synth/{train,val}.bin (uint16 token ids) and meta.pkl ({vocab_size, itos, stoi}), the
    layout nanoGPT's data/shakespeare_char/prepare.py writes."""
    d = work / "data" / "synth"
    d.mkdir(parents=True)
    rng = np.random.RandomState(0)
    rng.randint(0, 65, 4000).astype(np.uint16).tofile(d / "train.bin")
    rng.randint(0, 65, 800).astype(np.uint16).tofile(d / "val.bin")
    chars = [chr(33 + i) for i in range(65)]
    meta = {"vocab_size": 65, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (d / "meta.pkl").write_bytes(pickle.dumps(meta))


def prep_chars(work: Path) -> None:
    """input.txt: random text over an alphabet holding every character of the sampling prompt."""
    rng = random.Random(0)
    alphabet = "O God,!abcdefghij \n"
    (work / "input.txt").write_text("".join(rng.choices(alphabet, k=3000)))


def prep_wikitext2_mini(work: Path) -> None:
    """data/wikitext-2.txt, the file lightning.pytorch.demos.WikiText2 downloads unless it is there:
    lines of random words, just enough tokens for the script's fixed split (4000 blocks of 35 tokens
    for validation and test) to leave 40 blocks for training (one batch of 20 per rank)."""
    rng = random.Random(0)
    lines, tokens = [], 0
    while tokens <= 35 * (4000 + 40 + 1):
        line = rng.choices(WORDS, k=rng.randint(4, 12))
        lines.append(" ".join(line) + "\n")
        tokens += len(line) + 1  # WikiText2 adds <eos> to every line
    (work / "data").mkdir()
    (work / "data" / "wikitext-2.txt").write_text("".join(lines))


def prep_names(work: Path) -> None:
    """names.txt (makemore's default input, one name a line): 300 random words of 3 to 8 letters."""
    rng = random.Random(0)
    (work / "names.txt").write_text(
        "".join("".join(rng.choices("abcdefghijklmno", k=rng.randint(3, 8))) + "\n" for _ in range(300))
    )


# multigpu_torchrun.py pins CUDA and NCCL, which no argument changes: the smallest patch that runs it on
# the CPU with gloo (ddp_tutorial/UPSTREAM.md), applied to the work directory's copy, never to realworld/
DDP_ON_CPU = (
    ('    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
    ('backend="nccl"', 'backend="gloo"'),
    (".to(self.gpu_id)", '.to("cpu")'),
    ('loc = f"cuda:{self.gpu_id}"', 'loc = "cpu"'),
    ("DDP(self.model, device_ids=[self.gpu_id])", "DDP(self.model)"),
)


def _patch(script: Path, replacements: tuple[tuple[str, str], ...], name: str) -> None:
    """``script`` with ``replacements`` (named ``name`` here) applied, each of which must match."""
    text = script.read_text()
    for old, new in replacements:
        if old not in text:
            raise ValueError(f"{script.name} no longer holds {old!r}: {name} needs updating")
        text = text.replace(old, new)
    script.write_text(text)


def prep_ddp_on_cpu(work: Path) -> None:
    """multigpu_torchrun.py with DDP_ON_CPU's replacements, each of which must match."""
    _patch(work / "multigpu_torchrun.py", DDP_ON_CPU, "DDP_ON_CPU")


# example.py of PyTorch's FSDP2 example exits unless it finds 2 accelerators, and hands init_process_group
# the device, which must then be one: the smallest patch that runs it on the CPU with gloo (the backend
# it picks itself for the CPU; fsdp2/UPSTREAM.md), applied to the work directory's copy
FSDP2_ON_CPU = (
    ("    return has_gpu and gpu_count >= min_gpus\n", "    return True\n"),
    ("init_process_group(backend=backend, device_id=device)", "init_process_group(backend=backend)"),
)


def prep_fsdp2_on_cpu(work: Path) -> None:
    """example.py with FSDP2_ON_CPU's replacements, each of which must match."""
    _patch(work / "example.py", FSDP2_ON_CPU, "FSDP2_ON_CPU")


def prep_llmc_tokens(work: Path) -> None:
    """synthetic.bin: 200,000 random GPT-2 token ids in llm.c's token file format (a header of 256
    int32: magic 20240520, version 1, the token count; then the tokens as uint16)."""
    tokens = np.random.default_rng(0).integers(0, 50257, size=200_000, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    (work / "synthetic.bin").write_bytes(header.tobytes() + tokens.tobytes())


def prep_nothing(work: Path) -> None:
    """The script makes its own data."""


@dataclass(frozen=True)
class Script:
    name: str  # the corpus entry (a script may appear with two configurations)
    folder: str  # under realworld/
    entry: str  # the script, relative to its folder (= the work directory)
    args: tuple[str, ...]
    losses: str  # regex: every group of every match, in order, is "what the script printed"
    covers: str
    prep: Callable[[Path], None] = prep_nothing
    compiled: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # files the script saves (checkpoints): their tensors are compared too, bit for bit, because a
    # printed loss rounded to 2-5 digits hides a difference in the last bits
    saves: tuple[str, ...] = ()
    # realworld/stubs on PYTHONPATH: a matplotlib that draws nothing, a tensorboard that writes nothing (only
    # for the scripts that need them: others' libraries, torchmetrics under Lightning, would take them for
    # the real ones and fail)
    stubs: bool = False
    nproc: int = 1  # > 1: plain runs under torchrun (standalone rendezvous), torchrepro with --nproc
    # the compile id of the graph that trains, read from the script: where it evaluates under no_grad before
    # its first training step (nanoGPT's estimate_loss() at iteration 0), Dynamo's first graph is that
    # evaluation, and `check --against eager` must blame what training computed on the training graph only
    training_graph: str | None = None
    # finding codes doctor and check must both report: what the script is known to do (read from its source)
    findings: tuple[str, ...] = ()
    # the cause of a divergence two runs may hold that neither prints nor saves (memory left uninitialised
    # differs from run to run, then the loss is NaN everywhere): check may find it where the plain runs agree
    hidden_cause: str | None = None


SCRIPTS = [
    Script(
        "word_language_model-lstm",
        "word_language_model",
        "main.py",
        (
            "--model",
            "LSTM",
            "--emsize",
            "16",
            "--nhid",
            "16",
            "--nlayers",
            "1",
            "--epochs",
            "2",
            "--bptt",
            "8",
            "--batch_size",
            "4",
            "--log-interval",
            "1",
        ),
        r"\bloss\s+([-0-9.]+)",
        "eager LSTM, hand-written SGD update (no torch.optim), no_grad evaluation each epoch",
        prep_wikitext,
        saves=("model.pt",),
    ),
    Script(
        "word_language_model-transformer",
        "word_language_model",
        "main.py",
        (
            "--model",
            "Transformer",
            "--emsize",
            "16",
            "--nhid",
            "16",
            "--nlayers",
            "1",
            "--nhead",
            "2",
            "--epochs",
            "2",
            "--bptt",
            "8",
            "--batch_size",
            "4",
            "--log-interval",
            "1",
        ),
        r"\bloss\s+([-0-9.]+)",
        "eager Transformer (dropout 0.2), hand-written update, no_grad evaluation each epoch",
        prep_wikitext,
        saves=("model.pt",),
    ),
    Script(
        "time_sequence_prediction",
        "time_sequence_prediction",
        "train.py",
        ("--steps", "2"),
        r"loss: (\S+)",
        "LBFGS with a closure (20 backward calls per step), float64, no_grad prediction each step",
        prep_sine,
        # traindata.pt is a pickled numpy array: torch>=2.6 loads weights only unless told otherwise.
        # One thread: ~10^5 tiny float64 ops, which 2 threads on a loaded machine make 10x slower
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OMP_NUM_THREADS": "1"},
        stubs=True,
    ),
    Script(
        "regression",
        "regression",
        "main.py",
        (),
        r"Loss: (\S+) after (\d+) batches|function:\t(.*)",
        "eager, unseeded (runs differ by design), hand-written update, loop until loss < 1e-3",
    ),
    Script(
        "minGPT-adder",
        "minGPT",
        "projects/adder/adder.py",
        (
            "--data.ndigit=1",
            "--trainer.max_iters=21",
            "--trainer.num_workers=2",
            "--trainer.batch_size=16",
            "--trainer.device=cpu",
        ),
        r"iter (\d+): train loss (\S+)|final score: (\S+)",
        "eager GPT, DataLoader with 2 workers, no_grad evaluation (greedy generation) in the loop",
    ),
    Script(
        "minGPT-chargpt",
        "minGPT",
        "projects/chargpt/chargpt.py",
        (
            "--model.model_type=gpt-nano",
            "--data.block_size=16",
            "--trainer.batch_size=8",
            "--trainer.max_iters=21",
            "--trainer.num_workers=2",
            "--trainer.device=cpu",
        ),
        r"iter (\d+): train loss (\S+)",
        "eager GPT, DataLoader with 2 workers, sampled generation (multinomial) under no_grad in the loop",
        prep_chars,
        # One thread: its 500-token generation is tens of thousands of tiny ops, each a parallel region that 2
        # threads on a loaded machine make wait for a time slice (900 s and more at load ~24)
        env={"OMP_NUM_THREADS": "1"},
    ),
    Script(
        "nanoGPT",
        "nanoGPT",
        "train.py",
        (
            "--dataset=synth",
            "--device=cpu",
            "--dtype=float32",
            "--compile=True",
            "--n_layer=2",
            "--n_head=2",
            "--n_embd=32",
            "--block_size=32",
            "--batch_size=4",
            "--gradient_accumulation_steps=2",
            "--max_iters=4",
            "--eval_interval=2",
            "--eval_iters=2",
            "--log_interval=1",
            "--warmup_iters=2",
            "--lr_decay_iters=4",
        ),
        r"step (\d+): train loss (\S+), val loss (\S+)|iter (\d+): loss (\S+),",
        "torch.compile (inductor), GPT returning a 0-dim loss from the compiled graph, gradient accumulation "
        "(2 micro-batches), estimate_loss under no_grad in the loop",
        prep_nanogpt,
        compiled=True,
        saves=("out/ckpt.pt",),
        training_graph="0/1",  # 0/0: estimate_loss() under no_grad, before iteration 0 trains
    ),
    Script(
        "makemore",
        "makemore",
        "makemore.py",
        (
            "--input-file=names.txt",
            "--max-steps=501",
            "--num-workers=0",
            "--n-layer=1",
            "--n-head=2",
            "--n-embd=16",
            "--n-embd2=16",
            "--batch-size=8",
        ),
        r"step (\d+) \| loss (\S+) \||step (\d+) train loss: (\S+) test loss: (\S+)",
        "eager Transformer, seeded, infinite DataLoader (RandomSampler with replacement), AdamW, sampling "
        "(multinomial) every 200 steps, evaluation under inference_mode and a checkpoint at step 500",
        prep_names,
        saves=("out/model.pt",),
        stubs=True,  # no tensorboard here: torch.utils.tensorboard.SummaryWriter over a stand-in
        env={"OMP_NUM_THREADS": "1"},  # tiny ops: a second thread on a loaded machine only waits
    ),
    Script(
        "fabric-language_model",
        "fabric_language_model",
        "train.py",
        (),
        r"iteration: (\d+) - loss (\S+)|val loss (\S+)",
        "torch.distributed: 2 processes (torchrun), DDP on gloo through Lightning Fabric, DistributedSampler, "
        "Transformer with dropout, gradient clipping, no_grad validation every epoch; prints on rank 0 only",
        prep_wikitext2_mini,
        # what `fabric run --accelerator cpu --strategy ddp --devices 2 train.py` sets for its processes
        env={"LT_CLI_USED": "1", "LT_ACCELERATOR": "cpu", "LT_STRATEGY": "ddp", "LT_DEVICES": "2"},
        nproc=2,
    ),
    Script(
        "ddp_tutorial",
        "ddp_tutorial",
        "multigpu_torchrun.py",
        ("2", "1", "--batch_size=256"),
        r"Epoch (\d+) \| Training snapshot saved",
        "torch.distributed: 2 processes (torchrun), DDP on gloo (patched from NCCL/CUDA), DistributedSampler, "
        "unseeded torch.rand data and init (runs differ by design), snapshot.pt saved each epoch and resumed "
        "from when present",
        prep_ddp_on_cpu,
        # its snapshot, compared bit for bit and removed after each plain run: the next run starts afresh
        saves=("snapshot.pt",),
        nproc=2,
    ),
    Script(
        "fsdp2",
        "fsdp2",
        "example.py",
        (),
        r"(?!)",  # it prints no loss: what it saved is what two runs are compared by
        "torch.distributed: 2 processes (torchrun), FSDP2 (fully_shard) on gloo (patched from 2 accelerators), "
        "a Transformer built on meta and materialised with to_empty(), whose reset_parameters() leaves its blocks "
        "uninitialised (loss NaN); a checkpoint saved at the end and loaded when present",
        prep_fsdp2_on_cpu,
        saves=("checkpoints",),  # a folder named by the time of saving: every .pt in it, removed after each run
        nproc=2,
        findings=("UNINITIALISED_PARAMETERS", "NONFINITE_LOSS"),
        hidden_cause="init_params",
    ),
]

# karpathy/llm.c's GPT-2 trainer at GPT-2 small's shapes (124M parameters), compiled with inductor:
# not in SCRIPTS (its three checks would take most of an hour on a CPU); tests/realworld checks it
# against eager, where it is named where compiled first departs, at bounded disk
LLMC = Script(
    "llmc-gpt2-d12",
    "llmc",
    "train_gpt2.py",
    (
        "--model=d12",
        "--compile=1",
        "--write_tensors=0",
        "--num_iterations=2",
        "--input_bin=synthetic.bin",
        "--device=cpu",
    ),
    r"step\s+(\d+)/\d+ \| train loss (\S+) \| norm (\S+)",
    "GPT-2 small (d12, random init, tied embeddings), torch.compile (inductor), AdamW, gradient clipping",
    prep_llmc_tokens,
    compiled=True,
    stubs=True,  # tiktoken: the GPT-2 encoding is a download, used only to sample
)


def printed(script: Script, stdout: str) -> list[str]:
    """What the script printed that a person compares: the regex's groups, in order."""
    return [g for m in re.finditer(script.losses, stdout) for g in m.groups() if g is not None]


@dataclass
class Outcome:
    """One command's result."""

    rc: int
    stdout: str
    stderr: str
    seconds: float

    def tail(self) -> str:
        return (self.stdout + self.stderr)[-2000:]


def _same_tensors(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two saved objects: tensors by value (NaN equal to NaN), modules by
    state_dict, containers item by item, anything else by ==."""
    import torch

    if isinstance(a, torch.nn.Module):
        a, b = a.state_dict(), b.state_dict()
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        return torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same_tensors, a, b))
    return bool(a == b)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


class Runner:
    """Runs one corpus entry in its own work directory."""

    def __init__(self, script: Script, root: Path, timeout: float) -> None:
        self.s = script
        self.work = root.resolve() / script.name  # commands run there: --out must not be relative
        self.timeout = timeout
        self.env = dict(os.environ)
        self.env.update(script.env)
        paths = [str(REPO / "src"), str(self.work)] + ([str(STUBS)] if script.stubs else [])
        self.env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])

    def prepare(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.copytree(HERE / self.s.folder, self.work)
        self.s.prep(self.work)

    def plain(self, label: str, *argv: str) -> Outcome:
        """`python ARGV` as its user starts it: under torchrun when the script runs on several ranks."""
        launch = ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.s.nproc}")
        return self.run(label, *(launch if self.s.nproc > 1 else ()), *argv)

    def run(self, label: str, *argv: str) -> Outcome:
        """`python ARGV` in the work directory; its stdout and stderr also kept in LABEL.out/.err there."""
        start = time.monotonic()
        try:
            p = subprocess.run(
                [sys.executable, *argv],
                cwd=self.work,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = -9, _text(e.stdout), _text(e.stderr) + f"\n[timed out after {self.timeout:.0f} s]"
        (self.work / f"{label}.out").write_text(out)
        (self.work / f"{label}.err").write_text(err)
        return Outcome(rc, out, err, time.monotonic() - start)

    def saved(self) -> list[Any]:
        """What the script saved (`Script.saves`; None where it saved nothing; a folder: the list of its
        .pt files in the order of their paths), loaded and removed, so that the next run's files are its own."""
        import torch

        sys.path.insert(0, str(self.work))  # a whole pickled model needs the script's classes
        try:
            files = [self.work / f for f in self.s.saves]
            loaded = [
                [torch.load(p, weights_only=False) for p in sorted(f.rglob("*.pt"))]
                if f.is_dir()
                else torch.load(f, weights_only=False)
                if f.exists()
                else None
                for f in files
            ]
        finally:
            sys.path.remove(str(self.work))
        for f in files:
            if f.is_dir():
                shutil.rmtree(f)
            f.unlink(missing_ok=True)
        return loaded

    def torchrepro(self, label: str, *argv: str) -> tuple[Outcome, dict]:
        """A torchrepro command writing its run directory `label` in the work directory; its report.json."""
        out_dir = self.work / label
        nproc = ("--nproc", str(self.s.nproc)) if self.s.nproc > 1 else ()
        outcome = self.run(
            label, "-m", "torchrepro", *argv, *nproc, "--out", str(out_dir), self.s.entry, "--", *self.s.args
        )
        report = out_dir / "report.json"
        return outcome, json.loads(report.read_text()) if report.exists() else {}


COUNTS = ("compiles", "recompiles", "graph_breaks", "unique_graphs")
RANK_COUNTS = ("compiles", "recompiles", "graph_breaks")  # the report's per-rank figures


def dynamo_truth(work: Path, nproc: int) -> tuple[dict, dict[str, dict]]:
    """Dynamo's counters as realworld/dynamo_counters.py wrote them, one file per rank: the sum over
    ranks (what the report's totals count) and each rank's; empty when a rank wrote none."""
    files = [work / f"counters-{r}.json" for r in range(nproc)]
    if not all(f.exists() for f in files):
        return {}, {}
    ranks = {str(r): json.loads(f.read_text()) for r, f in enumerate(files)}
    total = {k: sum(c[k] for c in ranks.values()) for k in COUNTS}
    return total, ranks


def check_script(script: Script, root: Path, timeout: float, log: Callable[[str], None]) -> dict:
    """The three checks (and --against eager for a compiled script); a JSON-able record."""
    r = Runner(script, root, timeout)
    r.prepare()
    rec: dict = {"name": script.name, "covers": script.covers, "compiled": script.compiled}
    t0 = time.monotonic()

    a = r.plain("plain-counted", str(HERE / "dynamo_counters.py"), "counters-{rank}.json", script.entry, *script.args)
    saved_a = r.saved()
    b = r.plain("plain", script.entry, *script.args)
    saved_b = r.saved()
    log(f"{script.name}: plain runs rc {a.rc}/{b.rc} ({a.seconds:.0f}+{b.seconds:.0f} s)")
    truth, truth_ranks = dynamo_truth(r.work, script.nproc)
    if script.nproc == 1:
        truth_ranks = {}  # one process: its counts are the totals
    pa, pb = printed(script, a.stdout), printed(script, b.stdout)
    rec["plain"] = {"rc": [a.rc, b.rc], "printed": [pa, pb], "seconds": round(b.seconds, 1), "counters": truth}
    rec["plain"]["saved_identical"] = same_saved = all(_same_tensors(x, y) for x, y in zip(saved_a, saved_b))
    if a.rc or b.rc or not pa:
        rec["plain"]["tail"] = (a if a.rc or not pa else b).tail()

    doc, report = r.torchrepro("tr-doctor", "doctor")
    saved_doctor = r.saved()  # removed: check's runs start as the plain ones did
    log(f"{script.name}: doctor rc {doc.rc} ({doc.seconds:.0f} s)")
    got = {k: report.get("compile", {}).get(k) for k in COUNTS}
    got_ranks = {
        rank: {k: report.get("compile", {}).get("per_rank", {}).get(rank, {}).get(k) for k in RANK_COUNTS}
        for rank in truth_ranks
    }
    rec["doctor"] = {
        "rc": doc.rc,
        "counts": got,
        # the script's own stdout, which doctor keeps apart from its report (logs/stdout.log)
        "printed": printed(script, _read(r.work / "tr-doctor" / "logs" / "stdout.log")),
        "seconds": round(doc.seconds, 1),
    }
    if not report:
        rec["doctor"]["tail"] = doc.tail()
    if truth_ranks:
        rec["plain"]["counters_per_rank"] = truth_ranks
        rec["doctor"]["counts_per_rank"] = got_ranks
    rec["counts_ok"] = (
        bool(truth)
        and all(got[k] == truth.get(k) for k in COUNTS)
        and all(got_ranks[rank][k] == truth_ranks[rank][k] for rank in truth_ranks for k in RANK_COUNTS)
    )
    # an unseeded script prints differently each run: then there is no printed ground truth to perturb; a
    # script that prints none is held to what it saved
    rec["plain_identical"] = same = pa == pb and same_saved
    if pb or not script.saves:
        rec["unperturbed"] = "n/a" if pa != pb else "yes" if pb and rec["doctor"]["printed"] == pb else "no"
    else:
        unchanged = all(_same_tensors(x, y) for x, y in zip(saved_b, saved_doctor)) and any(saved_doctor)
        rec["unperturbed"] = "n/a" if not same_saved else "yes" if unchanged else "no"

    chk, creport = r.torchrepro("tr-check", "check", "--no-fixes")
    log(f"{script.name}: check rc {chk.rc} ({chk.seconds:.0f} s)")
    verdict = creport.get("verdict", "")
    rec["check"] = {"rc": chk.rc, "verdict": verdict, "seconds": round(chk.seconds, 1)}
    if not creport:
        rec["check"]["tail"] = chk.tail()
    cause = ((creport.get("determinism") or {}).get("first_divergence") or {}).get("cause")
    hidden = (
        same and script.hidden_cause is not None and verdict.startswith("DIVERGED") and cause == script.hidden_cause
    )
    rec["verdict_ok"] = bool(verdict) and (verdict.startswith("BIT-EXACT") if same else verdict.startswith("DIVERGED"))
    rec["verdict_ok"] = rec["verdict_ok"] or hidden
    found = {"doctor": report, "check": creport}
    rec["findings"] = {k: [c for c in script.findings if c not in _codes(v)] for k, v in found.items()}  # missed
    rec["findings_ok"] = not any(rec["findings"].values())

    if script.compiled:
        ag, areport = r.torchrepro("tr-against-eager", "check", "--against", "eager", "--no-fixes")
        log(f"{script.name}: check --against eager rc {ag.rc} ({ag.seconds:.0f} s)")
        rec["against_eager"] = {
            "rc": ag.rc,
            "verdict": areport.get("verdict", ""),
            "first_divergence": (areport.get("determinism") or {}).get("first_divergence"),
            "notes": [f.get("message", "") for f in areport.get("findings", [])][:6],
            "seconds": round(ag.seconds, 1),
        }
        if not areport:
            rec["against_eager"]["tail"] = ag.tail()
        if script.training_graph:
            rec["against_eager"]["graph_ok"] = training_graph_named(areport, script.training_graph)
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["ok"] = (
        rec["counts_ok"]
        and rec["verdict_ok"]
        and rec["unperturbed"] != "no"
        and rec["findings_ok"]
        and rec.get("against_eager", {}).get("graph_ok", True)
    )
    return rec


def _codes(report: dict) -> set[str]:
    return {f.get("code") for f in report.get("findings", [])}


def training_graph_named(report: dict, training: str) -> bool:
    """Whether `check --against eager`'s verdict blames what training computed (the loss, the gradients,
    the parameters) on the training graph, never on a graph that ran under no_grad only: its first
    divergence names compile id ``training`` (a report that names no graph or another one fails)."""
    fd = (report.get("determinism") or {}).get("first_divergence") or {}
    if fd.get("what") not in ("loss", "grads", "params"):
        return False
    return (fd.get("compile_id") or (fd.get("evidence") or {}).get("compile_id")) == training


VERDICTS = ("BIT-EXACT", "WITHIN TOLERANCE", "DIVERGED", "INCOMPLETE", "NOTHING COMPARED")


def _verdict(result: dict) -> str:
    """The verdict's keyword (the report's verdict line goes on with the details)."""
    return next((v for v in VERDICTS if result["verdict"].startswith(v)), "")


def _c(d: dict) -> str:
    return "/".join(str(d.get(k)) for k in COUNTS)


def table(records: list[dict]) -> str:
    """The results table (markdown) docs/evidence/accuracy.md carries."""
    rows = [
        "| script | covers | counts c/r/b/g: Dynamo → doctor | two plain runs | check verdict | "
        "doctor leaves printed losses unchanged | pass | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        counts = f"{_c(rec['plain']['counters'])} → {_c(rec['doctor']['counts'])} {'✓' if rec['counts_ok'] else '✗'}"
        plain = rec["plain"]
        same = (
            "differ (printed)"
            if plain["printed"][0] != plain["printed"][1]
            else "identical"
            if plain["saved_identical"]
            else "printed identical, saved tensors differ"
        )
        verdict = f"{_verdict(rec['check']) or 'none (rc %d)' % rec['check']['rc']} {'✓' if rec['verdict_ok'] else '✗'}"
        expected = next((s.findings for s in SCRIPTS if s.name == rec["name"]), ())
        if expected:  # the findings both doctor and check must report
            verdict += f"; doctor and check find {', '.join(expected)} {'✓' if rec['findings_ok'] else '✗'}"
        differ = "print" if plain["printed"][1] else "save"  # a script that prints no loss is held to what it saved
        unp = {"yes": "yes ✓", "no": "no ✗", "n/a": f"n/a (plain runs {differ} differently)"}[rec["unperturbed"]]
        rows.append(
            f"| {rec['name']} | {rec['covers']} | {counts} | {same} | {verdict} | {unp} | "
            f"{'PASS' if rec['ok'] else 'FAIL'} | {rec['seconds']:.0f} s |"
        )
    against = [rec for rec in records if "against_eager" in rec]
    if against:
        rows += [
            "",
            "| compiled script | `check --against eager` (rc) | what it says | names the training graph |",
            "|---|---|---|---|",
        ]
        for rec in against:
            ae = rec["against_eager"]
            text = (ae["verdict"] or ae.get("tail", "")[-300:]).replace("|", "\\|").replace("\n", " ")
            text = re.sub(r"/\S+/" + re.escape(rec["name"]) + "/", "", text)  # the work directory
            graph = {True: "yes ✓", False: "no ✗", None: "n/a"}[ae.get("graph_ok")]
            rows.append(f"| {rec['name']} | {_verdict(ae) or 'none'} (rc {ae['rc']}) | {text} | {graph} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated corpus entries (default: all)")
    p.add_argument("--work", type=Path, default=REPO / "build" / "realworld", help="work directory root")
    p.add_argument("--table", type=Path, help="also write the markdown table here")
    p.add_argument(
        "--timeout", type=float, default=1800, help="seconds per command (a loaded 2-core machine needs ~800)"
    )
    args = p.parse_args(argv)
    chosen = [s for s in SCRIPTS if not args.only or s.name in args.only.split(",")]
    if not chosen:
        p.error(f"no such entry; known: {', '.join(s.name for s in SCRIPTS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    records = []
    for s in chosen:
        records.append(check_script(s, args.work, args.timeout, lambda m: print(m, file=sys.stderr, flush=True)))
        (args.work / "results.json").write_text(json.dumps(records, indent=1))
    text = table(records) + f"\n{len(records)} scripts, {time.monotonic() - start:.0f} s in all\n"
    print(text)
    if args.table:
        args.table.write_text(text)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
