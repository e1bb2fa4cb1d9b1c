"""Signed compile-cache packs: `cache keygen`, `cache pack --sign`, `cache unpack --trusted` and
`cache verify`, on real packs of a small hand-made cache (real tar files, real Ed25519 keys).
Every refusal is one line, exit 2, and leaves the destination exactly as it was."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from torchrepro.cache.signing import TRUSTED_VAR, fingerprint

from test_cache import cli, fake_cache, snapshot


@pytest.fixture
def keys(tmp_path, capsys) -> dict[str, Path]:
    """Two key pairs: ``mine`` (trusted) and ``other`` (not)."""
    made = {}
    for name in ("mine", "other"):
        assert cli(capsys, "cache", "keygen", tmp_path / name)[0] == 0
        made[name] = tmp_path / name
    return made


def _pack(tmp_path, capsys, name: str, *options) -> Path:
    path = tmp_path / name
    source = tmp_path / "source"
    if not source.exists():
        fake_cache(source)
    code, _, err = cli(capsys, "cache", "pack", path, "--no-headers", "--from", source, *options)
    assert code == 0, err
    return path


def _refused(capsys, tmp_path, pack: Path, *options, says: str) -> None:
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, "cache", "unpack", pack, "--into", target / "cache", *options)
    assert code == 2, out + err
    assert err.startswith("torchrepro: error:") and len(err.strip().splitlines()) == 1
    assert says in err and "nothing was unpacked" in err
    assert snapshot(tmp_path) == before  # no file, no staging directory, next to the target or anywhere


def test_keygen_writes_a_private_and_a_public_key_and_never_overwrites(tmp_path, keys, capsys):
    private, public = keys["mine"], tmp_path / "mine.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    kind, b64 = public.read_text().split()
    assert kind == "torchrepro-ed25519" and len(b64) == 44
    before = (private.read_bytes(), public.read_bytes())
    code, _, err = cli(capsys, "cache", "keygen", private)
    assert code == 2 and "exists" in err and len(err.strip().splitlines()) == 1
    private.unlink()  # the .pub alone is enough to refuse: the pair must stay a pair
    code, _, err = cli(capsys, "cache", "keygen", private)
    assert code == 2 and "mine.pub exists" in err
    assert not private.exists() and public.read_bytes() == before[1]


def test_signed_pack_unpacks_with_its_trusted_key(tmp_path, keys, capsys):
    pack = _pack(tmp_path, capsys, "warm.tar.gz", "--sign", keys["mine"])
    with tarfile.open(pack) as tar:
        names = tar.getnames()
    assert names[:2] == ["torchrepro-pack.json", "torchrepro-pack.sig"]
    target = tmp_path / "target"
    code, out, err = cli(capsys, "cache", "unpack", pack, "--into", target, "--trusted", tmp_path / "mine.pub")
    assert code == 0, err
    assert "signed by SHA256:" in out and "(trusted)" in out and err == ""
    assert (target / "ab" / "cabc.so").read_bytes() == (tmp_path / "source" / "ab" / "cabc.so").read_bytes()


def test_trusted_keys_from_the_environment(tmp_path, keys, capsys, monkeypatch):
    pack = _pack(tmp_path, capsys, "warm.tar", "--sign", keys["mine"])
    monkeypatch.setenv(TRUSTED_VAR, f"{tmp_path / 'other.pub'}:{tmp_path / 'mine.pub'}")
    code, out, err = cli(capsys, "cache", "unpack", pack, "--into", tmp_path / "target")
    assert code == 0 and "(trusted)" in out, err


def test_unsigned_pack_is_refused_unless_allowed(tmp_path, keys, capsys):
    pack = _pack(tmp_path, capsys, "warm.tar")
    _refused(capsys, tmp_path, pack, "--trusted", tmp_path / "mine.pub", says="unsigned")
    _refused(capsys, tmp_path, pack, says="--allow-unsigned")  # no trusted key at all: same refusal
    target = tmp_path / "target" / "cache"
    code, out, err = cli(capsys, "cache", "unpack", pack, "--into", target, "--allow-unsigned")
    assert code == 0 and (target / "ab" / "cabc.so").is_file()
    assert "author not verified" in out
    assert err.count("was not verified (unsigned)") == 1 and len(err.strip().splitlines()) == 1


def test_pack_signed_by_another_key_is_refused(tmp_path, keys, capsys):
    pack = _pack(tmp_path, capsys, "warm.tar", "--sign", keys["other"])
    _refused(capsys, tmp_path, pack, "--trusted", tmp_path / "mine.pub", says="not a trusted key (1 given)")
    code, _, err = cli(capsys, "cache", "unpack", pack, "--into", tmp_path / "t", "--allow-unsigned")
    assert code == 0 and "not verified (signed by SHA256:" in err and "not a trusted key" in err


def _alter_manifest(signed: Path, out: Path) -> None:
    """Rewrite the manifest after signing (a file's hash swapped for the attacker's), keeping the
    signature member as it was."""
    with tarfile.open(signed) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[0][1])
    manifest["files"][0]["sha256"] = "0" * 64
    with tarfile.open(out, "w") as tar:
        for info, data in [(members[0][0], json.dumps(manifest, indent=1).encode()), *members[1:]]:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_manifest_altered_after_signing_is_refused_even_with_allow_unsigned(tmp_path, keys, capsys):
    signed = _pack(tmp_path, capsys, "warm.tar", "--sign", keys["mine"])
    altered = tmp_path / "altered.tar"
    _alter_manifest(signed, altered)
    for options in ((), ("--allow-unsigned",)):
        _refused(
            capsys, tmp_path, altered, "--trusted", tmp_path / "mine.pub", *options, says="does not match the manifest"
        )
    code, out, _ = cli(capsys, "cache", "verify", altered)
    assert code == 1 and "altered after signing" in out


def test_verify_shows_the_signer(tmp_path, keys, capsys):
    signed = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
    unsigned = _pack(tmp_path, capsys, "unsigned.tar")
    mine = fingerprint(base64.b64decode((tmp_path / "mine.pub").read_text().split()[1]))
    code, out, _ = cli(capsys, "cache", "verify", signed)
    assert code == 0 and f"signed by {mine}" in out
    code, out, _ = cli(capsys, "cache", "verify", signed, "--json")
    assert json.loads(out)["signer"] == mine
    extracted = tmp_path / "extracted"  # a pack unpacked by hand: its .sig file is checked the same way
    with tarfile.open(signed) as tar:
        tar.extractall(extracted, filter="data")
    code, out, _ = cli(capsys, "cache", "verify", extracted)
    assert code == 0 and f"signed by {mine}" in out
    (extracted / "torchrepro-pack.sig").write_text("{}")
    code, out, _ = cli(capsys, "cache", "verify", extracted)
    assert code == 1 and "unreadable torchrepro-pack.sig" in out
    code, out, _ = cli(capsys, "cache", "verify", unsigned)
    assert code == 0 and "unsigned" in out


@pytest.mark.parametrize("where", ["pack", "extracted"])
def test_verify_of_an_altered_signature_says_it_does_not_verify_not_unsigned(tmp_path, keys, capsys, where):
    signed = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
    with tarfile.open(signed) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    sig = json.loads(members[1][1])
    raw = bytearray(base64.b64decode(sig["signature"]))
    raw[0] ^= 1  # one bit of the signature flipped
    members[1] = (members[1][0], json.dumps({**sig, "signature": base64.b64encode(bytes(raw)).decode()}).encode())
    altered = tmp_path / "altered.tar"
    with tarfile.open(altered, "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    target = altered
    if where == "extracted":
        target = tmp_path / "extracted"
        with tarfile.open(altered) as tar:
            tar.extractall(target, filter="data")
    code, out, _ = cli(capsys, "cache", "verify", target)
    (last,) = [line for line in out.splitlines() if line.startswith("verify ")]
    assert code == 1 and last.startswith("verify FAILED") and "signature does NOT verify" in last, out
    assert "unsigned" not in out and "the signature does not match the manifest" in out
    code, out, _ = cli(capsys, "cache", "verify", target, "--json")
    result = json.loads(out)
    assert (result["signer"], result["signed"]) == (None, True) and result["problems"]


def test_prewarm_follows_the_same_policy(tmp_path, keys, capsys, run_python):
    unsigned = _pack(tmp_path, capsys, "unsigned.tar")
    signed = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
    # a fresh interpreter: prewarm must run before any compile of its process (others of this worker compiled)
    code = f"""
import warnings
from pathlib import Path
from torchrepro.cache.policy import prewarm

def warm(pack, root, **kw):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plan = prewarm(pack, "shared", root, **kw)
    return (plan.inductor_dir / "ab" / "cabc.so").is_file(), " | ".join(str(w.message) for w in said)

print(warm({str(unsigned)!r}, {str(tmp_path / "root-a")!r}))
print(warm({str(signed)!r}, {str(tmp_path / "root-b")!r}))
print(warm({str(unsigned)!r}, {str(tmp_path / "root-c")!r}, allow_unsigned=True))
"""
    env = {TRUSTED_VAR: str(tmp_path / "mine.pub")}
    env.update({name: str(tmp_path / "default") for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")})
    skipped, trusted, allowed = run_python(code, env=env).stdout.splitlines()
    assert skipped.startswith("(False, ") and re.search("warm start skipped.*unsigned", skipped), skipped
    assert trusted == "(True, '')", trusted
    assert allowed.startswith("(True, ") and "was not verified" in allowed, allowed


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it (unpack's trust rules are in `make test`)
def test_doctor_warm_from_needs_a_trusted_pack_or_allow_unsigned(tmp_path, keys, capsys):
    """``--warm-from`` on the ranks: an unsigned pack is a warning and a cold start (the run goes
    on), and a finding in the report of each command that takes it (doctor, check); ``--allow-unsigned``
    unpacks it; a pack signed by a key in TORCHREPRO_TRUSTED_KEYS warms without a word."""
    unsigned = _pack(tmp_path, capsys, "unsigned.tar")
    signed = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
    script = tmp_path / "s.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.ones(1, 2)).sum().backward()\nopt.step()\nprint('trained')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHREPRO_", "TORCHINDUCTOR_"))}
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")

    def doctor(
        pack: Path, root: str, *options: str, command: str = "doctor", **extra: str
    ) -> subprocess.CompletedProcess:
        command = [command, "--cache-policy", "shared", "--cache-root", str(tmp_path / root), "--warm-from"]
        return subprocess.run(
            [sys.executable, "-m", "torchrepro", *command, str(pack), *options, str(script)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**env, **extra},
            timeout=300,
        )

    cold = doctor(unsigned, "cold", "--nproc-per-node", "2")  # said once, by the command, not by each rank
    assert cold.returncode == 0 and "trained" in cold.stdout
    [said] = [line for line in cold.stderr.splitlines() if "unsigned" in line]
    assert said.startswith(f"torchrepro: warning: --warm-from {unsigned}: the pack is unsigned"), cold.stderr
    assert "--allow-unsigned" in said and "TORCHREPRO_TRUSTED_KEYS" in said and "--trusted" not in said
    assert "UserWarning" not in cold.stderr and not (tmp_path / "cold" / "ab").exists()
    report = json.loads(next(tmp_path.glob("torchrepro-runs/*/report.json")).read_text())
    [finding] = [f for f in report["findings"] if f["code"] == "WARM_START_SKIPPED"]
    assert finding["severity"] == "warning" and "unsigned" in finding["title"]
    checked = doctor(unsigned, "checked", "--out", str(tmp_path / "check"), command="check")
    assert checked.returncode == 0 and checked.stderr.count("torchrepro: warning: --warm-from") == 1, checked.stderr
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert [f["title"] for f in report["findings"] if f["code"] == "WARM_START_SKIPPED"] == [finding["title"]]
    allowed = doctor(unsigned, "allowed", "--allow-unsigned")
    assert allowed.returncode == 0 and "UserWarning" not in allowed.stderr
    [said] = [line for line in allowed.stderr.splitlines() if "unsigned" in line]
    assert (
        said
        == f"torchrepro: warning: --warm-from {unsigned}: the pack is unsigned; unpacked because of --allow-unsigned"
    )
    assert (tmp_path / "allowed" / "ab" / "cabc.so").is_file()
    trusted = doctor(signed, "trusted", TORCHREPRO_TRUSTED_KEYS=str(tmp_path / "mine.pub"))
    assert trusted.returncode == 0 and "warning" not in trusted.stderr
    assert (tmp_path / "trusted" / "ab" / "cabc.so").is_file()


def _torchrepro(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    """torchrepro in a process of its own: a key it waited on would end in the timeout, not hang the tests."""
    cmd = [sys.executable, "-m", "torchrepro", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("which", ["--sign", "--trusted"])
def test_a_fifo_as_a_key_is_refused_without_waiting_on_it(tmp_path, keys, capsys, which):
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    if which == "--sign":
        fake_cache(tmp_path / "source")
        args = ["cache", "pack", tmp_path / "p.tar", "--no-headers", "--from", tmp_path / "source", "--sign", fifo]
    else:
        pack = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
        args = ["cache", "unpack", pack, "--into", tmp_path / "target", "--trusted", fifo]
    done = _torchrepro(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    what = "signing key" if which == "--sign" else "trusted key"
    assert done.stderr.splitlines() == [
        f"torchrepro: error: {what} {fifo} is not a regular file (a FIFO, a device or a directory): give the key file"
    ]
    assert not (tmp_path / "p.tar").exists() and not (tmp_path / "target").exists()


def test_a_private_key_others_can_read_is_refused(tmp_path, keys, capsys):
    fake_cache(tmp_path / "source")
    keys["mine"].chmod(0o640)
    code, _, err = cli(
        capsys,
        "cache",
        "pack",
        tmp_path / "p.tar",
        "--no-headers",
        "--from",
        tmp_path / "source",
        "--sign",
        keys["mine"],
    )
    assert code == 2
    assert err.splitlines() == [
        f"torchrepro: error: signing key {keys['mine']} can be read by others (mode 640): chmod 600 {keys['mine']}"
    ]
    assert not (tmp_path / "p.tar").exists()
    keys["mine"].chmod(0o600)  # the fix it names
    assert _pack(tmp_path, capsys, "p.tar", "--sign", keys["mine"]).is_file()


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_trusted_key_others_can_write_is_refused(tmp_path, keys, capsys, mode):
    pack = _pack(tmp_path, capsys, "signed.tar", "--sign", keys["mine"])
    public = tmp_path / "mine.pub"
    public.chmod(mode)
    before = snapshot(tmp_path)
    code, _, err = cli(capsys, "cache", "unpack", pack, "--into", tmp_path / "target", "--trusted", public)
    assert code == 2
    assert err.splitlines() == [
        f"torchrepro: error: trusted key {public} can be written by others (mode {mode:o}), who could add their "
        f"key: chmod 644 {public}"
    ]
    assert snapshot(tmp_path) == before
    public.chmod(0o644)  # the fix it names
    code, out, err = cli(capsys, "cache", "unpack", pack, "--into", tmp_path / "target", "--trusted", public)
    assert code == 0 and "(trusted)" in out, err
