"""What runs inside a worker: the persistent namespace, snippet execution and answer conversion.

Why here and not in the server: compiling and running snippet code, and converting
``solution_from`` values, happen only in the hardened worker, so a hostile snippet or a snippet
object with a cunning ``__eq__`` never reaches the server's heap. The server receives plain JSON.

Errors are reported as ``line N: Type: message`` with the snippet's own line numbers, a capped
message and library paths scrubbed; the snippet's source text and library frames never appear.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any

import safetensors.torch

from ....arch import build_with, helper_namespace, split_public_tensors
from ..sealed import map_tensors
from .facade import Facade, make_import
from .policy import (
    REFUSED_BUILTINS,
    SNIPPET_FILENAME,
    OutputBuffer,
    OutputLimit,
    SandboxError,
    compile_snippet,
    hide_addresses,
    make_globals,
)
from .solution import AnswerError, to_json_answer

MAX_SOURCE = 64 * 1024


class SoftTimeout(BaseException):
    """Raised by the in-worker timer shortly before the server's hard kill."""


#: The worker's soft timer counts the process's CPU time (user + system, all threads: ITIMER_PROF), the same clock as
#: the server's hard limit, so a snippet slowed by a busy machine is not stopped for the machine's load (issue 52).
SOFT_TIMER, SOFT_SIGNAL = signal.ITIMER_PROF, signal.SIGPROF


def _scrub_paths(text: str) -> str:
    for prefix in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path[1:]}, key=len, reverse=True):
        if prefix and len(prefix) > 1:
            text = text.replace(prefix, "<lib>")
    return text


def format_error(exc: BaseException, cap: int) -> str:
    """``line 7 <- line 12: ValueError: message`` (innermost snippet line first)."""
    tb = traceback.walk_tb(exc.__traceback__)
    lines = [ln for f, ln in tb if f.f_code.co_filename == SNIPPET_FILENAME and ln is not None]
    where = " <- ".join(f"line {ln}" for ln in reversed(lines[-4:]))
    try:
        message = str(exc)
    except BaseException:
        # __str__ may run snippet code (a module's extra_repr): its failure, its OutputLimit, the soft timer still
        # armed around it, KeyboardInterrupt: a message, never a dead worker
        message = "<unprintable message>"
    refused = getattr(exc, "name", None) if type(exc) is NameError else None
    if type(refused) is str and refused in REFUSED_BUILTINS:
        message = f"name {refused!r} is refused in the sandbox: {REFUSED_BUILTINS[refused]}"
    text = _scrub_paths(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    text = hide_addresses(text)  # a default repr in the message (``ValueError(f)``, ``%R is not in list``)
    text = " ".join(text.encode("utf-8", "replace").decode("utf-8").split())
    text = f"{where}: {text}" if where else text
    return text if len(text) <= cap else text[: cap - 15] + " ... [truncated]"


class Runtime:
    """One session's namespace inside a worker."""

    def __init__(self, facades: dict[str, Facade], output_cap: int = 64 * 1024, error_cap: int = 2048):
        self.facades = facades
        self.import_hook = make_import(facades)
        self.output_cap = output_cap
        self.error_cap = error_cap
        self.buffer = OutputBuffer(output_cap)
        self.globals: dict[str, Any] | None = None
        self.pristine: tuple[Any, dict[str, Any]] | None = None
        self.model_fd: int | None = None  # the sealed model file a load came in (reset_model maps it again)

    def base_namespace(self) -> dict[str, Any]:
        f = self.facades
        return {
            "torch": f["torch"],
            "nn": f["torch.nn"],
            "F": f["torch.nn.functional"],
            "np": f["numpy"],
            "math": f["math"],
            "json": f["json"],
        }

    def load(self, header: dict[str, Any], blob: bytes, fd: int | None = None) -> None:
        """Build the public model and probe from an architecture record and safetensors bytes, or the sealed
        memory file ``fd`` holding them (kept open for ``reset_model``; mapped copy-on-write, not copied).

        The helper objects named in the header come from ``arch.HELPERS`` only (an unknown name is an
        error), so a payload can add ``utils`` to the namespace but never an arbitrary object."""
        if self.model_fd is not None:
            os.close(self.model_fd)
        self.model_fd = fd
        state, probe = split_public_tensors(map_tensors(fd) if fd is not None else safetensors.torch.load(blob))
        helpers = helper_namespace(header.get("helpers", []))
        self.pristine = (header["arch"], state)  # reset_model() builds from these; no snippet sees them
        self.install({"model": self.fresh_model(), **probe, **header.get("probe", {}), **helpers})

    def fresh_model(self) -> Any:
        """The model as loaded. From a memory file the weights are a fresh private mapping each time (the first
        call's is the one ``load`` made, kept in ``pristine`` until then): a snippet's writes stay in its own pages,
        nothing is copied up front."""
        arch, state = self.pristine
        if self.model_fd is None:  # copies: ``state`` stays pristine whatever a snippet does to the model
            model = build_with(arch, {name: tensor.clone() for name, tensor in state.items()})
        else:
            model = build_with(arch, state or split_public_tensors(map_tensors(self.model_fd))[0])
            self.pristine = (arch, {})  # later calls map the file again; keep no reference to a snippet's pages
        model.eval().requires_grad_(False)  # so W.numpy() works; p.requires_grad_(True) turns it back on
        return model

    def session_functions(self) -> dict[str, Any]:
        """Functions of the session itself, in every namespace: ``reset_model()`` binds ``model`` to a fresh
        copy of the pristine model (weights as loaded, no hooks, eval mode, no gradients) and keeps every other
        name; names that held the old model keep it. Plain closures: nothing public leads back to the runtime."""

        def reset_model() -> None:
            """Bind ``model`` to a fresh copy of the task's model: weight edits and hooks are undone; every other
            variable is kept (one that held the old model still holds it)."""
            if self.globals is None or self.pristine is None:
                raise RuntimeError("no model is loaded in this session")
            self.globals["model"] = self.fresh_model()

        return {"reset_model": reset_model}

    def install(self, namespace: dict[str, Any]) -> None:
        names = {**self.base_namespace(), **self.session_functions(), **namespace}
        self.globals = make_globals(names, lambda: self.buffer, self.import_hook)

    def run(self, source: str, soft_timeout: float | None = None) -> dict[str, Any]:
        """Run a snippet; after ``soft_timeout`` seconds of the worker's CPU time it stops with a ``TimeoutError``,
        the namespace kept (the server kills the worker at its limit, a little later). ``seconds`` in the reply is
        wall time, for the agent's information."""
        started = time.perf_counter()
        self.buffer = OutputBuffer(self.output_cap)
        error = self._execute(source, soft_timeout)
        return {
            "stdout": self.buffer.getvalue(),
            "error": error,
            "output_truncated": self.buffer.truncated,
            "seconds": round(time.perf_counter() - started, 6),
        }

    def _execute(self, source: str, soft_timeout: float | None) -> str | None:
        if self.globals is None:
            return "SandboxError: no model is loaded in this worker"
        if len(source.encode("utf-8", "replace")) > MAX_SOURCE:
            return f"SandboxError: the snippet is larger than {MAX_SOURCE} bytes"
        try:
            code = compile_snippet(source)
        except SandboxError as exc:
            return str(exc)
        except BaseException as exc:
            return f"SyntaxError: the snippet cannot be compiled ({type(exc).__name__})"
        out, err = sys.stdout, sys.stderr
        previous = signal.getsignal(SOFT_SIGNAL)
        try:
            sys.stdout = sys.stderr = self.buffer
            if soft_timeout:
                signal.signal(SOFT_SIGNAL, _raise_soft_timeout)
                signal.setitimer(SOFT_TIMER, soft_timeout)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = self._show_warning
                exec(code, self.globals)
        except OutputLimit as exc:
            return f"OutputLimit: {exc}"
        except SoftTimeout:
            return f"TimeoutError: the snippet used more than {soft_timeout:.1f} s of CPU time and was stopped"
        except BaseException as exc:
            return format_error(exc, self.error_cap)
        finally:
            signal.setitimer(SOFT_TIMER, 0)
            signal.signal(SOFT_SIGNAL, previous)
            sys.stdout, sys.stderr = out, err
        return None

    def _show_warning(
        self, message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        with contextlib.suppress(OutputLimit):
            self.buffer.write(f"{category.__name__}: {_scrub_paths(str(message))}\n")

    def solution(self, name: Any) -> dict[str, Any]:
        """Convert the namespace variable ``name`` into a bounded JSON answer."""
        if self.globals is None:
            return {"error": "no model is loaded in this worker"}
        if type(name) is not str or not name.isidentifier() or name.startswith("_"):
            return {"error": 'solution_from must be the name of a variable, e.g. "answer"'}
        if name not in self.globals or name in ("torch", "nn", "F", "np", "math", "json"):
            return {"error": f"no variable named {name!r} in the sandbox namespace"}
        try:
            return {"value": to_json_answer(self.globals[name])}
        except AnswerError as exc:
            return {"error": str(exc)}
        except BaseException as exc:
            return {"error": f"the value of {name!r} cannot be converted ({type(exc).__name__})"}


def _raise_soft_timeout(signum: int, frame: Any) -> None:
    raise SoftTimeout()
