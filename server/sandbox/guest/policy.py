"""The language layer: RestrictedPython compilation and the host guards a snippet runs under.

Why each piece exists (the layer table and its tests: docs/SANDBOX.md):
- ``SnippetTransformer`` extends RestrictedPython's transformer so that what agents naturally
  write compiles: augmented assignment to items and attributes (``W[:, 3] *= 0``, ``self.n += 1``)
  and ``super().__init__()`` inside a snippet-defined class. Everything else (underscore names,
  frame attributes, ``exec``/``eval``, star imports, ``except*``) stays refused at compile time.
- The guards are where the host decides what is reachable: ``guarded_getattr`` refuses
  underscore names, inspect attributes and a denylist of dangerous methods, raises (never returns
  None) on a missing attribute, and refuses to hand out modules, frames, code objects and a set of
  dangerous callables by identity. ``guarded_write`` lets tensors, arrays, modules, dicts, lists
  and snippet objects be written and wraps everything else (facades, classes, functions) read-only.
- Printing goes to one capped buffer per snippet; over the cap the snippet is stopped.

This module never touches files, sockets or processes; it is imported by the zygote and used only
inside a worker.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import marshal
import operator
import os
import pickle
import re
import secrets
import shutil
import socket
import string
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from RestrictedPython import RestrictingNodeTransformer, compile_restricted_exec, safe_builtins
from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence
from RestrictedPython.transformer import INSPECT_ATTRIBUTES, IOPERATOR_TO_STR, copy_locations
from torch import nn

from ....arch.tensors import is_plain_array_data
from .facade import (
    LAYOUT_MEMBER,
    LAYOUT_REASON,
    REFUSED_REASONS,
    SNIPPET_FILENAME,
    SNIPPET_MODULE,
    Facade,
    GuardedClass,
    array_data_only,
    unwrap_class,
)

#: Method and attribute names refused on every object (file I/O, pickle, raw memory, traversal).
DENIED_ATTRIBUTES = frozenset(
    [
        "tofile",
        "dump",
        "dumps",
        "load",
        "loads",
        "save",
        "from_file",
        "fromfile",
        "storage",
        "untyped_storage",
        "share_memory_",
        "share_memory",
        "data_ptr",
        "ctypes",
        "set_",
        "format_map",
        "mro",
        "obj",
        "setflags",
        "base",
        "with_traceback",
        "pin_memory",
        "byteswap",
        "as_strided",
        "as_strided_",
        "as_strided_scatter",
        "as_strided_copy",
        "new_empty_strided",
        "getfield",
        "setfield",
        "set_submodule",
        "tb_frame",
        "tb_next",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "ag_frame",
        "func_globals",
        "func_code",
        "im_func",
        "im_self",
        "tb_lasti",
        "getattr_static",
        "compile",  # nn.Module.compile: TorchDynamo rewrites bytecode and generates code
    ]
)

#: ndarray members refused on object arrays: their bytes are the items' addresses, and writes would put objects in
#: that ``astype(str)`` prints by their default repr (object arrays hold plain data only: ``ArrayWrites``).
OBJECT_ARRAY_DENIED = frozenset(["tobytes", "tostring", "fill", "put", "choose", "view"])

_INPLACE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "@=": operator.imatmul,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
}


class SandboxError(Exception):
    """A refusal by the policy, with a message meant for the agent."""


# --- no addresses ------------------------------------------------------------------------------
#
# Why: CPython's default reprs print an object's address (``<function f at 0x7f...>``, ``<built-in method add of Tensor
# object at 0x...>``, numpy's ``Generator(PCG64) at 0x...``), and so do C-made error messages (``%R is not in list``).
# With an address and any raw-memory primitive a snippet reads and writes the worker's heap. The reprs themselves
# are C code, so the text is cleaned where a snippet can obtain it: ``repr``/``str``/``ascii``/``format``/``hash``
# builtins, f-strings and ``%`` (rewritten at compile time), ``str.format``, printed output (``printed``, echo,
# warnings), attribute reads that give strings (exception ``args``), and the error line the agent sees.

ADDRESS = re.compile(r"0x[0-9a-fA-F]{7,}")
HIDDEN_ADDRESS = "0x..."


def hide_addresses(text: str) -> str:
    """``text`` with every hexadecimal number of seven or more digits (an address) replaced by ``0x...``."""
    return ADDRESS.sub(HIDDEN_ADDRESS, text) if "0x" in text or "0X" in text else text


def _hidden(value: Any) -> Any:
    """Strings (and tuples of strings, such as an exception's ``args``) without addresses; other values unchanged."""
    if isinstance(value, str):
        return hide_addresses(value)
    if type(value) is tuple and any(isinstance(v, str) for v in value):
        return tuple(hide_addresses(v) if isinstance(v, str) else v for v in value)
    return value


def safe_repr(obj: Any) -> str:
    return hide_addresses(repr(obj))


def safe_ascii(obj: Any) -> str:
    return hide_addresses(ascii(obj))


def safe_format(value: Any, spec: str = "") -> str:
    return hide_addresses(format(value, spec))


_CONVERSIONS: dict[int, Callable[[Any], str]] = {ord("s"): str, ord("r"): repr, ord("a"): ascii}


def format_value(value: Any, conversion: int, spec: str) -> str:
    """One ``{...}`` field of an f-string (the compiler rewrites each to this call)."""
    if conversion in _CONVERSIONS:
        value = _CONVERSIONS[conversion](value)
    return hide_addresses(format(value, spec))


def modulo(left: Any, right: Any) -> Any:
    """``left % right`` (the compiler rewrites every ``%`` to this call): printf-style text without addresses."""
    return _hidden(left % right) if isinstance(left, str | bytes) else left % right


class TextClass(GuardedClass):
    """``str`` in the sandbox: ``str(x)`` hides addresses; ``isinstance``, ``str.join``, subclassing and
    ``dtype=str`` work as before (``str.format`` stays refused: the unbound form walks attributes in C)."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return hide_addresses(str(*args, **kwargs))

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (str,)

    def __getattr__(self, attr: str) -> Any:
        if attr in ("format", "format_map"):
            raise AttributeError(f"str.{attr} is refused: write 'template'.{attr}(...) instead")
        return super().__getattr__(attr)

    @property
    def dtype(self) -> np.dtype:
        """What numpy reads when this stands for a dtype (``a.astype(str)``)."""
        return np.dtype(str)


SANDBOX_STR = TextClass(str, 0, "")


class OutputLimit(BaseException):
    """Raised by the print buffer at its cap; a BaseException so ``except Exception`` cannot swallow it."""


# --- compilation -------------------------------------------------------------------------------


class SnippetTransformer(RestrictingNodeTransformer):
    """RestrictedPython's policy plus augmented item/attribute assignment and ``super().__init__``."""

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if not isinstance(target, ast.Attribute | ast.Subscript):
            return super().visit_AugAssign(node)
        op = IOPERATOR_TO_STR[type(node.op)]
        if isinstance(target, ast.Attribute):
            if target.attr.startswith("_") or target.attr in INSPECT_ATTRIBUTES:
                self.error(node, f'"{target.attr}" is an invalid attribute name because it starts with "_"')
                return node
            args = [self.visit(target.value), ast.Constant(target.attr)]
            hook = "_inplace_attr_"
        else:
            args = [self.visit(target.value), self.visit(target.slice)]
            hook = "_inplace_item_"
        call = ast.Call(
            func=ast.Name(hook, ast.Load()),
            args=[*args, ast.Constant(op), self.visit(node.value)],
            keywords=[],
        )
        new = ast.Expr(call)
        copy_locations(new, node)
        ast.fix_missing_locations(new)
        return new

    def visit_Module(self, node: ast.Module) -> Any:
        """A bare expression as the snippet's last statement echoes its value, as a REPL or a notebook cell
        does (``cache["pattern", 0].shape`` on the last line shows the shape; ``None`` prints nothing). The
        call is added after the policy has checked the tree, so ``_echo_`` is the sandbox's name, never one a
        snippet can write (names starting with "_" are refused)."""
        node = super().visit_Module(node)
        if node.body and isinstance(node.body[-1], ast.Expr):
            last = node.body[-1]
            echo = ast.Expr(ast.Call(func=ast.Name("_echo_", ast.Load()), args=[last.value], keywords=[]))
            copy_locations(echo, last)
            ast.fix_missing_locations(echo)
            node.body[-1] = echo
        return node

    def visit_FormattedValue(self, node: ast.FormattedValue) -> Any:
        """``f'{x!r:>8}'`` -> ``f'{_format_value_(x, 114, '>8')}'``: the field's text without addresses."""
        node = super().visit_FormattedValue(node)
        spec = node.format_spec if node.format_spec is not None else ast.Constant("")
        args = [node.value, ast.Constant(node.conversion), spec]
        call = ast.Call(func=ast.Name("_format_value_", ast.Load()), args=args, keywords=[])
        new = ast.FormattedValue(value=call, conversion=-1, format_spec=None)
        copy_locations(new, node)
        ast.fix_missing_locations(new)
        return new

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        """``a % b`` -> ``_mod_(a, b)``: printf-style formatting of an object prints its default repr."""
        node = super().visit_BinOp(node)
        if not isinstance(node.op, ast.Mod):
            return node
        call = ast.Call(func=ast.Name("_mod_", ast.Load()), args=[node.left, node.right], keywords=[])
        copy_locations(call, node)
        ast.fix_missing_locations(call)
        return call

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        value = node.value
        if node.attr == "__name__" and isinstance(node.ctx, ast.Load):
            # ``type(e).__name__``, ``f.__name__``: a read that can only give a string (``_name_of_``)
            call = ast.Call(func=ast.Name("_name_of_", ast.Load()), args=[self.visit(value)], keywords=[])
            copy_locations(call, node)
            ast.fix_missing_locations(call)
            return call
        if (
            node.attr == "__init__"
            and isinstance(node.ctx, ast.Load)
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        ):
            call = ast.Call(func=ast.Name("_super_init_", ast.Load()), args=[self.visit(value)], keywords=[])
            copy_locations(call, node)
            ast.fix_missing_locations(call)
            return call
        return super().visit_Attribute(node)


def compile_snippet(source: str) -> types.CodeType:
    """Compile restricted; raise ``SandboxError`` with line numbers but never the source text."""
    try:
        tree = ast.parse(source, SNIPPET_FILENAME, "exec")
    except SyntaxError as exc:
        raise SandboxError(f"line {exc.lineno}: SyntaxError: {exc.msg}") from None
    except (MemoryError, RecursionError, ValueError) as exc:
        raise SandboxError(f"SyntaxError: the snippet cannot be parsed ({type(exc).__name__})") from None
    try:
        result = compile_restricted_exec(tree, filename=SNIPPET_FILENAME, policy=SnippetTransformer)
    except (MemoryError, RecursionError) as exc:
        raise SandboxError(f"SyntaxError: the snippet is too deeply nested ({type(exc).__name__})") from None
    if result.errors:
        shown = "; ".join(e.replace("Line ", "line ", 1) for e in result.errors[:5])
        raise SandboxError(f"refused by the sandbox policy: {shown}")
    return result.code


# --- value checks ------------------------------------------------------------------------------

_FORBIDDEN_TYPES = (types.ModuleType, types.FrameType, types.TracebackType, types.CodeType, memoryview)


def _dangerous_callables() -> set[int]:
    ids: set[int] = set()
    for name in (
        "open",
        "eval",
        "exec",
        "compile",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "__import__",
        "input",
        "breakpoint",
        "help",
        "type",
        "object",
        "memoryview",
        "dir",
    ):
        ids.add(id(getattr(builtins, name)))
    for module in (os, subprocess, pickle, marshal, shutil, socket, sys):
        for value in vars(module).values():
            if callable(value):
                ids.add(id(value))
    for owner, names in (
        (torch, "load save from_file frombuffer as_strided empty_strided compile"),
        (np, "load save savez savez_compressed savetxt loadtxt genfromtxt fromfile memmap fromregex"),
        (np.lib.stride_tricks, "as_strided"),
    ):
        for name in names.split():
            if hasattr(owner, name):
                ids.add(id(getattr(owner, name)))
    ids.add(id(torch.jit))
    return ids


_DANGEROUS_IDS = _dangerous_callables()


def check_value(value: Any) -> Any:
    """Refuse modules, frames, code objects and known dangerous callables as values."""
    if isinstance(value, _FORBIDDEN_TYPES) or id(value) in _DANGEROUS_IDS:
        raise SandboxError(f"a {type(value).__name__} object is not available in the sandbox")
    return value


def _type_name(obj: Any) -> str:
    return type(obj).__name__


def guarded_getattr(obj: Any, name: Any, *default: Any) -> Any:
    """``_getattr_`` and the ``getattr`` builtin."""
    if type(name) is not str:
        raise TypeError("attribute name must be a string")
    if name.startswith("_") or name in INSPECT_ATTRIBUTES:
        raise AttributeError(f"attribute {name!r} is not available in the sandbox (names starting with '_')")
    if name in ("format", "format_map"):
        if isinstance(obj, str):
            return _bound_format(obj) if name == "format" else _bound_format_map(obj)
        cls = unwrap_class(obj)
        if isinstance(cls, type) and issubclass(cls, str):  # str.format(template, ...) walks fields in C
            raise AttributeError(f"str.{name} is refused: write 'template'.{name}(...) instead")
    if name in DENIED_ATTRIBUTES and not isinstance(obj, Facade):  # a facade's members are an explicit allowlist
        reason = REFUSED_REASONS.get(name, "it can reach files, raw memory or the interpreter")
        raise AttributeError(f"attribute {name!r} is refused: {reason}")
    if LAYOUT_MEMBER.search(name) and _is_tensor_or_class(obj):
        raise AttributeError(f"attribute {name!r} is refused: {LAYOUT_REASON}")
    if name in OBJECT_ARRAY_DENIED and isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise AttributeError(f"attribute {name!r} of an object array is refused: its bytes are the items' addresses")
    try:
        value = getattr(obj, name)
    except AttributeError:
        if default:
            return default[0]
        if isinstance(obj, Facade):
            raise  # the facade's own message, already fresh
        raise AttributeError(f"{_type_name(obj)!r} object has no attribute {name!r}") from None
    if name == "new_tensor" and isinstance(obj, torch.Tensor):
        return array_data_only("Tensor.new_tensor", value)
    return _hidden(check_value(value))


def _is_tensor_or_class(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) or (isinstance(obj, type) and issubclass(obj, torch.Tensor))


def guarded_hasattr(obj: Any, name: Any) -> bool:
    try:
        guarded_getattr(obj, name)
    except (AttributeError, SandboxError):
        return False
    return True


def guarded_getitem(obj: Any, key: Any) -> Any:
    return check_value(obj[key])


def guarded_getiter(obj: Any) -> Iterator[Any]:
    iterator = iter(obj)
    if type(obj) in (range, str, torch.Size):
        return iterator  # can only yield numbers or strings
    return (check_value(v) for v in iterator)


def guarded_sorted(iterable: Any, *, key: Any = None, reverse: bool = False) -> list[Any]:
    return sorted(guarded_getiter(iterable), key=key, reverse=reverse)


def guarded_zip(*iterables: Any, strict: bool = False) -> Iterator[tuple[Any, ...]]:
    return zip(*(guarded_getiter(i) for i in iterables), strict=strict)


# --- writes ------------------------------------------------------------------------------------


class ReadOnly:
    """What ``_write_`` returns for objects a snippet may not modify."""

    __slots__ = ("_label",)

    def __init__(self, obj: Any):
        object.__setattr__(self, "_label", _describe(obj))

    def _refuse(self, *args: Any) -> None:
        raise TypeError(f"{self._label} is read-only in the sandbox")

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _refuse


class ArrayWrites:
    """Item writes on an ndarray; attribute writes only for ``shape`` (never strides, data or dtype)."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray):
        object.__setattr__(self, "_array", array)

    def __setitem__(self, key: Any, value: Any) -> None:
        if not is_plain_array_data(value):  # numpy honours interface protocols on the value
            raise TypeError(
                f"an ndarray item cannot be set to a {type(value).__name__!r}: use a number, an array, a tensor or a "
                "plain list"
            )
        self._array[key] = value

    def __delitem__(self, key: Any) -> None:
        raise TypeError("cannot delete items of an ndarray")

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "shape":
            raise TypeError(f"ndarray attribute {name!r} is read-only in the sandbox")
        self._array.shape = value


_TENSOR_READONLY_ATTRS = frozenset({"grad_fn", "layout", "names"})


class TensorWrites:
    """Item and ordinary attribute writes on a tensor (``W[:, 3] = 0``, ``p.data = ...``)."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor: torch.Tensor):
        object.__setattr__(self, "_tensor", tensor)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._tensor[key] = value

    def __delitem__(self, key: Any) -> None:
        raise TypeError("cannot delete items of a tensor")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _TENSOR_READONLY_ATTRS:
            raise TypeError(f"tensor attribute {name!r} is read-only in the sandbox")
        setattr(self._tensor, name, value)


def _describe(obj: Any) -> str:
    if isinstance(obj, Facade):
        return repr(obj)
    if isinstance(obj, type):
        return f"class {obj.__name__!r}"
    return f"a {type(obj).__name__!r} object"


def is_snippet_object(obj: Any) -> bool:
    """An instance of a class the snippet defined itself (its classes get ``__module__ == 'sandbox'``)."""
    cls = type(obj)
    return getattr(cls, "__module__", None) == SNIPPET_MODULE and not isinstance(obj, type)


def guarded_write(obj: Any) -> Any:
    if isinstance(obj, dict | list | nn.Module) and not isinstance(obj, type):
        return obj
    if isinstance(obj, torch.Tensor):
        return TensorWrites(obj)
    if isinstance(obj, np.ndarray):
        return ArrayWrites(obj)
    if is_snippet_object(obj):
        return obj
    return ReadOnly(obj)


def _inplace(op: str, x: Any, y: Any) -> Any:
    return modulo(x, y) if op == "%=" else _INPLACE_OPS[op](x, y)


def inplace_var(op: str, x: Any, y: Any) -> Any:
    return _inplace(op, x, y)


def inplace_item(obj: Any, key: Any, op: str, value: Any) -> None:
    guarded_write(obj)[key] = _inplace(op, guarded_getitem(obj, key), value)


def inplace_attr(obj: Any, name: str, op: str, value: Any) -> None:
    setattr(guarded_write(obj), name, _inplace(op, guarded_getattr(obj, name), value))


def guarded_setattr(obj: Any, name: Any, value: Any) -> None:
    if type(name) is not str or name.startswith("_"):
        raise AttributeError(f"attribute {name!r} cannot be set in the sandbox")
    setattr(guarded_write(obj), name, value)


def guarded_delattr(obj: Any, name: Any) -> None:
    if type(name) is not str or name.startswith("_"):
        raise AttributeError(f"attribute {name!r} cannot be deleted in the sandbox")
    delattr(guarded_write(obj), name)


def super_init(proxy: Any) -> Any:
    if not isinstance(proxy, super):
        raise SandboxError("only super().__init__ is available in the sandbox")
    return proxy.__init__


# --- formatting, printing, introspection --------------------------------------------------------


class SafeFormatter(string.Formatter):
    """``str.format`` without attribute or index traversal inside replacement fields."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        if "." in field_name or "[" in field_name:
            raise SandboxError("attribute and index lookups inside format fields are not available in the sandbox")
        return super().get_field(field_name, args, kwargs)

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        return hide_addresses(super().vformat(format_string, args, kwargs))


_FORMATTER = SafeFormatter()


def _bound_format(template: str) -> Callable[..., str]:
    def format(*args: Any, **kwargs: Any) -> str:
        return _FORMATTER.vformat(template, args, kwargs)

    return format


def _bound_format_map(template: str) -> Callable[[Any], str]:
    def format_map(mapping: Any) -> str:
        return _FORMATTER.vformat(template, (), mapping)

    return format_map


class OutputBuffer:
    """The snippet's stdout: everything printed, warnings included, up to ``cap`` bytes."""

    def __init__(self, cap: int):
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            text = str(text)
        text = hide_addresses(text)
        room = self.cap - self.size
        data = text.encode("utf-8", "replace")  # lone surrogates become '?': the output must be valid UTF-8
        text = data.decode("utf-8")
        if len(data) > room:
            self.parts.append(data[: max(room, 0)].decode("utf-8", "ignore"))
            self.size = self.cap
            self.truncated = True
            raise OutputLimit(f"output limit of {self.cap} bytes reached; the snippet was stopped")
        self.parts.append(text)
        self.size += len(data)
        return len(text)

    def flush(self) -> None:
        return None

    def getvalue(self) -> str:
        return "".join(self.parts)


class PrintHook:
    """What RestrictedPython's ``_print_`` factory returns; every scope writes to the same buffer."""

    def __init__(self, buffer: OutputBuffer):
        self.buffer = buffer

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        kwargs.pop("file", None)
        print(*objects, file=self.buffer, **kwargs)

    def __call__(self) -> str:
        return self.buffer.getvalue()


#: Builtins a snippet does not get, with the reason its NameError gives (runtime.format_error).
REFUSED_BUILTINS: dict[str, str] = {
    "object": "the base class reaches every class in the process (object.__subclasses__); "
    "for an object array write dtype='O'",
    "open": "files are not available in the sandbox",
    "eval": "code is run only as snippets",
    "exec": "code is run only as snippets",
    "compile": "code is run only as snippets",
    "vars": "use dir(x) or globals()",
    "locals": "use dir() or globals()",
    "memoryview": "raw memory is not available in the sandbox",
    "input": "there is no console; print instead",
    "breakpoint": "there is no debugger; print instead",
}

ECHO_CAP = 4000  # characters of an echoed value's repr (the output cap still bounds the whole step)


def echo(buffer: OutputBuffer, value: Any) -> None:
    """What a bare last expression prints: its repr, cut at ``ECHO_CAP`` characters; nothing for ``None``.
    ``repr`` runs the same code ``print(repr(x))`` would, so this reaches nothing a snippet could not."""
    if value is None:
        return
    text = repr(value)
    if len(text) > ECHO_CAP:
        text = f"{text[:ECHO_CAP]}... ({len(text) - ECHO_CAP} more characters)"
    buffer.write(text + "\n")


class TypeView:
    """``type(x)`` in the sandbox: prints, compares and works in ``isinstance``; exposes no class."""

    __slots__ = ("_cls",)

    def __init__(self, cls: type):
        object.__setattr__(self, "_cls", cls)

    @property
    def name(self) -> str:
        return self._cls.__name__

    def __repr__(self) -> str:
        return repr(self._cls)

    def __eq__(self, other: Any) -> bool:
        return self._cls is (other._cls if isinstance(other, TypeView) else unwrap_class(other))

    def __hash__(self) -> int:
        return hash(self._cls)

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self._cls)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("type views are read-only")


def sandbox_type(obj: Any, *rest: Any) -> TypeView:
    if rest:
        raise SandboxError("type() with three arguments is not available; use a class statement")
    return TypeView(type(obj))


def name_of(obj: Any) -> str:
    """``x.__name__`` in a snippet: the name of a type view, facade, function or class, and only ever a string
    (the one dunder read the policy lets through, rewritten to this call at compile time)."""
    if isinstance(obj, TypeView):
        return obj.name
    if isinstance(obj, Facade):
        return object.__getattribute__(obj, "_name")
    name = getattr(unwrap_class(obj), "__name__", None)
    if type(name) is not str:
        raise AttributeError(f"{_describe(obj)} has no __name__")
    return name


def own_names(g: dict[str, Any]) -> list[str]:
    """The names a snippet sees in its namespace (its own variables and the task's), without the guards."""
    return sorted(n for n in g if not n.startswith("_"))


def make_dir(g: dict[str, Any]) -> Callable[..., list[str]]:
    def sandbox_dir(*args: Any) -> list[str]:
        """``dir(x)``: what the policy lets through on x; ``dir()``: the namespace's names."""
        if not args:
            return own_names(g)
        if len(args) > 1:
            raise TypeError(f"dir expected at most 1 argument, got {len(args)}")
        (obj,) = args
        if isinstance(obj, Facade):
            return obj.member_names
        layout = _is_tensor_or_class(obj)
        return sorted(
            n
            for n in dir(obj)
            if not n.startswith("_") and n not in DENIED_ATTRIBUTES and not (layout and LAYOUT_MEMBER.search(n))
        )

    return sandbox_dir


def make_globals_view(g: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    def sandbox_globals() -> dict[str, Any]:
        """A copy of the namespace's names and values (guards left out): writing into it changes nothing."""
        return {n: g[n] for n in own_names(g)}

    return sandbox_globals


HELP_CAP = 4096


def _signature(obj: Any) -> str:
    obj = inspect.unwrap(obj)  # the library function behind a facade's checking wrapper
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return str(name)


def make_help(buffer_ref: Callable[[], OutputBuffer]) -> Callable[[Any], None]:
    def help(obj: Any = None) -> None:
        buffer = buffer_ref()
        if obj is None:
            buffer.write("help(x) prints the docstring of x; dir(x) lists what the sandbox allows on x.\n")
            return
        if isinstance(obj, Facade):
            text = f"{obj!r}: {', '.join(obj.member_names)}"
        else:
            text = _signature(obj) + "\n" + (inspect.getdoc(obj) or f"(no docstring for {_describe(obj)})")
        if len(text) > HELP_CAP:
            text = text[:HELP_CAP] + " ... [help truncated]"
        buffer.write(text + "\n")

    return help


def _keyed(number: int, key: bytes) -> int:
    digest = hashlib.blake2b((number & (2**64 - 1)).to_bytes(8, "little"), key=key, digest_size=7).digest()
    return int.from_bytes(digest, "little")


def make_id() -> Callable[[Any], int]:
    """``id`` without addresses: a keyed hash of the address, stable within the worker."""
    key = secrets.token_bytes(16)

    def id_(obj: Any) -> int:
        return _keyed(builtins.id(obj), key)

    return id_


def make_hash() -> Callable[[Any], int]:
    """``hash`` without addresses: objects without ``__eq__`` hash by address (``hash(f)`` is the address shifted by
    4 bits), so every hash is keyed; equal objects keep equal hashes."""
    key = secrets.token_bytes(16)

    def hash_(obj: Any) -> int:
        return _keyed(builtins.hash(obj), key)

    return hash_


_EXTRA_BUILTINS = (
    "list dict set frozenset enumerate min max sum any all map filter reversed tuple iter next round abs "
    "divmod pow bytes property staticmethod classmethod super format NotImplemented Ellipsis "
    "ArithmeticError LookupError StopIteration"
)


def make_builtins(
    buffer_ref: Callable[[], OutputBuffer], import_hook: Callable[..., Any], namespace: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The snippet's builtins; ``dir()`` and ``globals()`` list ``namespace`` (the exec globals)."""
    namespace = {} if namespace is None else namespace
    b = dict(safe_builtins)
    for name in _EXTRA_BUILTINS.split():
        b[name] = getattr(builtins, name)
    b.update(
        sorted=guarded_sorted,
        zip=guarded_zip,
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        setattr=guarded_setattr,
        delattr=guarded_delattr,
        type=sandbox_type,
        dir=make_dir(namespace),
        globals=make_globals_view(namespace),
        help=make_help(buffer_ref),
        id=make_id(),
        hash=make_hash(),
        repr=safe_repr,
        ascii=safe_ascii,
        format=safe_format,
        str=SANDBOX_STR,
        __import__=import_hook,
    )
    return b


def make_globals(
    namespace: dict[str, Any], buffer_ref: Callable[[], OutputBuffer], import_hook: Callable[..., Any]
) -> dict[str, Any]:
    """The persistent exec globals of one worker: guards, builtins and the public namespace."""
    g: dict[str, Any] = {}
    g.update({
        "__builtins__": make_builtins(buffer_ref, import_hook, g),
        "__name__": SNIPPET_MODULE,
        "__metaclass__": type,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": guarded_getiter,
        "_write_": guarded_write,
        "_inplacevar_": inplace_var,
        "_inplace_item_": inplace_item,
        "_inplace_attr_": inplace_attr,
        "_super_init_": super_init,
        "_apply_": lambda f, *a, **k: f(*a, **k),
        "_unpack_sequence_": guarded_unpack_sequence,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_print_": lambda _getattr=None: PrintHook(buffer_ref()),
        "_echo_": lambda value: echo(buffer_ref(), value),
        "_name_of_": name_of,
        "_format_value_": format_value,
        "_mod_": modulo,
    })  # fmt: skip
    g.update(namespace)
    return g
