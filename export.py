"""Canonical artifacts: public weights (safetensors) + public config (JSON) + a sha256 manifest.

Why: users and CI need a fixed, inspectable set of instances whose bytes prove determinism
(docs/CONTRACT.md, "Determinism and versions"). ``write`` generates them; ``check`` regenerates in
memory and compares bytes with the manifest and the files on disk. Ground truth is never written
here, and nothing is ever loaded with pickle (safetensors and JSON only).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from . import BENCHMARK_VERSION
from .tasks import LEVELS, Instance, families

CANONICAL_SEEDS = (0, 1)
DEFAULT_DIR = Path(__file__).resolve().parent / "artifacts"


def _json_safe(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def public_tensors(inst: Instance) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The instance's public tensors (``model.*`` weights, ``probe.*`` inputs) and its JSON probe values."""
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in inst.model.state_dict().items()}
    other: dict[str, Any] = {}
    for key, value in inst.probe.items():
        if isinstance(value, torch.Tensor):
            tensors[f"probe.{key}"] = value.detach().contiguous()
        else:
            other[key] = _json_safe(value)
    return tensors, other


def instance_files(inst: Instance) -> dict[str, bytes]:
    """The two files of one instance, as bytes: weights+probe tensors, and the public config."""
    tensors, other = public_tensors(inst)
    stem = f"{inst.task_id}/{inst.level}/seed{inst.seed}"
    config = {
        "task_id": inst.task_id,
        "level": inst.level,
        "seed": inst.seed,
        "family_version": inst.family_version,
        "config": _json_safe(inst.config),
        "probe": other,
        "prompt": inst.prompt,
        "answer_schema": inst.answer_schema,
    }
    return {
        f"{stem}.safetensors": save(tensors, metadata={"family_version": inst.family_version}),
        f"{stem}.json": (json.dumps(config, indent=1, sort_keys=True) + "\n").encode(),
    }


def canonical_instances() -> Iterator[Instance]:
    for fam in families():
        for level in LEVELS:
            for seed in CANONICAL_SEEDS:
                yield fam.generate(seed, level)


def n_canonical() -> int:
    return len(families()) * len(LEVELS) * len(CANONICAL_SEEDS)


def build_all(progress: bool = True) -> dict[str, bytes]:
    from tqdm import tqdm

    files: dict[str, bytes] = {}
    for inst in tqdm(canonical_instances(), total=n_canonical(), disable=not progress, desc="artifacts"):
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


def check(out_dir: Path = DEFAULT_DIR, progress: bool = True) -> list[str]:
    """Regenerate in memory; return every mismatch against the manifest and the files (empty = OK)."""
    problems: list[str] = []
    man_path = out_dir / "manifest.json"
    if not man_path.is_file():
        return [f"{man_path} is missing: run `mechsandbox gen-art` first"]
    recorded = json.loads(man_path.read_text())
    fresh = manifest(build_all(progress))
    for key in ("benchmark_version", "family_versions", "seeds"):
        if recorded.get(key) != fresh[key]:
            problems.append(f"manifest {key} is {recorded.get(key)!r}, regenerated {fresh[key]!r}")
    rec_files, new_files = recorded.get("files", {}), fresh["files"]
    for name in sorted(set(rec_files) | set(new_files)):
        if name not in new_files:
            problems.append(f"{name}: in the manifest but no longer generated")
        elif name not in rec_files:
            problems.append(f"{name}: generated but missing from the manifest")
        elif rec_files[name] != new_files[name]:
            problems.append(f"{name}: regenerated sha256 {new_files[name][:12]} != manifest {rec_files[name][:12]}")
        else:
            path = out_dir / name
            if not path.is_file():
                problems.append(f"{name}: listed in the manifest but the file is missing")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != new_files[name]:
                problems.append(f"{name}: file on disk differs from the regenerated bytes")
    return problems
