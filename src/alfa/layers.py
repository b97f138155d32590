"""Factorized layers (``W = U @ V``) and the geometry every adapter needs from a layer.

A weight is always seen as a matrix ``W`` of shape ``(m, n)`` (spec §1):

* ``nn.Linear(in, out)``: ``m = out``, ``n = in``;
* ``nn.Conv2d(in, out, k)`` with ``groups == 1``: ``m = out``, ``n = in * kh * kw``
  (``weight.reshape(m, -1)``);
* ``transformers.pytorch_utils.Conv1D(nf=out, nx=in)`` (GPT-2's attention and MLP): a linear layer
  whose weight is stored transposed, ``(in, out)``, so ``W = weight.T``. It is recognized by its class
  name and module, without importing ``transformers`` (alfa does not depend on it).

A factorized layer stores ``U`` (m×d) and ``V`` (d×n) and never builds ``W``: a factorized conv runs
as a conv ``in -> d`` with ``V`` as its kernel, then a 1×1 conv ``d -> m`` with ``U``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C import DisableTorchFunctionSubclass
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.nn.parameter import is_lazy

__all__ = [
    "FactorizedLinear",
    "FactorizedConv2d",
    "LayerSpec",
    "layer_spec",
    "is_factorized",
    "is_dense_eligible",
    "is_dense_layer",
    "is_conv1d",
    "own_forward",
    "dense_matrix",
    "svd_factors",
    "canonicalize_factors",
    "tensor_signature",
    "ComputedWeight",
    "ReadOnlyWeightError",
    "computed_weight",
    "refuse_scripting",
]


class ReadOnlyWeightError(RuntimeError, AttributeError):
    """A write into (or an assignment of) the ``weight`` of a factorized or adapted layer: that weight is computed
    from other tensors on each read, so the write would change nothing. A ``RuntimeError`` (what a refused in-place
    operation raises) and an ``AttributeError`` (what assigning a read-only attribute raises)."""


_INPLACE_DUNDERS = frozenset(
    f"__i{op}__" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor")
) | {"__ilshift__", "__irshift__", "__setitem__"}
_NOT_VALUE_WRITES = frozenset(("requires_grad_", "retain_grad", "share_memory_"))  # in place, but on no value


def _tensors_in(args: tuple, kwargs: dict) -> list[Tensor]:
    flat: list[Any] = [*args, *kwargs.values()]
    flat += [x for v in flat if isinstance(v, (tuple, list)) for x in v]
    return [x for x in flat if isinstance(x, ComputedWeight)]


def _written(func: Callable, args: tuple, kwargs: dict) -> ComputedWeight | None:
    """The :class:`ComputedWeight` that ``func`` writes into, if any: the tensor it works in place on (its first
    argument: ``w.zero_()``, ``nn.init.normal_(w)``, ``w[0] = 1``, ``w.data = ...``) or its ``out=``. Reading one
    (``dense.weight.copy_(w)``) is no write."""
    out = kwargs.get("out")
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, ComputedWeight):
            return t
    # the first argument, given by position or, as nn.init's functions hand it on, by keyword (tensor=)
    target = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(target, ComputedWeight):
        return None
    name = getattr(func, "__name__", "")
    if name == "__set__":  # a property assigned: ``.data = ...`` replaces the values
        writes = getattr(getattr(func, "__self__", None), "__name__", "") == "data"
    elif name.startswith("__"):
        writes = name in _INPLACE_DUNDERS
    else:
        writes = name.endswith("_") and name not in _NOT_VALUE_WRITES  # Tensor.zero_, nn.init.normal_, ...
    return target if writes else None


class ComputedWeight(Tensor):
    """What the ``weight`` property of a factorized or adapted layer returns: the dense weight, computed from the
    layer's factors (or base and adapter) on each read. It reads like any tensor (``.shape``, ``.dtype``,
    ``weight @ x``, ``.detach().clone()``: results are plain tensors, gradients flow), but a write into it (an
    in-place method, an ``nn.init`` function, ``out=``, ``.data = ...``) would change nothing the layer computes, so
    it raises :class:`ReadOnlyWeightError` saying what to write instead. Views of it (``.T``, ``.data``, indexing)
    are read-only too; copies (``.clone()``, arithmetic) and ``.detach()`` (the values as a tensor of the caller's
    own: ``nn.Parameter(layer.weight.detach())``) are plain tensors."""

    _alfa_refusal: Callable[[str], str]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206 — torch's protocol
        kwargs = kwargs or {}
        written = _written(func, args, kwargs)
        if written is not None:
            raise ReadOnlyWeightError(written._alfa_refusal(f"writing into it ({getattr(func, '__name__', func)})"))
        sources = _tensors_in(args, kwargs)
        with DisableTorchFunctionSubclass():
            name = getattr(func, "__name__", "")
            if name in ("__reduce_ex__", "__deepcopy__"):  # pickled or copied: plain
                return func(args[0].as_subclass(Tensor), *args[1:], **kwargs)
            if name == "detach":  # the values as the caller's own tensor (nn.Parameter(w.detach())): plain
                return func(*args, **kwargs)
            return _keep_read_only(func(*args, **kwargs), sources)


def _keep_read_only(out: Any, sources: list[Tensor]) -> Any:
    """``out`` with each tensor that shares memory with a read-only weight read-only too (a view: a write into it
    would be lost as well); the others (new values) are plain tensors."""
    if type(out) in (tuple, list):  # torch.split, unbind, chunk: views
        return type(out)(_keep_read_only(o, sources) for o in out)
    if isinstance(out, ComputedWeight) or not isinstance(out, Tensor) or out.layout != torch.strided:
        return out  # one already marked (``requires_grad_`` returns its tensor: a new alias would be no leaf)
    for source in sources:
        if torch._C._is_alias_of(out, source):
            return _marked(out, source._alfa_refusal)
    return out


def _marked(t: Tensor, refusal: Callable[[str], str]) -> Tensor:
    out = t.as_subclass(ComputedWeight)
    out._alfa_refusal = refusal
    return out


def computed_weight(W: Tensor, refusal: Callable[[str], str]) -> Tensor:
    """``W`` as a :class:`ComputedWeight` whose writes raise ``refusal(operation)``; ``W`` itself while torch traces
    (``torch.compile``, ``torch.export``, ONNX, ``jit.trace``, FX): a graph holds plain tensors, and nothing writes
    into the weight there."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or is_fx_symbolic_tracing():
        return W
    return _marked(W, refusal)


def refuse_scripting(module: nn.Module, what: str | None = None, instead: str | None = None) -> nn.Module:
    """What an alfa layer's ``__prepare_scriptable__`` (the hook ``torch.jit.script`` calls on every module before
    compiling it) does: refuse in one line, naming ``what`` the model holds (the layer's class by default) and what
    to use ``instead``. TorchScript cannot type the layers' geometry (a Python dataclass), and its own error names
    that annotation, not the way out."""
    what = what or f"a {type(module).__name__}"
    instead = instead or (
        "use torch.jit.trace, torch.export (alfa.export.export_program), ONNX (alfa.export.export_onnx) or "
        "torch.compile; a model merged with alfa.merge(model, densify=True) holds plain layers, which script"
    )
    raise RuntimeError(f"torch.jit.script does not support alfa's layers (this model holds {what}): {instead}")


@dataclass(frozen=True)
class LayerSpec:
    """How a Linear or Conv2d maps inputs to outputs, independent of how its weight is stored.

    Adapters use it to run the layer's operation with a weight of their own making:
    ``input_op(x, V)`` applies a ``(k, n)`` matrix with the layer's kernel, stride, padding and
    dilation (giving ``k`` channels), ``output_op(h, U, bias)`` mixes ``k`` channels into ``m`` with a
    ``(m, k)`` matrix (a 1×1 conv for convs), and ``dense_op(x, W, bias)`` runs the full layer.
    ``transposed`` marks a linear layer whose dense form is a ``transformers`` ``Conv1D`` (weight stored
    ``(in, out)``): merges that densify rebuild that class, so the model keeps the layout its own
    weight files and code expect.
    """

    kind: str  # "linear" or "conv2d"
    in_features: int
    out_features: int
    kernel_size: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] | str = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    transposed: bool = False

    @property
    def m(self) -> int:
        return self.out_features

    @property
    def n(self) -> int:
        kh, kw = self.kernel_size
        return self.in_features * kh * kw

    def kernel(self, matrix: Tensor) -> Tensor:
        """A ``(k, n)`` matrix as a conv kernel ``(k, in, kh, kw)`` (a no-op for linear layers)."""
        if self.kind == "linear":
            return matrix
        return matrix.reshape(matrix.shape[0], self.in_features, *self.kernel_size)

    def input_op(self, x: Tensor, V: Tensor) -> Tensor:
        if self.kind == "linear":
            return F.linear(x, V)
        return F.conv2d(x, self.kernel(V), None, self.stride, self.padding, self.dilation)

    def output_op(self, h: Tensor, U: Tensor, bias: Tensor | None = None) -> Tensor:
        if self.kind == "linear":
            return F.linear(h, U, bias)
        return F.conv2d(h, U[:, :, None, None], bias)

    def dense_op(self, x: Tensor, W: Tensor, bias: Tensor | None = None) -> Tensor:
        if self.kind == "linear":
            return F.linear(x, W, bias)
        return F.conv2d(x, self.kernel(W), bias, self.stride, self.padding, self.dilation)

    def dense_layout(self, W: Tensor) -> Tensor:
        """The ``(m, n)`` matrix ``W`` in the layout of the dense layer's ``weight``: ``(out, in)`` for a
        Linear, ``(out, in, kh, kw)`` for a conv, ``(in, out)`` for a ``Conv1D``."""
        if self.kind == "linear":
            return W.T if self.transposed else W
        return self.kernel(W)

    def make_dense(self, W: Tensor, bias: Tensor | None) -> nn.Module:
        """A plain ``nn.Linear``/``nn.Conv2d`` (or ``Conv1D``) holding ``W`` (used by merges that densify)."""
        if self.transposed:
            return _make_conv1d(W, bias)
        if self.kind == "linear":
            layer: nn.Module = nn.Linear(self.in_features, self.out_features, bias=bias is not None)
        else:
            layer = nn.Conv2d(
                self.in_features,
                self.out_features,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                bias=bias is not None,
            )
        layer = layer.to(device=W.device, dtype=W.dtype)
        with torch.no_grad():
            layer.weight.copy_(self.kernel(W).reshape(layer.weight.shape))
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    def make_factorized(self, U: Tensor, V: Tensor, bias: Tensor | None) -> nn.Module:
        """A factorized layer holding ``U`` and ``V`` (used by merges that keep the factorized form)."""
        d = U.shape[1]
        if self.kind == "linear":
            layer: nn.Module = FactorizedLinear(
                self.in_features, self.out_features, d, bias=bias is not None, transposed=self.transposed
            )
        else:
            layer = FactorizedConv2d(
                self.in_features,
                self.out_features,
                self.kernel_size,
                d,
                self.stride,
                self.padding,
                self.dilation,
                bias=bias is not None,
            )
        layer = layer.to(device=U.device, dtype=U.dtype)
        with torch.no_grad():
            layer.U.copy_(U)
            layer.V.copy_(V)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer


def _conv1d_class() -> type[nn.Module]:
    """``transformers.pytorch_utils.Conv1D``, looked up among the loaded modules: a transposed layer only
    exists if a model built with transformers was given to alfa, so transformers is loaded then; alfa
    itself never imports it."""
    module = sys.modules.get("transformers.pytorch_utils")
    if module is None or not hasattr(module, "Conv1D"):
        raise RuntimeError("rebuilding a Conv1D layer needs transformers, which is not loaded (import transformers)")
    return module.Conv1D


def _make_conv1d(W: Tensor, bias: Tensor | None) -> nn.Module:
    m, n = W.shape
    layer = _conv1d_class()(m, n).to(device=W.device, dtype=W.dtype)  # Conv1D(nf=out, nx=in)
    with torch.no_grad():
        layer.weight.copy_(W.T)
        # Conv1D always has a bias; a bias-free factorized twin (never made from a Conv1D) merges with zeros.
        layer.bias.copy_(bias if bias is not None else torch.zeros_like(layer.bias))
    return layer


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[1]))


class _Factorized(nn.Module):
    """Shared storage of the two factors; subclasses say how they run."""

    spec: LayerSpec

    def _init_factors(self, m: int, n: int, rank: int, bias: bool) -> None:
        if rank <= 0:
            raise ValueError(f"rank must be a positive integer, got {rank}")
        self.rank = rank
        self.U = nn.Parameter(torch.empty(m, rank))
        self.V = nn.Parameter(torch.empty(rank, n))
        self.bias = nn.Parameter(torch.zeros(m)) if bias else None
        # A random init so a freshly built layer is usable; truncation overwrites both factors.
        nn.init.kaiming_uniform_(self.U, a=5**0.5)
        nn.init.kaiming_uniform_(self.V, a=5**0.5)

    def forward_with(self, x: Tensor, V: Tensor) -> Tensor:
        """Run the layer with another right factor ``V`` (what Alfa and its variants adapt)."""
        return self.spec.output_op(self.spec.input_op(x, V), self.U, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_with(x, self.V)

    def weight_matrix(self) -> Tensor:
        """The dense ``(m, n)`` weight ``U @ V`` (for analysis and tests; forward never builds it)."""
        return self.U @ self.V

    @property
    def weight(self) -> Tensor:
        """Read-only: the dense weight ``U @ V`` in the layout of the layer this one replaced (``(out, in)``,
        ``(out, in, kh, kw)``, or ``(in, out)`` for a ``Conv1D``), built on each access.

        For model code that reads ``layer.weight`` (its dtype, device or shape; transformers' ViT reads
        the patch embedding's dtype every forward); the layer's own forward never builds it. A write into it
        (``nn.init.zeros_(layer.weight)``, ``layer.weight.mul_(0)``) or an assignment raises
        :class:`ReadOnlyWeightError` (it would change nothing): write ``U`` and ``V`` instead.
        """
        return computed_weight(self.spec.dense_layout(self.U @ self.V), self._weight_refusal)

    def _weight_refusal(self, action: str) -> str:
        return (
            f"{type(self).__name__}({self.extra_repr()}).weight is computed from the layer's factors (U @ V) on each "
            f"read, so {action} would change nothing: write the factors instead (layer.U, layer.V, and "
            "layer.bias), e.g. nn.init on them"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weight":
            raise ReadOnlyWeightError(self._weight_refusal("assigning it"))
        super().__setattr__(name, value)

    def __prepare_scriptable__(self) -> nn.Module:
        return refuse_scripting(self)

    @torch.no_grad()
    def canonicalize_(self) -> None:
        """Re-express ``U @ V`` as ``U_d (S_d V_dᵀ)`` with orthonormal ``U_d`` and orthogonal rows of V.

        Fine-tuning the factors (recovery after truncation) breaks the SVD form that Alfa's reading
        of ``V`` as ``S_d V_dᵀ`` assumes; this restores it without changing the product.
        """
        U, V = canonicalize_factors(self.U, self.V)
        self.U.copy_(U)
        self.V.copy_(V)


class FactorizedLinear(_Factorized):
    """A Linear layer stored as ``W = U @ V`` with ``U`` (out×d) and ``V`` (d×in).

    ``transposed=True``: the layer replaces a ``transformers`` ``Conv1D``; it computes the same, its
    ``weight`` property has the ``(in, out)`` layout, and a densifying merge rebuilds a ``Conv1D``.
    """

    def __init__(
        self, in_features: int, out_features: int, rank: int, bias: bool = True, transposed: bool = False
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.spec = LayerSpec("linear", in_features, out_features, transposed=transposed)
        self._init_factors(out_features, in_features, rank, bias)

    @classmethod
    def from_dense(cls, layer: nn.Module, rank: int) -> FactorizedLinear:
        """Truncated SVD of the layer's ``(out, in)`` weight (an ``nn.Linear`` or a ``Conv1D``) keeping the
        ``rank`` largest singular values."""
        return _truncated(layer, rank)  # type: ignore[return-value]

    @property
    def nx(self) -> int:  # transformers Conv1D's names (nx inputs, nf outputs), for the layer that replaced one
        if not self.spec.transposed:
            raise AttributeError("a FactorizedLinear that does not replace a Conv1D has no 'nx'")
        return self.in_features

    @property
    def nf(self) -> int:
        if not self.spec.transposed:
            raise AttributeError("a FactorizedLinear that does not replace a Conv1D has no 'nf'")
        return self.out_features

    def extra_repr(self) -> str:
        conv1d = ", transposed=True" if self.spec.transposed else ""
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, bias={self.bias is not None}{conv1d}"


class FactorizedConv2d(_Factorized):
    """A Conv2d stored as ``W = U @ V``: a conv ``in -> d`` with kernel ``V``, then a 1×1 conv ``U``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        rank: int,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        self.groups, self.padding_mode = 1, "zeros"  # what model code may read off an nn.Conv2d
        self.spec = LayerSpec(
            "conv2d", in_channels, out_channels, self.kernel_size, self.stride, self.padding, self.dilation
        )
        self._init_factors(out_channels, self.spec.n, rank, bias)

    @classmethod
    def from_dense(cls, layer: nn.Conv2d, rank: int) -> FactorizedConv2d:
        """Truncated SVD of ``layer.weight.reshape(out, -1)`` keeping the ``rank`` largest values."""
        if layer.groups != 1:
            raise ValueError("grouped convolutions cannot be factorized as one matrix")
        if layer.padding_mode != "zeros":
            raise ValueError(f"padding_mode={layer.padding_mode!r} is not supported (only 'zeros')")
        return _truncated(layer, rank)  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, rank={self.rank}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"bias={self.bias is not None}"
        )


def _truncated(layer: nn.Module, rank: int) -> nn.Module:
    """The factorized twin of a dense layer, holding its top-``rank`` SVD."""
    W = dense_matrix(layer).detach()
    U, V = svd_factors(W, min(rank, *W.shape))
    bias = None if layer.bias is None else layer.bias.detach()
    return layer_spec(layer).make_factorized(U, V, bias)


def is_factorized(module: nn.Module) -> bool:
    return isinstance(module, _Factorized)


def is_conv1d(module: nn.Module) -> bool:
    """A ``transformers.pytorch_utils.Conv1D`` (or a subclass), recognized without importing transformers."""
    return (
        any(c.__name__ == "Conv1D" and c.__module__ == "transformers.pytorch_utils" for c in type(module).__mro__)
        and getattr(module, "weight", None) is not None
        and module.weight.dim() == 2
    )


def is_dense_layer(module: nn.Module) -> bool:
    """A dense layer alfa knows: Linear, Conv2d (any groups) or Conv1D; :func:`is_dense_eligible` says if
    it is one matrix."""
    return isinstance(module, (nn.Linear, nn.Conv2d)) or is_conv1d(module)


def own_forward(module: nn.Module) -> str | None:
    """The class name of a dense layer whose class computes its own way, else ``None``: a subclass of Linear,
    Conv2d or Conv1D overriding ``forward`` (or a conv's ``_conv_forward``) whose output, on a probe input, is not
    the plain product of its weight (a scale, a quantization). One that only restates the product (transformers'
    ``FalconLinear``) is plain; so is one whose weights hold no values to probe (meta tensors, counted only).

    Such a layer is not the product alfa factorizes and merges into: a factorized or merged twin, or an adapter's
    dense path, would silently drop what the subclass adds, so it is left as it is, with this reason."""
    cls = type(module)
    if isinstance(module, nn.Conv2d):
        base, methods = nn.Conv2d, ("forward", "_conv_forward")
    elif isinstance(module, nn.Linear):
        base, methods = nn.Linear, ("forward",)
    elif is_conv1d(module):
        base = next(c for c in cls.__mro__ if c.__name__ == "Conv1D" and c.__module__ == "transformers.pytorch_utils")
        methods = ("forward",)
    else:
        return None
    if all(getattr(cls, m) is getattr(base, m) for m in methods):
        return None
    return None if _computes_the_product(module, base) else cls.__name__


@torch.no_grad()
def _computes_the_product(module: nn.Module, base: type) -> bool:
    """Whether ``module``'s own forward gives what ``base``'s gives on a small random input (hooks bypassed)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor) or weight.is_meta or is_lazy(weight):
        return True  # nothing to probe: taken as the product, as before subclasses were probed
    g = torch.Generator(device="cpu").manual_seed(0)
    if isinstance(module, nn.Conv2d):
        kh, kw = _pair(module.kernel_size)
        dh, dw = _pair(module.dilation)
        shape: tuple[int, ...] = (2, module.in_channels, dh * (kh - 1) + 3, dw * (kw - 1) + 3)
    else:
        shape = (3, weight.shape[0] if is_conv1d(module) else weight.shape[1])
    x = torch.randn(shape, generator=g).to(device=weight.device, dtype=weight.dtype)
    try:
        own = type(module).forward(module, x)
    except Exception:  # noqa: BLE001 — a forward that takes no plain tensor is no plain product
        return False
    if isinstance(module, nn.Conv2d):  # the base's conv, not an overridden _conv_forward its forward would call
        plain = nn.Conv2d._conv_forward(module, x, module.weight, module.bias)
    elif isinstance(module, nn.Linear):
        plain = F.linear(x, module.weight, module.bias)
    else:
        plain = base.forward(module, x)
    return isinstance(own, Tensor) and own.shape == plain.shape and torch.allclose(own, plain, rtol=1e-4, atol=1e-5)


def is_dense_eligible(module: nn.Module) -> bool:
    """A plain Linear or Conv1D, or a Conv2d that is one matrix (no groups, zero padding); none whose class
    computes its own way (:func:`own_forward`)."""
    if own_forward(module) is not None:
        return False
    if isinstance(module, nn.Linear) or is_conv1d(module):
        return True
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros"
    return False


def layer_spec(module: nn.Module) -> LayerSpec:
    """The :class:`LayerSpec` of a Linear, Conv2d or factorized layer."""
    if is_factorized(module):
        return module.spec  # type: ignore[return-value]
    if isinstance(module, nn.Linear):
        return LayerSpec("linear", module.in_features, module.out_features)
    if is_conv1d(module):
        n_in, n_out = module.weight.shape
        return LayerSpec("linear", n_in, n_out, transposed=True)
    if isinstance(module, nn.Conv2d) and is_dense_eligible(module):
        return LayerSpec(
            "conv2d",
            module.in_channels,
            module.out_channels,
            _pair(module.kernel_size),
            _pair(module.stride),
            module.padding if isinstance(module.padding, str) else _pair(module.padding),
            _pair(module.dilation),
        )
    raise TypeError(f"{type(module).__name__} is not a Linear, a Conv1D, an ungrouped Conv2d or a factorized layer")


def dense_matrix(module: nn.Module) -> Tensor:
    """The layer's weight as an ``(m, n)`` matrix (built from the factors for factorized layers; the
    transpose of a ``Conv1D``'s stored ``(in, out)`` weight)."""
    if is_factorized(module):
        return module.weight_matrix()  # type: ignore[operator]
    if is_conv1d(module):
        return module.weight.T  # type: ignore[union-attr]
    return module.weight.reshape(module.weight.shape[0], -1)  # type: ignore[union-attr]


def _signed_factors(U: Tensor, S: Tensor, Vh: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(U, S Vh)`` with the sign of each component fixed so its largest ``|U|`` entry is positive."""
    pivot = U.abs().argmax(dim=0)
    sign = torch.sign(U[pivot, torch.arange(U.shape[1])])
    sign[sign == 0] = 1
    return (U * sign).to(dtype), ((S * sign)[:, None] * Vh).to(dtype)


def svd_factors(W: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """``U_d`` (m×d) and ``V_base = S_d V_dᵀ`` (d×n) of the top-``d`` SVD of ``W``.

    Computed in float64 and with a fixed sign per component, so the factors do not depend on
    LAPACK's arbitrary sign choices.
    """
    U, S, Vh = torch.linalg.svd(W.detach().to(torch.float64), full_matrices=False)
    return _signed_factors(U[:, :d], S[:d], Vh[:d], W.dtype)


def canonicalize_factors(U: Tensor, V: Tensor) -> tuple[Tensor, Tensor]:
    """Factors of the same product ``U @ V`` in SVD form (orthonormal ``U``, ``V = S Vᵀ``)."""
    Qu, Ru = torch.linalg.qr(U.detach().to(torch.float64))
    Qv, Rv = torch.linalg.qr(V.detach().to(torch.float64).T)
    P, S, Qh = torch.linalg.svd(Ru @ Rv.T)
    return _signed_factors(Qu @ P, S, Qh @ Qv.T, U.dtype)


def _probe(numel: int, device: torch.device) -> Tensor:
    g = torch.Generator().manual_seed(numel)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(device)


@torch.no_grad()
def tensor_signature(t: Tensor) -> list[float]:
    """Two numbers that change with any change of ``t``'s values (its norm and its product with a fixed random
    probe), the same for a cast that keeps the values (float32 to float64)."""
    flat = t.detach().reshape(-1).to(torch.float64)
    return [float(flat.norm()), float(flat @ _probe(flat.numel(), flat.device))]
