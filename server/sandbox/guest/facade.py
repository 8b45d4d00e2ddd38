"""Read-only module facades: the only "modules" a snippet ever sees.

Why: a real ``torch`` or ``numpy`` module object re-exports ``os``, ``sys``, ``ctypes``, ``pickle``
and the whole package from every submodule (``torch.fft.torch.os``, ``np.f2py.subprocess``), and
``from torch import os`` never passes through the attribute guard. So each module a snippet may use
is replaced by a ``Facade``: a slotted namespace over an explicit allow-list of members, which
raises a fresh ``AttributeError`` (no ``.obj``) for everything else and refuses every write. The
allow-lists are explicit (never "``dir(module)`` minus a denylist"); the few patterns subtracted from
torch's ATen op list remove file, storage, pointer, quantisation and global-state entry points that
ship in the same C table as the maths.

The import hook maps ``import x``, ``import x.y as z`` and ``from x import y`` onto the same
facades. Imports that torch and numpy make from C while a snippet runs (``PyImport_Import`` uses the
calling frame's ``__import__``) pass a ``list`` as ``fromlist``; the statement form passes a tuple or
None, so the two are told apart and library-internal imports keep working.
"""

from __future__ import annotations

import builtins
import collections
import copy
import functools
import heapq
import itertools
import json
import math
import random
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import einops
import numpy as np
import torch
import torch.autograd.functional
import torch.fft
import torch.functional
import torch.linalg
import torch.nn.functional
import torch.nn.init
import torch.optim
import torch.special
from torch import nn

from ....arch import utils
from ....arch.hooked import eigvals_checked
from ....arch.tensors import is_plain_array_data

#: Members refused on purpose, with the reason shown to the agent.
REFUSED_REASONS: dict[str, str] = {}


def _refuse(reason: str, names: str) -> None:
    for name in names.split():
        REFUSED_REASONS[name] = reason


_refuse(
    "file and pickle I/O are not available in the sandbox",
    "load save from_file frombuffer fromfile tofile dump dumps loads memmap open_memmap loadtxt savetxt "
    "genfromtxt fromregex savez savez_compressed DataSource serialization hub package",
)
_refuse(
    "TorchScript, compilers and code generation are not available in the sandbox",
    "jit compile fx export CompilationUnit import_ir_module cpp_extension library ops classes cond while_loop "
    "compiler f2py ctypeslib testing",
)
_refuse(
    "storages and raw memory are not available in the sandbox",
    "as_strided as_strided_ empty_strided storage untyped_storage UntypedStorage TypedStorage data_ptr "
    "ctypes stride_tricks lib set_",
)
_refuse(
    "processes and threads are not available in the sandbox",
    "multiprocessing fork wait distributed utils",
)
_refuse(
    "global settings are fixed in the sandbox",
    "set_num_threads set_default_dtype set_printoptions set_grad_enabled set_default_device "
    "use_deterministic_algorithms set_flush_denormal seterr set_string_function",
)
_refuse("system modules are not available in the sandbox", "os sys subprocess builtins importlib inspect platform")
_refuse(
    "helpers that copy attributes by name are not available in the sandbox; set __name__-like fields by hand",
    "update_wrapper WRAPPER_ASSIGNMENTS WRAPPER_UPDATES attrgetter methodcaller",
)
#: Why non-strided layouts are refused (the policy refuses tensor members that match ``LAYOUT_MEMBER``).
LAYOUT_REASON = (
    "sparse, quantized, nested and mkldnn layouts are not available in the sandbox: their index and offset tensors "
    "are raw memory (an edited index writes out of bounds); use dense tensors"
)
#: Tensor members that make or read non-strided layouts: ``to_sparse*``, ``sparse_mask``, ``to_mkldnn``,
#: ``quantize*``/``dequantize``/``int_repr``/``q_*``, ``to_padded_tensor``, ``indices``/``values`` and the compressed
#: index accessors (which on a sparse tensor hand out its raw index storage), ``coalesce``.
LAYOUT_MEMBER = re.compile(
    r"sparse|mkldnn|quantiz|^q_|^int_repr$|nested|padded|^(indices|values|crow_indices|col_indices|ccol_indices|"
    r"row_indices|coalesce|is_coalesced)$"
)

#: ``__module__`` of every class and function a snippet defines (the exec globals' ``__name__``).
SNIPPET_MODULE = "sandbox"
#: The file name a snippet's code objects carry (so its frames are told apart from library frames).
SNIPPET_FILENAME = "<snippet>"


# --- no attribute by data ----------------------------------------------------------------------
#
# Why: a registry that turns a string into an attribute lets a snippet plant names the policy refuses to write:
# ``nn.ParameterDict()["__array_interface__"] = {...}`` became an instance attribute that ``np.asarray`` honoured
# (raw reads and writes of the worker's memory), and ``pd["__class__"]`` read one. Every such path in torch ends in one
# of the methods below (``ModuleDict``, ``Sequential(OrderedDict)`` and ``register_module`` go through ``add_module``;
# every ``ParameterDict`` access through ``_key_to_attr``), so they refuse names with a part starting with "_" while a
# snippet is on the stack; outside a snippet (the library's own underscore buffers) nothing changes.
# tests/test_sandbox_class_audit.py finds these paths by trying every reachable class with dunder keys.

#: ``nn.Module`` methods whose first argument names an attribute, module, parameter or buffer.
NAME_TAKING_MODULE_METHODS = (
    "add_module",
    "register_module",
    "register_buffer",
    "register_parameter",
    "get_submodule",
    "get_parameter",
    "get_buffer",
)


def snippet_on_stack() -> bool:
    """Whether a snippet's frame is among the callers (the name came, directly or through a library, from one)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == SNIPPET_FILENAME:
            return True
        frame = frame.f_back
    return False


def check_attribute_name(name: Any, where: str) -> None:
    """Refuse a name given as data that has a dotted part starting with "_" when it comes from a snippet."""
    if type(name) is str and any(part.startswith("_") for part in name.split(".")) and snippet_on_stack():
        raise KeyError(f"{where}: names starting with '_' are refused in the sandbox (they would be attributes)")


def _name_checked(method: Callable[..., Any], where: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def checked(self: Any, name: Any, *args: Any, **kwargs: Any) -> Any:
        check_attribute_name(name, where)
        return method(self, name, *args, **kwargs)

    checked.sandbox_name_guard = True  # type: ignore[attr-defined]
    return checked


#: Every torch method that turns a string into a module attribute or table entry, or reads one by a string.
#: ``ParameterDict.__setitem__`` is checked before ``_key_to_attr`` only so that a refused key leaves no trace in
#: the dict's key list.
NAME_GUARDED: tuple[tuple[type, str], ...] = (
    *((nn.Module, name) for name in NAME_TAKING_MODULE_METHODS),
    (nn.ParameterDict, "__setitem__"),
    (nn.ParameterDict, "_key_to_attr"),
)


def install_name_guards() -> None:
    """Put the name check in front of each ``NAME_GUARDED`` method (idempotent)."""
    for owner, name in NAME_GUARDED:
        method = owner.__dict__[name]
        if not getattr(method, "sandbox_name_guard", False):
            setattr(owner, name, _name_checked(method, f"{owner.__name__}.{name}"))


def sandbox_namedtuple(typename: str, field_names: Any, **kwargs: Any) -> type:
    """``collections.namedtuple`` without ``module=`` (it sets the class's ``__module__`` by data; the value
    ``'sandbox'`` would make a library class pass for a snippet's own)."""
    if "module" in kwargs:
        raise TypeError("collections.namedtuple(module=...) is refused: it sets __module__ by name")
    return collections.namedtuple(typename, field_names, **kwargs)


# --- no interface protocols on sandbox objects -------------------------------------------------
#
# Why: numpy honours ``__array_interface__``/``__array_struct__``/``__array__``/the buffer protocol and torch
# ``__dlpack__``/``__cuda_array_interface__`` on *any* argument, so an object that answers one with a chosen address
# is an array over any memory. Every numpy facade function and ufunc, ``torch.tensor``/``as_tensor``/``from_numpy``,
# ``Tensor.new_tensor`` and ``utils.to_numpy`` take array data only as tensors, ndarrays, numbers, strings and plain
# nested lists/tuples of them (``arch.tensors.is_plain_array_data``); other arguments may be dtypes, slices and the
# numpy random state objects. Anything else is refused before the library sees it.

_PLAIN_TYPES = (int, float, complex, bool, str, bytes)
_RANDOM_STATE = (np.random.BitGenerator, np.random.SeedSequence, np.random.Generator)


def _argument(owner: str, value: Any) -> Any:
    """``value`` as the library may take it: plain data, a dtype, a slice, random state; else a TypeError."""
    if is_plain_array_data(value):
        return value
    value = unwrap_class(value)
    if isinstance(value, type) and (issubclass(value, np.generic) or value in _PLAIN_TYPES):
        return value
    if isinstance(value, (np.dtype, torch.dtype, torch.device, slice, *_RANDOM_STATE)) or value is Ellipsis:
        return value
    raise TypeError(
        f"{owner}(...) is refused: an argument of type {type(value).__name__!r} is not a tensor, an array, a number or "
        "a plain list/tuple of them (other objects could answer __array_interface__ and the like)"
    )


def _plain_items(owner: str, iterable: Any) -> Iterator[Any]:
    for item in iterable:
        yield _argument(owner, item)


def array_data_only(owner: str, fn: Callable[..., Any], first: str = "data") -> Callable[..., Any]:
    """``fn`` with every argument checked by ``_argument``. ``first``: what the first positional argument may be
    besides data: ``"function"`` (``np.fromfunction``) or ``"iterable"`` (``np.fromiter``: its items are checked)."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if args and first != "data":
            head = args[0]
            if first == "function" and callable(head) and not isinstance(head, type):
                pass
            elif first == "iterable" and not is_plain_array_data(head):
                head = _plain_items(owner, iter(head))
            else:
                head = _argument(owner, head)
            args = (head, *(_argument(owner, a) for a in args[1:]))
        else:
            args = tuple([_argument(owner, a) for a in args])
        if kwargs:
            kwargs = {k: _argument(owner, v) for k, v in kwargs.items()}
        return fn(*args, **kwargs)

    return checked


class CheckedUfunc:
    """A numpy ufunc whose calls and methods (``reduce``, ``accumulate``, ``outer``, ``at``, ``reduceat``) take checked
    arguments; its other public attributes (``nin``, ``identity``, ...) are the ufunc's."""

    __slots__ = ("_call", "_owner", "_ufunc")

    def __init__(self, owner: str, ufunc: np.ufunc):
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_ufunc", ufunc)
        object.__setattr__(self, "_call", array_data_only(owner, ufunc))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(f"attribute {attr!r} is not available in the sandbox")
        value = getattr(self._ufunc, attr)
        return array_data_only(f"{self._owner}.{attr}", value) if callable(value) else value

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"{self._owner} is read-only in the sandbox")

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return self._ufunc.__name__

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self._ufunc.__doc__

    @property
    def __wrapped__(self) -> np.ufunc:
        """For ``inspect`` (``help``, the member audit); a snippet cannot read underscore names."""
        return self._ufunc

    def __repr__(self) -> str:
        return repr(self._ufunc)


def _numpy_checked(owner: str, members: dict[str, Any]) -> dict[str, Any]:
    """Every numpy function and ufunc in ``members`` behind the argument check; classes and constants unchanged."""
    firsts = {"fromfunction": "function", "fromiter": "iterable"}
    out: dict[str, Any] = {}
    for name, value in members.items():
        if isinstance(value, np.ufunc):
            out[name] = CheckedUfunc(f"{owner}.{name}", value)
        elif callable(value) and not isinstance(value, type | GuardedClass):
            out[name] = array_data_only(f"{owner}.{name}", value, firsts.get(name, "data"))
        else:
            out[name] = value
    return out


# --- guarded callables -------------------------------------------------------------------------
#
# Why: a library callable that takes an attribute name, a raw buffer, an offset or strides as plain
# data does the attribute access or the pointer arithmetic in library code, where no guard runs
# (``functools.wraps(f, updated=("__globals__",))`` merged a library module's globals into the
# snippet's; ``np.ndarray(shape, dtype, buffer, offset=-8)`` read the heap below an array). Each such
# member is either left out of its facade or replaced by a wrapper that accepts only the safe subset
# of its parameters. tests/test_sandbox_layers.py walks every facade member's signature to keep it so.


def _is_snippet_defined(obj: Any) -> bool:
    return getattr(obj, "__module__", None) == SNIPPET_MODULE


def sandbox_wraps(wrapped: Any) -> Any:
    """``functools.wraps`` for snippet functions: copies the name, qualname and docstring strings only."""

    def decorate(wrapper: Any) -> Any:
        if not _is_snippet_defined(wrapper) or isinstance(wrapper, type):
            raise TypeError("functools.wraps is refused: it may only decorate a function the snippet defines")
        for field in ("__name__", "__qualname__", "__doc__"):
            value = getattr(wrapped, field, None)
            if type(value) is str:
                setattr(wrapper, field, value)
        return wrapper

    return decorate


def sandbox_total_ordering(cls: Any) -> Any:
    """``functools.total_ordering`` for classes the snippet defines (it writes methods onto ``cls``)."""
    if not isinstance(cls, type) or not _is_snippet_defined(cls):
        raise TypeError("functools.total_ordering is refused: it may only decorate a class the snippet defines")
    return functools.total_ordering(cls)


def sandbox_deepcopy(x: Any) -> Any:
    """``copy.deepcopy`` without ``memo``: a memo keyed by real addresses leaks them and swaps objects in."""
    return copy.deepcopy(x)


def _no_cls(name: str, kwargs: dict[str, Any]) -> None:
    if "cls" in kwargs:
        raise TypeError(f"json.{name}(cls=...) is refused: pass default= or object_hook= functions instead")


def sandbox_json_dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` without ``cls`` (an arbitrary class whose ``encode`` method runs unguarded)."""
    _no_cls("dumps", kwargs)
    return json.dumps(obj, **kwargs)


def sandbox_json_loads(s: Any, **kwargs: Any) -> Any:
    """``json.loads`` without ``cls``; the hooks are called with parsed data, as a snippet could itself."""
    _no_cls("loads", kwargs)
    return json.loads(s, **kwargs)


class GuardedClass:
    """A library class whose constructor takes raw memory arguments: calls are checked, the rest forwards.

    ``isinstance(x, np.ndarray)``, ``issubclass`` and public class attributes (``np.ndarray.sum``) keep
    working; the class object itself is never handed out.
    """

    __slots__ = ("_allowed", "_cls", "_reason")

    def __init__(self, cls: type, allowed: int, reason: str):
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_reason", reason)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > self._allowed or set(kwargs) - {"shape", "dtype", "order"}:
            raise TypeError(f"{self._cls.__module__}.{self._cls.__name__}(...) is refused: {self._reason}")
        return self._cls(*args, **kwargs)

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self._cls)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # A snippet subclass would inherit the unchecked constructor, so there is none.
        raise TypeError(f"subclassing {self._cls.__module__}.{self._cls.__name__} is not available in the sandbox")

    def __subclasscheck__(self, cls: Any) -> bool:
        return issubclass(cls, self._cls)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(f"attribute {attr!r} is not available in the sandbox") from None
        return getattr(self._cls, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"{self._cls.__name__} is read-only in the sandbox")

    def __eq__(self, other: Any) -> Any:
        return unwrap_class(other) is self._cls or NotImplemented  # NotImplemented: let TypeView answer

    def __hash__(self) -> int:
        return hash(self._cls)

    def __repr__(self) -> str:
        return repr(self._cls)


def unwrap_class(obj: Any) -> Any:
    """The class a ``GuardedClass`` stands for (anything else unchanged)."""
    return object.__getattribute__(obj, "_cls") if isinstance(obj, GuardedClass) else obj


#: ``np.ndarray(shape, dtype, buffer, offset, strides)``: only ``shape``, ``dtype`` and ``order``.
SANDBOX_NDARRAY = GuardedClass(
    np.ndarray, 2, "buffer, offset and strides are raw memory; use np.zeros, np.empty or np.asarray"
)


class Facade:
    """A read-only namespace standing in for a module."""

    __slots__ = ("_members", "_name")

    def __init__(self, name: str, members: dict[str, Any]):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_members", dict(members))

    def __getattr__(self, attr: str) -> Any:
        members = object.__getattribute__(self, "_members")
        if attr in members:
            return members[attr]
        name = object.__getattribute__(self, "_name")
        reason = REFUSED_REASONS.get(attr)
        if reason:
            raise AttributeError(f"{name}.{attr} is refused: {reason}") from None
        raise AttributeError(f"{name}.{attr} is not available in the sandbox") from None

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"{self._name} is read-only in the sandbox")

    def __delattr__(self, attr: str) -> None:
        raise TypeError(f"{self._name} is read-only in the sandbox")

    def __dir__(self) -> list[str]:
        return sorted(self._members)

    def __repr__(self) -> str:
        return f"<sandbox module {self._name!r}>"

    @property
    def member_names(self) -> list[str]:
        return sorted(self._members)


def _pick(module: Any, names: Iterable[str]) -> dict[str, Any]:
    """The named members of ``module``; a name the installed version lacks is skipped."""
    return {n: getattr(module, n) for n in names if hasattr(module, n)}


def _words(text: str) -> list[str]:
    return text.split()


# --- torch -------------------------------------------------------------------------------------

_TORCH_OP_REFUSED = re.compile(
    r"^(as_strided|empty_strided|from_file|frombuffer|asarray|fork|wait|cond|while_loop|import_ir_module|"
    r"get_file_path|resize_as_sparse_|dequantize|pin_memory|is_vulkan_available|cudnn_|miopen_|mkldnn_|fbgemm_|"
    r"set_|sym_|segment_reduce)|dlpack|quantiz|autocast|sparse|storage|share_memory|_jit"
)

_TORCH_EXTRA = _words(
    """
    Tensor Size dtype device finfo iinfo Generator tensor as_tensor from_numpy is_tensor is_floating_point
    is_complex numel manual_seed seed initial_seed no_grad enable_grad inference_mode is_grad_enabled
    get_default_dtype broadcast_shapes einsum
    float float16 float32 float64 half double bfloat16 complex64 complex128 cfloat cdouble
    int int8 int16 int32 int64 short long uint8 bool
    inf nan pi e newaxis
    """
)


def torch_op_names() -> list[str]:
    """Public ATen tensor ops plus ``torch.functional.__all__``, minus the refused patterns."""
    ops = {n for n in dir(torch._C._VariableFunctions) if not n.startswith("_")}
    ops |= set(torch.functional.__all__)
    return sorted(n for n in ops if hasattr(torch, n) and not _TORCH_OP_REFUSED.search(n))


_NN_LAYERS = _words(
    """
    Module Sequential ModuleList ModuleDict Parameter ParameterList ParameterDict Linear Bilinear Identity
    Embedding EmbeddingBag LayerNorm RMSNorm BatchNorm1d GroupNorm Dropout Flatten Unflatten Conv1d Conv2d
    ReLU GELU SiLU Tanh Sigmoid Softmax LogSoftmax LeakyReLU ELU Softplus Mish Hardtanh Softsign
    MultiheadAttention MSELoss L1Loss CrossEntropyLoss NLLLoss BCELoss BCEWithLogitsLoss KLDivLoss
    HuberLoss SmoothL1Loss CosineSimilarity PairwiseDistance
    """
)

_NN_FUNCTIONAL = _words(
    """
    linear bilinear relu relu6 gelu silu elu selu celu leaky_relu softplus softsign mish tanh sigmoid
    hardtanh hardsigmoid hardswish logsigmoid tanhshrink softshrink hardshrink glu softmax softmin
    log_softmax gumbel_softmax normalize layer_norm rms_norm group_norm batch_norm dropout embedding
    one_hot pad conv1d conv2d avg_pool1d max_pool1d avg_pool2d max_pool2d adaptive_avg_pool1d
    cosine_similarity pairwise_distance pdist mse_loss l1_loss cross_entropy nll_loss kl_div
    binary_cross_entropy binary_cross_entropy_with_logits huber_loss smooth_l1_loss
    scaled_dot_product_attention interpolate unfold fold
    """
)

_NN_INIT = _words(
    """
    calculate_gain constant_ zeros_ ones_ eye_ normal_ uniform_ trunc_normal_ orthogonal_
    xavier_uniform_ xavier_normal_ kaiming_uniform_ kaiming_normal_
    """
)

_OPTIM = _words("Optimizer SGD Adam AdamW Adagrad RMSprop LBFGS Rprop Adamax NAdam RAdam")
_AUTOGRAD = _words("grad backward Function no_grad enable_grad inference_mode")
_AUTOGRAD_FUNCTIONAL = _words("jacobian hessian vjp jvp hvp vhp")


def _module_all(module: Any) -> list[str]:
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    return [n for n in names if callable(getattr(module, n, None)) or n == "LinAlgError"]


def build_torch() -> dict[str, Facade]:
    functional = Facade("torch.nn.functional", _pick(torch.nn.functional, _NN_FUNCTIONAL))
    init = Facade("torch.nn.init", _pick(torch.nn.init, _NN_INIT))
    nn_facade = Facade("torch.nn", {**_pick(nn, _NN_LAYERS), "functional": functional, "init": init})
    linalg_members = _pick(torch.linalg, [n for n in _module_all(torch.linalg) if n != "common_notes"])
    linalg = Facade("torch.linalg", {**linalg_members, "eigvals": eigvals_checked})  # MKL crashes on NaN/inf
    fft = Facade("torch.fft", _pick(torch.fft, [n for n in torch.fft.__all__ if n != "Tensor"]))
    special = Facade("torch.special", _pick(torch.special, torch.special.__all__))
    autograd_functional = Facade("torch.autograd.functional", _pick(torch.autograd.functional, _AUTOGRAD_FUNCTIONAL))
    autograd = Facade("torch.autograd", {**_pick(torch.autograd, _AUTOGRAD), "functional": autograd_functional})
    optim = Facade("torch.optim", _pick(torch.optim, _OPTIM))
    members = _pick(torch, torch_op_names() + _TORCH_EXTRA)
    for name in ("tensor", "as_tensor", "from_numpy"):
        members[name] = array_data_only(f"torch.{name}", members[name])
    members.update(nn=nn_facade, fft=fft, linalg=linalg, special=special, autograd=autograd, optim=optim)
    top = Facade("torch", members)
    return {
        "torch": top,
        "torch.nn": nn_facade,
        "torch.nn.functional": functional,
        "torch.nn.init": init,
        "torch.fft": fft,
        "torch.linalg": linalg,
        "torch.special": special,
        "torch.autograd": autograd,
        "torch.autograd.functional": autograd_functional,
        "torch.optim": optim,
    }


# --- numpy -------------------------------------------------------------------------------------

_NUMPY = _words(
    """
    ndarray dtype generic number integer floating complexfloating bool_ float16 float32 float64 int8 int16
    int32 int64 uint8 uint16 uint32 uint64 complex64 complex128 intp
    array asarray asanyarray ascontiguousarray copy zeros zeros_like ones ones_like empty empty_like full
    full_like eye identity arange linspace logspace geomspace meshgrid mgrid ogrid indices diag diagflat
    tri tril triu vander fromfunction fromiter
    reshape ravel transpose swapaxes moveaxis expand_dims squeeze concatenate stack vstack hstack dstack
    column_stack split array_split hsplit vsplit tile repeat flip fliplr flipud roll rot90 broadcast_to
    broadcast_arrays atleast_1d atleast_2d atleast_3d pad append insert delete resize trim_zeros
    abs absolute sign sqrt square exp exp2 expm1 log log2 log10 log1p sin cos tan arcsin arccos arctan
    arctan2 sinh cosh tanh arcsinh arccosh arctanh hypot degrees radians deg2rad rad2deg floor ceil trunc
    rint round around fix add subtract multiply divide true_divide floor_divide power float_power mod
    remainder fmod divmod negative positive reciprocal maximum minimum fmax fmin clip heaviside gcd lcm
    real imag conj conjugate angle isnan isinf isfinite isclose allclose array_equal array_equiv
    nan_to_num sum prod cumsum cumprod mean median average std var nansum nanprod nanmean nanmedian
    nanstd nanvar nanmax nanmin nanargmax nanargmin max min amax amin argmax argmin ptp percentile quantile
    nanpercentile nanquantile histogram histogram2d bincount digitize cov corrcoef correlate convolve
    diff gradient trapezoid interp cross dot vdot inner outer matmul tensordot einsum kron trace
    sort argsort lexsort partition argpartition searchsorted unique nonzero flatnonzero argwhere where
    extract count_nonzero any all logical_and logical_or logical_not logical_xor greater greater_equal
    less less_equal equal not_equal isin intersect1d union1d setdiff1d setxor1d
    bitwise_and bitwise_or bitwise_xor invert left_shift right_shift
    floor_divide sinc i0 unravel_index ravel_multi_index diag_indices triu_indices tril_indices
    shape ndim size result_type promote_types can_cast finfo iinfo issubdtype
    pi e inf nan newaxis euler_gamma
    """
)

_NP_RANDOM = _words(
    """
    default_rng Generator PCG64 SeedSequence seed rand randn randint random normal uniform choice
    permutation shuffle standard_normal binomial poisson exponential
    """
)


def build_numpy() -> dict[str, Facade]:
    linalg = Facade("numpy.linalg", _numpy_checked("numpy.linalg", _pick(np.linalg, np.linalg.__all__)))
    fft = Facade("numpy.fft", _numpy_checked("numpy.fft", _pick(np.fft, np.fft.__all__)))
    rnd = Facade("numpy.random", _numpy_checked("numpy.random", _pick(np.random, _NP_RANDOM)))
    members = {**_numpy_checked("numpy", _pick(np, _NUMPY)), "ndarray": SANDBOX_NDARRAY}
    top = Facade("numpy", {**members, "linalg": linalg, "fft": fft, "random": rnd})
    return {"numpy": top, "numpy.linalg": linalg, "numpy.fft": fft, "numpy.random": rnd}


# --- stdlib ------------------------------------------------------------------------------------

_STDLIB: dict[str, tuple[Any, str]] = {
    "math": (math, " ".join(n for n in dir(math) if not n.startswith("_"))),
    "itertools": (itertools, " ".join(n for n in dir(itertools) if not n.startswith("_"))),
    "collections": (collections, "Counter defaultdict OrderedDict deque namedtuple ChainMap"),
    "functools": (functools, "reduce partial lru_cache cache cmp_to_key"),
    "statistics": (
        statistics,
        "mean fmean median median_low median_high mode multimode stdev pstdev variance pvariance quantiles "
        "geometric_mean harmonic_mean correlation covariance linear_regression StatisticsError",
    ),
    "heapq": (heapq, "heappush heappop heapify heapreplace heappushpop nlargest nsmallest merge"),
    "json": (json, "JSONDecodeError"),
    "random": (
        random,
        "seed random randint randrange choice choices shuffle sample uniform gauss normalvariate getrandbits Random",
    ),
    "re": (re, "compile match fullmatch search findall finditer sub subn split escape IGNORECASE MULTILINE DOTALL"),
    "copy": (copy, "copy"),
}

#: The guarded replacements, by facade: same names, safe parameters only.
_STDLIB_GUARDED: dict[str, dict[str, Any]] = {
    "functools": {"wraps": sandbox_wraps, "total_ordering": sandbox_total_ordering},
    "json": {"dumps": sandbox_json_dumps, "loads": sandbox_json_loads},
    "copy": {"deepcopy": sandbox_deepcopy},
    "collections": {"namedtuple": sandbox_namedtuple},
}


def build_stdlib() -> dict[str, Facade]:
    return {
        name: Facade(name, {**_pick(module, _words(names)), **_STDLIB_GUARDED.get(name, {})})
        for name, (module, names) in _STDLIB.items()
    }


def build_field_libraries() -> dict[str, Facade]:
    """What interpretability code imports by reflex: ``einops`` (the real library's public functions: their
    string patterns name axes, never attributes; a reduction is one of einops's own names or a callable) and
    ``transformer_lens`` with ``utils``, the sandbox's TransformerLens subset (``from transformer_lens import
    utils``; there is no ``HookedTransformer`` to load: the task's model is ``model``)."""
    tl_utils = Facade("transformer_lens.utils", {n: getattr(utils, n) for n in dir(utils) if not n.startswith("_")})
    return {
        "einops": Facade("einops", _pick(einops, _words("rearrange reduce repeat einsum pack unpack parse_shape"))),
        "transformer_lens": Facade("transformer_lens", {"utils": tl_utils}),
        "transformer_lens.utils": tl_utils,
    }


def build_facades() -> dict[str, Facade]:
    """Every importable name mapped to its facade (``torch.nn.functional`` included); installs the name guards."""
    install_name_guards()
    return {**build_torch(), **build_numpy(), **build_stdlib(), **build_field_libraries()}


def make_import(facades: dict[str, Facade]) -> Any:
    """The sandbox ``__import__``: facades for statements, the real import for library C code."""
    real_import = builtins.__import__
    importable = ", ".join(sorted(n for n in facades if "." not in n))

    def sandbox_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if type(fromlist) is list:  # PyImport_Import from torch/numpy C code, never an import statement
            return real_import(name, globals, locals, fromlist, level)
        if level != 0:
            raise ImportError("relative imports are not available in the sandbox")
        if type(name) is not str or name not in facades:
            top = name.split(".")[0] if type(name) is str else name
            missing = name if top in facades else top  # "einops.layers", not "einops", when einops is importable
            raise ImportError(f"module {missing!r} is not available in the sandbox; importable: {importable}")
        if fromlist:
            return facades[name]
        return facades[name.split(".")[0]]

    return sandbox_import
