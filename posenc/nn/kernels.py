"""A run's kernels: what each layer kind runs, what fell back, why and at which step.

One ``KernelPolicy`` per model (``GPT.kernels``; so one per training run, per model of a bench,
per evaluation), owned by the run that built the model and passed where a choice is made:
attention's ``plan`` (posenc/nn/attention.py) asks it which FlexAttention configuration a layer
kind compiles with now and whether an encoding's own kernel was refused; a recurrent layer asks
whether fla's kernel may run (posenc/nn/fla_kernels.py); the train step (posenc/train/recovery.py)
tells it what failed. Nothing is shared between runs: a sweep's second job, or a bench's next
model, starts where the first started, and says its own warnings again. What a run inherits from
its process (dynamo's recompile limit, raised by an earlier model) is recorded as inherited.

Attention's maths (score_mods, masks, the plans' arithmetic) never reads the policy: the policy
answers the plan's questions (which configuration, which kernel is refused) and records answers.

A layer kind is a kind of the model's layout (posenc/nn/layout.py: ``global``, ``local``, a
recurrent kind), its layers, encoding and mixer known when the model is built; a model built
without a layout has one, ``global``. Its path is one of:

    sdpa_causal     SDPA's is_causal kernels (flash / cuDNN / memory-efficient): no bias, no mask beyond causality
    flex            FlexAttention, compiled, with torch's kernel configuration or the ``options`` of a step down
    dense           SDPA with an explicit mask (the float bias, -inf on hidden keys), query-chunked at long T;
                    with scores or a normaliser of the encoding's own, the weights written out
    fused:<op>      the encoding's own kernel (fla's parallel_forgetting_attn, parallel_path_attn, ...)
    linear          causal linear attention (model.attention=linear)
    fla:<op>        a recurrent kind through fla's chunked kernel (chunk_gated_delta_rule, ...)
    chunked         a recurrent kind through posenc's chunked PyTorch recurrence

and ``record()`` is what the run writes (summary.json, W&B, a bench row, eval.json): each layer
kind's path as it last ran, whether the model ran compiled, and every fallback (``Fallback``)
with its reason and step (read back by posenc/record/kernel_record.py). Each fallback is said once
per run in one ``warning:`` line.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from posenc.errors import PosencWarning
from posenc.nn import failures
from posenc.nn.flex_kernels import (
    DENSE,
    ITEMSIZE,
    KernelKey,
    KernelOptions,
    describe,
    ladder,
    shared_memory,
)

SDPA_CAUSAL = "sdpa_causal"
FLEX = "flex"
DENSE_PATH = "dense"
LINEAR = "linear"
CHUNKED = "chunked"
#: the model as a whole: compiled, or uncompiled after a compilation failed outside attention
COMPILED = "compiled"
UNCOMPILED = "uncompiled"
#: the layer kind of a model built without a layout, and of a plan asked outside a model
DEFAULT_KIND = "global"


@dataclass(frozen=True)
class LayerKind:
    """One kind of the model's layout: which layers, their encoding's name and their token mixer."""

    name: str
    layers: tuple[int, ...]
    encoding: str
    mixer: str = "softmax"


@dataclass(frozen=True)
class Fallback:
    """One step off a path: the layer kind (or ``model``), the path left and the path taken, why
    (the error's first line), and the optimizer step being taken (None outside training)."""

    layer_kind: str
    encoding: str | None
    left: str
    took: str
    reason: str
    step: int | None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class KernelPolicy:
    """The run's kernel state and record (module doc)."""

    kinds: dict[str, LayerKind] = field(default_factory=dict)
    #: the layer kind of each layer (empty: every layer is DEFAULT_KIND)
    layer_kind: tuple[str, ...] = ()
    #: how often what a compiled trace asks here changed: each question (flex_options, fused_is_refused,
    #: fla_is_refused) reads it first, so dynamo guards on an int and a change retraces the model (torch
    #: 2.7 did not guard a dict looked up with a KernelKey the trace built, and reran the failed graph)
    revision: int = 0
    #: how far down its ladder each FlexAttention kernel has stepped (0: torch's own configuration)
    flex_level: dict[KernelKey, int] = field(default_factory=dict)
    #: the first error of each FlexAttention kernel stepping down that has not compiled yet
    flex_pending: dict[KernelKey, str] = field(default_factory=dict)
    #: the layer kinds whose own (fused) kernel was refused, and why
    fused_refused: dict[str, str] = field(default_factory=dict)
    #: the recurrences fla's kernel was refused for (rule -> why), and the first uses that passed
    fla_refused: dict[str, str] = field(default_factory=dict)
    fla_passed: set[tuple] = field(default_factory=set)
    #: whether the model was asked to run compiled, and whether it still does
    compile_asked: bool = False
    compiled: bool = False
    #: each layer kind's path as it last ran, and its FlexAttention options where it took that path
    paths: dict[str, str] = field(default_factory=dict)
    options: dict[str, KernelOptions] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)
    #: the optimizer step being taken (1-based), None outside training
    step: int | None = None
    #: whether the next step compiles (the first, and the one after a fallback): taken in step with the
    #: other ranks under DDP, and its paths recorded once it ran (posenc/train/recovery.py)
    settling: bool = True
    #: what this run found set by an earlier one in its process, and what it set there itself
    inherited: list[str] = field(default_factory=list)
    process: list[str] = field(default_factory=list)
    _said: set[str] = field(default_factory=set)
    _logged: int = 0

    # --- built ------------------------------------------------------------------------------------
    @classmethod
    def for_layers(cls, kinds: Sequence[LayerKind]) -> KernelPolicy:
        """A fresh policy for a model whose layers are ``kinds``; what the process already set is
        recorded as inherited (dynamo's recompile limit above posenc's, raised by an earlier model)."""
        by_layer = {layer: kind.name for kind in kinds for layer in kind.layers}
        policy = cls({kind.name: kind for kind in kinds}, tuple(by_layer[layer] for layer in sorted(by_layer)))
        if "torch._dynamo" in sys.modules and failures.recompile_limit() > failures.RECOMPILE_LIMIT_VALUE:
            policy.inherited.append(f"dynamo's recompile limit is {failures.recompile_limit()}, raised by an earlier "
                                    f"model in this process (posenc starts at {failures.RECOMPILE_LIMIT_VALUE})")
        return policy

    def kind_of(self, layer: int, encoding_name: str | None = None) -> str:
        """The layer kind of block ``layer`` (a plan asked outside a model: its encoding's name)."""
        if layer < len(self.layer_kind):
            return self.layer_kind[layer]
        return encoding_name or DEFAULT_KIND

    # --- said once per run ------------------------------------------------------------------------
    def warn(self, message: str) -> None:
        """One ``warning:`` line per distinct message per run (a sweep's next job says it again)."""
        if message in self._said:
            return
        self._said.add(message)
        frame = sys._getframe(1)
        # no registry: Python's own once-per-location would silence the next run's warning
        warnings.warn_explicit(message, PosencWarning, frame.f_code.co_filename, frame.f_lineno, registry=None)

    def fell_back(self, kind: str, left: str, took: str, reason: str, message: str | None = None) -> Fallback:
        """Record one fallback (and say it, when message)."""
        event = Fallback(kind, self.kinds[kind].encoding if kind in self.kinds else None, left, took, reason, self.step)
        self.fallbacks.append(event)
        if message:
            self.warn(message)
        return event

    # --- FlexAttention's ladder -------------------------------------------------------------------
    def flex_options(self, key: KernelKey, device: torch.device) -> KernelOptions | str:
        """The kernel_options a FlexAttention kernel compiles with now, or DENSE once its ladder is
        spent. At level 0 (torch's own choice) nothing is asked of the device: plan() calls this
        inside a compiled model's trace, and after a failure ``flex_failed`` has asked, outside it."""
        if self.revision == 0:  # nothing stepped down in this run (the guard: see ``revision``)
            return None
        level = self.flex_level.get(key, 0)
        if level == 0:
            return None
        steps = ladder(key.head_dim, ITEMSIZE.get(key.dtype, 4), shared_memory(device))
        return steps[level] if level < len(steps) else DENSE

    def flex_failed(self, key: KernelKey, reason: str, device: torch.device) -> KernelOptions | str:
        """After compiling ``key``'s kernels failed (``reason``: the error's first line): its next
        configuration, or DENSE (recorded and said at once). The first error is kept for the one
        warning ``flex_settled`` gives."""
        # the path left: torch's choice, where no step down has compiled yet (the rungs tried since are the
        # warning's), else the rung it settled on
        before = FLEX if key in self.flex_pending else self.flex_path(key, device)
        self.flex_level[key] = self.flex_level.get(key, 0) + 1
        self.revision += 1
        self.flex_pending.setdefault(key, reason)
        nxt = self.flex_options(key, device)
        if nxt == DENSE:
            why = self.flex_pending.pop(key)
            self.fell_back(key.kind, before, DENSE_PATH, why,
                           f"{describe(key)} did not compile ({why}), nor did any smaller kernel configuration: "
                           f"attention falls back to SDPA with an explicit mask (slower, O(H·T²) memory per layer, "
                           f"query-chunked at long T); the run goes on")
        return nxt

    def flex_settled(self, keys: Iterable[KernelKey], device: torch.device) -> None:
        """After a forward or step that compiled: for each kernel that had to step down, record and
        say once which configuration it runs with and why (its first error)."""
        for key in list(keys):
            if key in self.flex_pending:
                why = self.flex_pending.pop(key)
                options = self.flex_options(key, device)
                self.fell_back(key.kind, FLEX, self.flex_path(key, device), why,
                               f"{describe(key)} did not compile with torch's default configuration ({why}): "
                               f"it runs with kernel_options {options} instead")

    def flex_path(self, key: KernelKey, device: torch.device) -> str:
        """'flex' with torch's configuration, 'flex #2 (BLOCK_M=64 BLOCK_N=64 stages=2)' at step 2 of
        its ladder, 'dense' past it."""
        options = self.flex_options(key, device)
        if options is None:
            return FLEX
        if options == DENSE:
            return DENSE_PATH
        return (f"{FLEX} #{self.flex_level[key]} (BLOCK_M={options['BLOCK_M']} BLOCK_N={options['BLOCK_N']} "
                f"stages={options['num_stages']})")

    def flex_failure(self, key: KernelKey) -> str | None:
        """Why a FlexAttention kernel left for the dense path, or None if it has not."""
        return next((f.reason for f in reversed(self.fallbacks)
                     if f.layer_kind == key.kind and f.took == DENSE_PATH and f.left.startswith(FLEX)), None)

    # --- fla and an encoding's own kernel ---------------------------------------------------------
    def fused_is_refused(self, kind: str) -> bool:
        """Whether the layer kind's own kernel was refused in this run (asked inside a trace)."""
        return self.revision != 0 and kind in self.fused_refused

    def fla_is_refused(self, rule: str) -> bool:
        """Whether fla's kernel for the recurrence was refused in this run (asked inside a trace)."""
        return self.revision != 0 and rule in self.fla_refused

    def refuse_fused(self, kind: str, op: str, reason: str, message: str) -> None:
        """The layer kind's own kernel is not used again in this run: its layers take the hooks."""
        if kind not in self.fused_refused:
            self.fused_refused[kind] = reason
            self.revision += 1
            self.fell_back(kind, f"fused:{op}", "hooks", reason, message)

    def refuse_recurrent(self, rule: str, op: str, reason: str, message: str) -> None:
        """fla's kernel for a recurrence is not used again in this run: its layers run the chunked form."""
        if rule not in self.fla_refused:
            self.fla_refused[rule] = reason
            self.revision += 1
            for kind in [k.name for k in self.kinds.values() if k.mixer == rule] or [rule]:
                self.fell_back(kind, f"fla:{op}", CHUNKED, reason)
            self.warn(message)

    # --- the model as a whole ---------------------------------------------------------------------
    def uncompiled(self, reason: str) -> None:
        """The model runs uncompiled from this step on (a compilation failed outside attention)."""
        self.compiled = False
        self.fell_back("model", COMPILED, UNCOMPILED, reason,
                       f"torch.compile failed ({reason}): the model trains uncompiled "
                       f"(slower; set trainer.compile=false to skip the attempt)")

    def recompile_limit_raised(self, what: str) -> None:
        self.warn(f"this process compiled one function more often than dynamo's recompile limit allows (many models "
                  f"or score_mods in one process): {what} so that every kernel stays compiled")
        self.process.append(f"{what} during this run")

    # --- what ran ---------------------------------------------------------------------------------
    def saw(self, kind: str, path: str, options: KernelOptions = None) -> None:
        """Layer kind ``kind`` ran ``path`` (its FlexAttention options where it was flex)."""
        self.paths[kind] = path
        if path.startswith(FLEX) and options is not None:
            self.options[kind] = options
        else:
            self.options.pop(kind, None)

    def unlogged(self) -> list[Fallback]:
        """The fallbacks not yet handed out (the training loop logs each at its step)."""
        new = self.fallbacks[self._logged:]
        self._logged = len(self.fallbacks)
        return new

    def record(self) -> dict:
        """How the run ran, as JSON (module doc)."""
        kinds = {}
        for name in [*self.kinds, *(p for p in self.paths if p not in self.kinds)]:
            kind = self.kinds.get(name)
            entry = {} if kind is None else {"layers": list(kind.layers), "encoding": kind.encoding, "mixer": kind.mixer}
            entry["path"] = self.paths.get(name)
            if name in self.options:
                entry["options"] = self.options[name]
            kinds[name] = entry
        return {"compiled": self.compiled, "compile_asked": self.compile_asked, "layer_kinds": kinds,
                "fallbacks": [f.as_dict() for f in self.fallbacks], "inherited": list(self.inherited),
                "process": list(self.process)}


#: the policy of plans asked outside a model (a test, `posenc check`'s property checks), which are no
#: run: one for the process. A model's forward always passes its own (``GPT.kernels``).
OUTSIDE = KernelPolicy()
