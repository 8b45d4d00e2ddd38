"""Canonical artifacts: public weights (safetensors) + public config (JSON) + a sha256 manifest.

Why: users and CI need a fixed, inspectable set of instances whose bytes prove determinism
(docs/CONTRACT.md, "Determinism and versions"). ``write`` generates them; ``check`` regenerates in
memory and compares bytes with the manifest and the files on disk. Ground truth is never written
here, and nothing is ever loaded with pickle (safetensors and JSON only). The tensor naming
(``model.*``, ``probe.*``) is the one sandbox payloads use too, so it lives in the model layer
(``arch/tensors.py``), which both import.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from . import BENCHMARK_VERSION
from .arch import json_safe, public_tensors
from .tasks import LEVELS, Instance, families, get_family

CANONICAL_SEEDS = (0, 1)
DEFAULT_DIR = Path(__file__).resolve().parent / "artifacts"


def instance_files(inst: Instance) -> dict[str, bytes]:
    """The two files of one instance, as bytes: weights+probe tensors, and the public config."""
    tensors, other = public_tensors(inst.model, inst.probe)
    stem = f"{inst.task_id}/{inst.level}/seed{inst.seed}"
    config = {
        "task_id": inst.task_id,
        "level": inst.level,
        "seed": inst.seed,
        "family_version": inst.family_version,
        "config": json_safe(inst.config),
        "probe": other,
        "prompt": inst.prompt,
        "answer_schema": inst.answer_schema,
    }
    return {
        f"{stem}.safetensors": save(tensors, metadata={"family_version": inst.family_version}),
        f"{stem}.json": (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
    }


Generator = Callable[[str, int, str], Instance]  # (task_id, seed, level) -> Instance


def _generate(task_id: str, seed: int, level: str) -> Instance:
    return get_family(task_id).generate(seed, level)


def canonical_instances(generate: Generator = _generate) -> Iterator[Instance]:
    for fam in families():
        for level in LEVELS:
            for seed in CANONICAL_SEEDS:
                yield generate(fam.id, seed, level)


def n_canonical() -> int:
    return len(families()) * len(LEVELS) * len(CANONICAL_SEEDS)


def build_all(progress: bool = True, generate: Generator = _generate) -> dict[str, bytes]:
    from tqdm import tqdm

    files: dict[str, bytes] = {}
    for inst in tqdm(canonical_instances(generate), total=n_canonical(), disable=not progress, desc="artifacts"):
        files.update(instance_files(inst))
    return files


def manifest(files: dict[str, bytes]) -> dict[str, Any]:
    return {
        "benchmark_version": BENCHMARK_VERSION,
        "family_versions": {f.id: f.family_version for f in families()},
        "seeds": list(CANONICAL_SEEDS),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }


def write(out_dir: Path = DEFAULT_DIR, progress: bool = True) -> dict[str, Any]:
    files = build_all(progress)
    for name, data in files.items():
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    man = manifest(files)
    (out_dir / "manifest.json").write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    return man


QUANTUM = 2.0**-16  # the grid continuous weights are rounded to (docs/CONTRACT.md, "Determinism and versions")
ROUNDING_SHARE = 1e-3  # at most this share of a file's entries may land one quantum apart on another CPU


def rounding_only(recorded: bytes, regenerated: bytes) -> str | None:
    """Why two safetensors files differ only by the platform's rounding, or None when they differ otherwise.

    A weight built from a float64 product is rounded to the 2^-16 grid; where the product lands within a rounding
    error of half a quantum, another CPU's BLAS (AVX-512 against AVX2 summation) can round it one quantum the other
    way. That is the one difference allowed: same names, shapes, dtypes and metadata, integer tensors equal, and
    float entries equal or exactly one quantum apart, in at most ``ROUNDING_SHARE`` of the entries."""

    def metadata(data: bytes) -> dict[str, str] | None:
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        return header.get("__metadata__")

    old, new = load(recorded), load(regenerated)
    if sorted(old) != sorted(new) or metadata(recorded) != metadata(regenerated):
        return None
    moved = total = 0
    for name, a in old.items():
        b = new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            return None
        total += a.numel()
        if torch.equal(a, b):
            continue
        if not a.is_floating_point():
            return None
        gap = (a.double() - b.double()).abs()
        if not bool(((gap == 0) | (gap == QUANTUM)).all()):
            return None
        moved += int((gap > 0).sum())
    if moved > ROUNDING_SHARE * total:
        return None
    return f"{moved} of {total} entries one quantum (2^-16) apart: another CPU's float64 rounding"


def check(out_dir: Path = DEFAULT_DIR, progress: bool = True, generate: Generator = _generate,
          notes: list[str] | None = None) -> list[str]:  # fmt: skip
    """Regenerate in memory; return every mismatch against the manifest and the files (empty = OK).

    ``generate`` makes each instance; the test suite passes the instances it already generated in
    the same run (with the same code), so that the bytes are checked without generating twice. A weights file that
    differs from the manifest only by another CPU's rounding (``rounding_only``) is not a mismatch: it goes to
    ``notes`` (when given), and the committed file must still match the manifest."""
    problems: list[str] = []
    man_path = out_dir / "manifest.json"
    if not man_path.is_file():
        return [f"{man_path} is missing: run `mechsandbox gen-art` first"]
    recorded = json.loads(man_path.read_text())
    files = build_all(progress, generate)
    fresh = manifest(files)
    for key in ("benchmark_version", "family_versions", "seeds"):
        if recorded.get(key) != fresh[key]:
            problems.append(f"manifest {key} is {recorded.get(key)!r}, regenerated {fresh[key]!r}")
    rec_files, new_files = recorded.get("files", {}), fresh["files"]
    for name in sorted(set(rec_files) | set(new_files)):
        if name not in new_files:
            problems.append(f"{name}: in the manifest but no longer generated")
        elif name not in rec_files:
            problems.append(f"{name}: generated but missing from the manifest")
        else:
            path = out_dir / name
            committed = path.read_bytes() if path.is_file() else None
            if committed is None:
                problems.append(f"{name}: listed in the manifest but the file is missing")
            elif hashlib.sha256(committed).hexdigest() != rec_files[name]:
                problems.append(f"{name}: file on disk differs from the manifest")
            elif rec_files[name] != new_files[name]:
                why = rounding_only(committed, files[name]) if name.endswith(".safetensors") else None
                if why is None:
                    problems.append(f"{name}: regenerated sha256 {new_files[name][:12]} != manifest "
                                    f"{rec_files[name][:12]}")  # fmt: skip
                elif notes is not None:
                    notes.append(f"{name}: {why}")
    return problems
