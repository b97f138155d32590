"""Module surgery: putting a module at a path of a model, and the safeguards every structural change shares.

Truncation (:mod:`alfa.truncate`) and the adapters (:mod:`alfa.adapters`) both replace layers of a model
the user built. What they share lives here, below both, so that neither needs to know the other:

- :func:`replace_module` puts a module at a dotted path; :func:`target_matches` is the one rule by which a
  ``target`` (a regular expression, or a list of module names in PEFT's manner) selects modules, for
  ``alfa.truncate`` and every adapter alike, and :func:`check_target` the one check of its form;
- :func:`shared_parameters` finds tied parameters by object identity, so that no layer whose weight
  another module also holds is replaced (that would silently untie them), and :func:`tie_refusal`
  words the refusal;
- :func:`guard_save_pretrained` makes a transformers model that alfa changed refuse its own
  ``save_pretrained`` while alfa layers are in it, since ``from_pretrained`` would rebuild those layers
  dense and initialize them at random without an error;
- two generic markers let the layers above describe themselves without this module (or truncate)
  importing them: a :class:`LayerWrapper` is a module put at a layer's path that computes with the
  layer it replaced, and an :class:`Attachment` is book-keeping kept on a model that may forbid
  changes of its structure meanwhile (:func:`structure_refusal`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from torch import nn

from .layers import is_factorized, refuse_scripting

__all__ = [
    "check_names",
    "check_target",
    "target_matches",
    "first_entry_left_out",
    "is_compiled_wrapper",
    "replace_module",
    "root_refusal",
    "require_flags",
    "shared_parameters",
    "tie_refusal",
    "LayerWrapper",
    "Attachment",
    "structure_refusal",
    "short_list",
    "guard_save_pretrained",
    "save_pretrained_problem",
    "UnsupportedSaveError",
]


def target_matches(target: str | Sequence[str] | None, name: str) -> bool:
    """Whether a module (or, for model-scope methods, parameter) ``name`` is selected by ``target``: ``None``
    selects everything; a string is a regular expression (``re.search``); a list of names selects ``name`` when
    it equals one of them or ends with ``"." + `` one (PEFT's convention: ``["fc", "conv2"]``)."""
    if target is None:
        return True
    if isinstance(target, str):
        return re.search(target, name) is not None
    return any(name == s or name.endswith("." + s) for s in target)


def first_entry_left_out(
    model: nn.Module, target: Any, selected: Sequence[str], who: str
) -> tuple[str, str, nn.Module] | None:
    """The first name of a list ``target`` that selects none of ``selected`` (the layers an operation took), with
    the module it does name, its first match, for the caller to say why that one was left out; ``None`` when
    every name selects one, or when ``target`` is a regular expression (it selects what it matches). A name that
    matches no module at all is refused here, ``who`` (the operation) naming it."""
    if not isinstance(target, (list, tuple)):
        return None
    modules = dict(model.named_modules())
    for entry in target:
        if any(target_matches((entry,), n) for n in selected):
            continue
        found = [n for n in modules if n and target_matches((entry,), n)]
        if not found:
            raise ValueError(
                f"{who}: target {entry!r}: the model has no module named {entry!r} (nor ending in '.{entry}')"
            )
        return entry, found[0], modules[found[0]]
    return None


def check_target(target: Any) -> None:
    """``ValueError`` naming the problem where ``target`` is not one of the forms :func:`target_matches` reads:
    ``None``, a valid regular expression, or a non-empty list (or tuple) of module names."""
    if isinstance(target, str):
        try:
            re.compile(target)
        except re.error as e:
            raise ValueError(f"target {target!r} is not a valid regular expression: {e}") from e
    elif target is not None:
        if not isinstance(target, (list, tuple)):
            raise ValueError(f"target must be a regular expression (str) or a list of module names, got {target!r}")
        if not target:
            raise ValueError("target is an empty list: it would select nothing (None selects every candidate)")
        check_names("target", target)


def check_names(field_name: str, value: Any) -> None:
    """``ValueError`` where ``value`` is not a list (or tuple) of module names (no empty name, none starting or
    ending with a dot)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{field_name} must be a list of module names, got {value!r}")
    for s in value:
        if not isinstance(s, str) or not s or s.startswith(".") or s.endswith("."):
            raise ValueError(
                f"{field_name} entries must be non-empty module names (no leading or trailing '.'), got {s!r}"
            )


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at the dotted path ``name`` inside ``model``; the model itself (``name`` ``""``) cannot be replaced
    in place: the caller holds it."""
    if not name:
        raise ValueError(root_refusal(model))
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def root_refusal(model: nn.Module) -> str:
    """Why a model that is itself a selected layer (a bare ``nn.Linear``) is refused: its caller holds it."""
    return (
        f"the model is itself the layer to replace (a bare {type(model).__name__}): a layer is replaced inside the "
        "module that holds it, so hold it in one, e.g. nn.Sequential(layer)"
    )


def shared_parameters(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> the other places (``module.param``) that hold one of the module's own parameters.

    Found by object identity, not by names: a weight tied to another module (GPT-2's ``lm_head.weight``
    is ``transformer.wte.weight``) and a module reachable under two names (a layer shared across depth)
    both show up. Replacing such a module at one of its names would silently untie it.
    """
    owners: dict[int, list[str]] = {}
    own: list[tuple[str, str, int]] = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            owners.setdefault(id(p), []).append(full)
            own.append((mod_name, full, id(p)))
    out: dict[str, list[str]] = {}
    for mod_name, full, key in own:
        for other in owners[key]:
            if other != full and other not in out.setdefault(mod_name, []):
                out[mod_name].append(other)
    return {name: others for name, others in out.items() if others}


def tie_refusal(name: str, others: list[str], action: str) -> str:
    """The message that refuses to ``action`` (truncate, adapt, merge) a layer whose parameters are shared."""
    return (
        f"{name} shares its parameters with {', '.join(others)} (the same Parameter object: tied weights); "
        f"to {action} it alfa would have to replace its weight, which silently unties them (the model grows "
        "and the two copies diverge). Leave it out of `target`; to change it anyway, untie it first (for a "
        "transformers model: tie_word_embeddings=False in its config)"
    )


def short_list(names: list[str]) -> str:
    """The first three names, and how many there are when there are more (for messages)."""
    return ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")


class LayerWrapper(nn.Module):
    """A module that alfa puts at a layer's path in place of the layer, computing with it (kept as ``base``).

    transformers' ``from_pretrained`` cannot rebuild such a module, so the ``save_pretrained`` guard
    refuses while one is in the model; the subclass words the refusal (:meth:`save_pretrained_refusal`),
    since it knows what it is and how to save it instead.
    """

    def __prepare_scriptable__(self) -> nn.Module:  # torch.jit.script's hook: refused in one line
        return refuse_scripting(self)

    @classmethod
    def save_pretrained_refusal(cls, model_class: str, wrapped: dict[str, nn.Module], truncated: bool) -> str:
        """Why ``<model_class>.save_pretrained`` must not run with the ``wrapped`` modules (name -> module) in the
        model, and what to do instead; ``truncated``: whether the model also holds factorized layers."""
        return (
            f"{model_class}.save_pretrained would lose the {len(wrapped)} layers alfa wrapped "
            f"({short_list(list(wrapped))}): from_pretrained would re-initialize them at random, without an error"
        )


class Attachment:
    """Book-keeping that a part of alfa keeps on a model (as a plain attribute) while something is attached to it.

    :func:`structure_refusal` asks every attachment of a model before a change of its structure (truncation);
    an attachment whose records name the model's layers or parameters refuses.
    """

    def structure_refusal(self, action: str) -> str | None:
        """Why the model's layers must not be replaced now (``action``: what was asked, e.g. ``"truncate"``),
        or ``None``."""
        return None


def require_module(model: Any, function: str) -> None:
    """``TypeError`` naming ``alfa.<function>`` where ``model`` is not a ``torch.nn.Module`` (a path, a class, a
    config), instead of an ``AttributeError`` from deep inside."""
    if not isinstance(model, nn.Module):
        what = f"the class {model.__name__}" if isinstance(model, type) else f"a {type(model).__name__}"
        raise TypeError(f"alfa.{function} takes a torch.nn.Module (a model instance), got {what}")


def require_flags(function: str, **flags: Any) -> None:
    """``TypeError`` naming ``alfa.<function>`` and the option where a flag is not ``True`` or ``False``: a string
    such as ``"no"`` or a path passed where a flag was expected would otherwise read as true."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"alfa.{function}: {name} must be True or False, got {value!r}")


def is_compiled_wrapper(model: Any) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (an ``OptimizedModule``), whose layer names all start with
    ``_orig_mod.``."""
    return type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module)


def refuse_compiled_wrapper(model: nn.Module, function: str) -> None:
    """``TypeError`` where ``model`` is a ``torch.compile`` wrapper: every name in it starts with ``_orig_mod.``,
    so an adapter attached or saved through it would not fit the model itself (nor the model a file of the model
    itself). The wrapper runs the model it wraps, so adapting that one serves both."""
    if is_compiled_wrapper(model):
        raise TypeError(
            f"alfa.{function}: the model is a torch.compile wrapper, whose layer names all start with '_orig_mod.'; "
            f"pass the model it wraps (model._orig_mod): the compiled wrapper runs that model, adapters included"
        )


def structure_refusal(model: nn.Module, action: str) -> str | None:
    """The first refusal of the model's attachments (:class:`Attachment`) to ``action``, or ``None``."""
    for value in vars(model).values():
        if isinstance(value, Attachment) and (reason := value.structure_refusal(action)) is not None:
            return reason
    return None


class UnsupportedSaveError(ValueError):
    """Raised by a transformers model's ``save_pretrained`` while alfa layers are in it (see
    :func:`guard_save_pretrained`); the message names what to use instead."""


def save_pretrained_problem(model: nn.Module) -> str | None:
    """Why ``model.save_pretrained`` would not round-trip through ``from_pretrained``, or ``None``.

    Wrapped layers (:class:`LayerWrapper`: adapted layers) and factorized layers are stored under alfa's own
    names (``base.weight``, ``U``, ``V``), which a freshly built transformers model does not have:
    ``from_pretrained`` would report them as missing only in a log line and initialize them at random.
    Model-scope adapter methods (BitFit, full fine-tuning) train the model's own parameters in place, so they
    round-trip and are allowed.
    """
    cls = type(model).__name__
    wrapped = {n: m for n, m in model.named_modules() if isinstance(m, LayerWrapper)}
    if wrapped:
        truncated = any(is_factorized(m) for m in model.modules())
        return type(next(iter(wrapped.values()))).save_pretrained_refusal(cls, wrapped, truncated)
    factorized = [n for n, m in model.named_modules() if is_factorized(m)]
    if factorized:
        return (
            f"{cls}.save_pretrained would lose the {len(factorized)} layers alfa.truncate factorized "
            f"({short_list(factorized)}): from_pretrained would rebuild them dense and initialize them at random, "
            f"without an error. Use alfa.save_pretrained(model, directory) and alfa.load_pretrained({cls}, "
            "directory), which record the factorized structure"
        )
    return None


class _CheckedSavePretrained:
    """An instance-level ``save_pretrained`` that refuses while alfa layers are in the model, and otherwise
    calls the class's own. A plain object rather than a closure, so that ``copy.deepcopy`` of the model
    copies it pointing at the copy (the memo maps the model to its copy)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        problem = save_pretrained_problem(self.model)
        if problem is not None:
            raise UnsupportedSaveError(problem)
        return type(self.model).save_pretrained(self.model, *args, **kwargs)


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``save_pretrained`` of ``model`` and of every transformers model inside it (duck-typed: a class
    with a ``save_pretrained`` method) raise :class:`UnsupportedSaveError` while alfa layers are in it.

    Called by every function that puts alfa layers into a model (truncate, restore_structure, attach). Only
    the model given and the models inside it are guarded: after ``alfa.truncate(model.vit, …)``,
    ``model.vit.save_pretrained`` refuses but the outer ``model.save_pretrained`` does not (alfa never sees
    the outer model); give alfa the model you will save.
    """
    for mod in model.modules():
        if callable(getattr(type(mod), "save_pretrained", None)) and "save_pretrained" not in vars(mod):
            # Module.__setattr__ stores a plain object in the instance dict, where it shadows the class method.
            mod.save_pretrained = _CheckedSavePretrained(mod)
