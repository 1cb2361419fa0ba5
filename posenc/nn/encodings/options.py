"""What an encoding records about itself: the arguments its constructor was called with (its
``options()`` by default) and the encodings nested in it (a mechanism's ``inner``, a layout's
kinds), whose ``param_groups`` are their own. Used by posenc/nn/encodings/base.py, which
re-exports them; this module imports nothing of posenc's.

The options are declared by the constructor's signature and recorded from the call itself:
``PositionalEncoding.__init_subclass__`` wraps every subclass's ``__init__`` in
``recording_arguments``, which binds the call's arguments to that signature
(``inspect.Signature.bind``) before the constructor runs. So an encoding written outside posenc
records ``init_slope`` with no code, whoever builds it (Hydra, a test, a subclass).

An encoding that writes its own ``options()`` (RoPE shows its scaling's keys only when it scales)
chooses among the arguments its own constructor declares; a subclass's constructor may declare more
(a plug-in deriving from RoPE with ``alpha_init``). ``with_subclass_arguments`` wraps such an
``options()`` so that what a subclass's constructor was called with beyond the arguments the class
that wrote ``options()`` declares is recorded too, beside its bases' options.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from torch import nn

#: constructor arguments the builder passes (posenc/build.py) or that name the encoding: not options
BUILDER_ARGUMENTS = ("self", "d_model", "n_head", "name", "n_layer", "train_len")
#: the attribute the outermost constructor's arguments are recorded under
OPTIONS = "_constructed_with"


def plain_arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, object]:
    """The arguments a call binds to signature, defaults applied, but BUILDER_ARGUMENTS and those
    that are not plain values (numbers, strings, booleans, None, lists of them: an ``inner``
    encoding is not one): what ``options()`` shows by default."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    plain = (bool, int, float, str)
    out: dict[str, object] = {}
    for arg, value in bound.arguments.items():
        kind = signature.parameters[arg].kind
        if arg in BUILDER_ARGUMENTS or kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if value is None or isinstance(value, plain):
            out[arg] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, plain) for v in value):
            out[arg] = list(value)
    return out


def recording_arguments(init: Callable[..., None]) -> Callable[..., None]:
    """init, recording the plain arguments of the call under OPTIONS first. Only the outermost
    constructor records (the class being built): a subclass's ``super().__init__`` finds them set."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def recording_init(self: nn.Module, *args, **kwargs) -> None:
        if OPTIONS not in self.__dict__:
            try:
                options = plain_arguments(signature, (self, *args), kwargs)
            except TypeError:  # arguments the signature refuses: the constructor says so itself
                options = {}
            self.__dict__[OPTIONS] = options
        init(self, *args, **kwargs)

    return recording_init


def with_subclass_arguments(options: Callable[..., dict[str, object]], owner: type) -> Callable[..., dict[str, object]]:
    """options (written by class owner), with the recorded constructor arguments that owner's
    constructor does not declare added after its own: those a subclass's constructor took."""
    declared = set(inspect.signature(owner.__init__).parameters)

    @functools.wraps(options)
    def with_arguments(self: nn.Module) -> dict[str, object]:
        own = options(self)
        recorded = self.__dict__.get(OPTIONS, {})
        return {**own, **{k: v for k, v in recorded.items() if k not in declared and k not in own}}

    return with_arguments


def outermost_encodings(encoding: nn.Module, kind: type[nn.Module]) -> list[nn.Module]:
    """The modules of class ``kind`` (the encoding base class) inside encoding that no other such
    module inside it contains (what its ``param_groups`` hands over to their own)."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in encoding.named_modules():
        if module is encoding or not isinstance(module, kind):
            continue
        if not any(name.startswith(outer + ".") for outer, _ in found):
            found.append((name, module))
    return [module for _, module in found]
