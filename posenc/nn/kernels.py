"""A run's kernels: what each layer kind runs, what fell back and why, and the one place a failure
changes them.

One ``KernelPolicy`` per model (``GPT.kernels``; so one per training run, per model of a bench, per
evaluation, and one per check or test that plans outside a model), passed where a choice is made:
attention's ``plan`` (posenc/nn/attention.py) asks which FlexAttention configuration a layer kind
compiles with now and whether an encoding's own kernel was refused; a recurrent layer asks whether
fla's kernel may run (posenc/nn/fla_kernels.py). Nothing is shared between runs: a sweep's second
job, or a bench's next model, starts where the first started, and says its own warnings again.

**One recovery.** Wherever a kernel fails (an eager FlexAttention call, posenc/nn/flex.py; an
encoding's own kernel refusing, at its plan or when it runs, posenc/nn/attention.py; fla's first use,
posenc/nn/fla_kernels.py; a training step, posenc/train/state.py), the failure, classified
(posenc/nn/failures.py), and what was running there (``Running``) go to the policy: ``decide`` turns
them into one typed ``Decision`` (retake, after these changes; or raise), ``apply`` carries it out,
recorded as a ``Fallback`` and said in one warning, and ``retry`` is the one loop that takes
something again, at most ``failures.MAX_ATTEMPTS`` times. Under DDP the ranks merge their decisions
(``Decision.merged``) before any is applied (posenc/train/recovery.py). A decision may:

- raise dynamo's recompile limit (the run's limit for its compilations, ``compiling``);
- step a FlexAttention kernel one rung down its ladder (below), to the dense path at the end;
- refuse an encoding's own kernel (its layers take the hooks) or fla's kernel for a recurrence
  (its layers take the chunked PyTorch form) for the rest of the run;
- run the model uncompiled (a compilation failed outside attention).

**The ladder.** FlexAttention's Triton kernels are generated per score_mod and shape when first
called, so a configuration can fail only then: shared memory beyond the device's (T5's captured
table at head dim 64 on sm_90 asked for 245,760 bytes of 232,448 with torch's default stages), a
lowering this torch lacks, a Triton error. For each FlexAttention kernel of a layer kind (its kind,
encoding, head dim and dtype: a ``KernelKey``) the ladder is

    torch's own choice  ->  smaller configurations that fit the device's shared memory
                        ->  the dense path (SDPA with an explicit mask, posenc/nn/dense.py)

The smaller configurations are derived from the device's shared memory per block and the head dim:
a forward holds the query tile (BLOCK_M x d) and, per pipeline stage, a key and a value tile
(BLOCK_N x d each); the backward's loops hold two tiles of each side and stream the other, so a
configuration is tried only where ``d · itemsize · (BLOCK_M + 2 · stages · BLOCK_N)`` bytes fit
(``num_stages=2`` is what T5 needed on sm_90). Block sizes divide the BlockMask's 128.

**What a compiled trace asks.** ``plan`` and a recurrent layer ask the policy inside a compiled
model's trace. Every such question reads the policy's choices through one accessor, ``asked``, which
reads an int revision first: dynamo guards on it, so any change retraces the model (torch 2.7's
dynamo did not guard a dict looked up with a key the trace built, and reran the graph that had
failed). The choices are reachable only through it; ``_change`` moves the revision with every write.

A layer kind is a kind of the model's layout (posenc/nn/layout.py: ``global``, ``local``, a recurrent
kind), its layers, encoding and mixer known when the model is built; a model built without a layout
has one, ``global``. Its path is one of:

    sdpa_causal     SDPA's is_causal kernels (flash / cuDNN / memory-efficient): no bias, no mask beyond causality
    flex            FlexAttention, compiled, with torch's kernel configuration or the ``options`` of a step down
    dense           SDPA with an explicit mask (the float bias, -inf on hidden keys), query-chunked at long T;
                    with scores or a normaliser of the encoding's own, the weights written out
    fused:<op>      the encoding's own kernel (fla's parallel_forgetting_attn, parallel_path_attn, ...)
    linear          causal linear attention (model.attention=linear)
    fla:<op>        a recurrent kind through fla's chunked kernel (chunk_gated_delta_rule, ...)
    chunked         a recurrent kind through posenc's chunked PyTorch recurrence

and ``record()`` is what the run writes (summary.json, W&B, a bench row, eval.json): each layer kind's
path as it last ran (``KernelRecord``), whether the model ran compiled, every fallback with its reason
and step (read back by posenc/record/kernel_record.py), and the recompile limit the run ended with.
The step of a fallback is the training loop's: it stamps the fallbacks of each step (``stamp``).

The backend a compiled model and FlexAttention are built with is ``compile_backend()``: torch's
inductor, unless ``POSENC_COMPILE_BACKEND`` names another (``aot_eager``, or ``module:attribute`` of a
callable): a debugging aid, and how the tests inject a GPU's compile errors into a real
``torch.compile`` on a CPU.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import torch

from posenc.errors import PosencWarning
from posenc.nn import failures, torch_private
from posenc.nn.failures import Failure

SDPA_CAUSAL = "sdpa_causal"
FLEX = "flex"
DENSE_PATH = "dense"
LINEAR = "linear"
CHUNKED = "chunked"
HOOKS = "hooks"
#: the model as a whole: compiled, or uncompiled after a compilation failed outside attention
COMPILED = "compiled"
UNCOMPILED = "uncompiled"
#: the layer kind of a model built without a layout, and of a plan asked outside a model
DEFAULT_KIND = "global"
#: the environment variable naming another compile backend (module doc)
BACKEND_VARIABLE = "POSENC_COMPILE_BACKEND"
#: dynamo's recompile limit a run compiles under: a bench, `posenc check` or a sweep's jobs compile many
#: models (and score_mods) in one process, and past torch's default of 8 dynamo would run the rest
#: uncompiled without a word (FlexAttention then materialises every score)
RECOMPILE_LIMIT = 64

T = TypeVar("T")


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
    (the error's first line), and the optimizer step it happened in (None outside training)."""

    layer_kind: str
    encoding: str | None
    left: str
    took: str
    reason: str
    step: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- the ladder of FlexAttention kernel configurations (module doc) ---------------------------------
#: the configurations tried after torch's own, largest first (forward blocks, stages, warps);
#: the backward's four block sizes take the same BLOCK_M/BLOCK_N pair
CONFIGS: tuple[tuple[int, int, int, int], ...] = ((128, 64, 2, 4), (64, 64, 2, 4), (64, 32, 1, 4), (32, 32, 1, 4))
#: a step past the ladder: the layer kind computes its attention with an explicit mask
DENSE = "dense"
#: shared memory per block where the device does not say (sm_80's opt-in 163 KB would be larger)
DEFAULT_SHARED_MEMORY = 99 * 1024
#: the dtypes attention runs in, by name (a lookup a compiled model's trace takes as a constant)
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

KernelOptions = dict[str, int] | None


class KernelKey(NamedTuple):
    """A layer kind's FlexAttention kernels: the kind, its encoding (name and class), head dim and dtype.
    A tuple: plan() builds one inside a compiled model's trace, which takes tuples as they are."""

    kind: str
    encoding: str
    head_dim: int
    dtype: str


def kernel_key(kind: str, encoding: torch.nn.Module, head_dim: int, dtype: torch.dtype) -> KernelKey:
    """The key of layer kind ``kind``'s FlexAttention kernels, its encoding ``encoding`` (name and class)."""
    what = f"encoding '{getattr(encoding, 'name', type(encoding).__name__)}' ({type(encoding).__qualname__})"
    return KernelKey(kind, what, int(head_dim), DTYPES.get(dtype, "float32"))


def describe(key: KernelKey) -> str:
    return f"FlexAttention for the {key.kind} layers ({key.encoding}, head_dim {key.head_dim}, {key.dtype})"


def shared_memory() -> int:
    """Bytes of shared memory one thread block may use on the CUDA device this process runs on (opt-in
    maximum where known); DEFAULT_SHARED_MEMORY without one."""
    if not torch.cuda.is_available():
        return DEFAULT_SHARED_MEMORY
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
               or DEFAULT_SHARED_MEMORY)


def fits(config: tuple[int, int, int, int], head_dim: int, itemsize: int, budget: int) -> bool:
    """Whether a configuration's tiles fit ``budget`` bytes (the module doc's estimate)."""
    block_m, block_n, stages, _ = config
    return head_dim * itemsize * (block_m + 2 * stages * block_n) <= budget


def ladder(head_dim: int, itemsize: int, budget: int) -> list[KernelOptions]:
    """The configurations to try, in order: torch's own (None), then each of CONFIGS that fits,
    as FlexAttention's ``kernel_options`` (the smallest is kept even when none fits: a last try)."""
    fitting = [c for c in CONFIGS if fits(c, head_dim, itemsize, budget)] or [CONFIGS[-1]]
    out: list[KernelOptions] = [None]
    for block_m, block_n, stages, warps in fitting:
        out.append({"BLOCK_M": block_m, "BLOCK_N": block_n, "num_stages": stages, "num_warps": warps,
                    "bwd_BLOCK_M1": min(block_m, block_n), "bwd_BLOCK_N1": block_n,
                    "bwd_BLOCK_M2": block_n, "bwd_BLOCK_N2": min(block_m, block_n)})
    return out


# --- the one decision ------------------------------------------------------------------------------
class Action(enum.Enum):
    OK = "ok"          # the attempt succeeded (what a rank tells the others under DDP)
    RETAKE = "retake"  # take it again, after the decision's changes
    RAISE = "raise"    # the error ends it


@dataclass(frozen=True)
class Running:
    """What ran where a failure came from, which a decision may change: the FlexAttention kernels, the
    encodings' own kernels (layer kind, op), fla's recurrent kernels (rule, op), and whether the whole
    model is compiled (then a failed compilation elsewhere is the model's)."""

    flex: tuple[KernelKey, ...] = ()
    fused: tuple[tuple[str, str], ...] = ()
    recurrent: tuple[tuple[str, str], ...] = ()
    compiled_model: bool = False


@dataclass(frozen=True)
class Decision:
    """What to run instead after a failure (module doc): the action, the error's first line, the words a
    refusal came with (said as they are; else the policy's own), and the changes."""

    action: Action
    reason: str = ""
    said: str | None = None
    raise_limit: bool = False
    flex: tuple[KernelKey, ...] = ()
    fused: tuple[tuple[str, str], ...] = ()
    recurrent: tuple[tuple[str, str], ...] = ()
    uncompile: bool = False

    @classmethod
    def merged(cls, decisions: Sequence[Decision]) -> Decision:
        """Every rank's decision as one, the same on every rank: RAISE if any rank raises, else every
        change any rank asked for (OK where every rank succeeded)."""
        failed = [d for d in decisions if d.action is not Action.OK]
        if not failed:
            return cls(Action.OK)
        raising = [d for d in failed if d.action is Action.RAISE]
        if raising:
            return cls(Action.RAISE, raising[0].reason)
        return cls(Action.RETAKE, failed[0].reason, failed[0].said, any(d.raise_limit for d in failed),
                   tuple(sorted({k for d in failed for k in d.flex})),
                   tuple(sorted({f for d in failed for f in d.fused})),
                   tuple(sorted({r for d in failed for r in d.recurrent})),
                   any(d.uncompile for d in failed))


# --- what a run says, and what it ran --------------------------------------------------------------
@dataclass
class SaidOnce:
    """A run's warnings: each distinct message once per run (a sweep's next job says it again)."""

    said: set[str] = field(default_factory=set)

    def __call__(self, message: str) -> None:
        if message in self.said:
            return
        self.said.add(message)
        frame = sys._getframe(1)
        # no registry: Python's own once-per-location would silence the next run's warning
        warnings.warn_explicit(message, PosencWarning, frame.f_code.co_filename, frame.f_lineno, registry=None)


@dataclass
class KernelRecord:
    """What each layer kind ran, as it last ran (recorded outside any compiled trace: an eager forward's
    plans, ``GPT.planned``), its FlexAttention options where it took that path, and whether the model
    was asked to run compiled."""

    compile_asked: bool = False
    paths: dict[str, str] = field(default_factory=dict)
    options: dict[str, KernelOptions] = field(default_factory=dict)

    def saw(self, kind: str, path: str, options: KernelOptions = None) -> None:
        """Layer kind ``kind`` ran ``path`` (its FlexAttention options where it was flex)."""
        self.paths[kind] = path
        if path.startswith(FLEX) and options is not None:
            self.options[kind] = options
        else:
            self.options.pop(kind, None)


@dataclass
class Choices:
    """What a compiled trace asks of the run (read through ``KernelPolicy.asked`` alone): each stepped-down
    FlexAttention kernel's rung (level, options; DENSE past its ladder), the refused own kernels (layer
    kind -> why) and fla recurrences (rule -> why), and fla's kernels whose first use passed
    ((rule, device type, dtype, d_k, d_v) -> the kernel)."""

    flex: dict[KernelKey, tuple[int, KernelOptions | str]] = field(default_factory=dict)
    fused_refused: dict[str, str] = field(default_factory=dict)
    fla_refused: dict[str, str] = field(default_factory=dict)
    fla_passed: dict[tuple, Callable] = field(default_factory=dict)


# --- the policy ------------------------------------------------------------------------------------
@dataclass
class KernelPolicy:
    """The run's kernels (module doc): what runs and what fell back, and the one recovery."""

    kinds: dict[str, LayerKind] = field(default_factory=dict)
    #: the layer kind of each layer (empty: every layer is DEFAULT_KIND)
    layer_kind: tuple[str, ...] = ()
    #: whether the model runs compiled now
    compiled: bool = False
    #: dynamo's recompile limit for the run's compilations (``compiling``), doubled each time it is reached
    recompile_limit: int = RECOMPILE_LIMIT
    fallbacks: list[Fallback] = field(default_factory=list)
    #: how many decisions were applied: a step after a change compiles again (posenc/train/state.py)
    changes: int = 0
    ran: KernelRecord = field(default_factory=KernelRecord)
    say: SaidOnce = field(default_factory=SaidOnce)
    #: the first error of each FlexAttention kernel stepping down that has not compiled yet
    _pending: dict[KernelKey, str] = field(default_factory=dict)
    _revision: int = 0
    _choices: Choices = field(default_factory=Choices)

    @classmethod
    def for_layers(cls, kinds: Sequence[LayerKind]) -> KernelPolicy:
        """A fresh policy for a model whose layers are ``kinds``."""
        by_layer = {layer: kind.name for kind in kinds for layer in kind.layers}
        return cls({kind.name: kind for kind in kinds}, tuple(by_layer[layer] for layer in sorted(by_layer)))

    def kind_of(self, layer: int, encoding_name: str | None = None) -> str:
        """The layer kind of block ``layer`` (a plan asked outside a model: its encoding's name)."""
        if layer < len(self.layer_kind):
            return self.layer_kind[layer]
        return encoding_name or DEFAULT_KIND

    # --- what a compiled trace asks: through ``asked`` alone (module doc) ---------------------------
    def asked(self) -> Choices | None:
        """The run's choices as a question asked in a compiled trace reads them: the revision first, so
        that dynamo guards on it; None while nothing changed (the common case: no lookup to trace)."""
        return self._choices if self._revision != 0 else None

    def _change(self) -> Choices:
        """The choices, to be changed: the revision moves, so every compiled trace that asked retraces."""
        self._revision += 1
        return self._choices

    def flex_options(self, key: KernelKey) -> KernelOptions | str:
        """The kernel_options a FlexAttention kernel compiles with now: None (torch's own choice), a rung of
        its ladder, or DENSE once its ladder is spent."""
        choices = self.asked()
        return None if choices is None else choices.flex.get(key, (0, None))[1]

    def fused_is_refused(self, kind: str) -> bool:
        """Whether the layer kind's own kernel was refused in this run."""
        choices = self.asked()
        return choices is not None and kind in choices.fused_refused

    def fla_is_refused(self, rule: str) -> bool:
        """Whether fla's kernel for the recurrence was refused in this run."""
        choices = self.asked()
        return choices is not None and rule in choices.fla_refused

    def fla_kernel(self, rule: str, device_type: str, dtype: torch.dtype, dk: int, dv: int) -> Callable | None:
        """fla's kernel for the recurrence where its first use passed at this device, dtype and head sizes."""
        choices = self.asked()
        return None if choices is None else choices.fla_passed.get((rule, device_type, dtype, dk, dv))

    def fla_usable(self, rule: str, device_type: str, dtype: torch.dtype, dk: int, dv: int, kernel: Callable) -> None:
        """fla's kernel ran forwards and backwards here (its first use): the recurrence may take it."""
        self._change().fla_passed[(rule, device_type, dtype, dk, dv)] = kernel

    # --- outside a trace ---------------------------------------------------------------------------
    def flex_path(self, key: KernelKey) -> str:
        """'flex' with torch's configuration, 'flex #2 (BLOCK_M=64 BLOCK_N=64 stages=2)' at step 2 of
        its ladder, 'dense' past it."""
        level, options = self._choices.flex.get(key, (0, None))
        if options is None:
            return FLEX
        if options == DENSE:
            return DENSE_PATH
        return (f"{FLEX} #{level} (BLOCK_M={options['BLOCK_M']} BLOCK_N={options['BLOCK_N']} "
                f"stages={options['num_stages']})")

    def flex_failure(self, key: KernelKey) -> str | None:
        """Why a FlexAttention kernel left for the dense path, or None if it has not."""
        return next((f.reason for f in reversed(self.fallbacks)
                     if f.layer_kind == key.kind and f.took == DENSE_PATH and f.left.startswith(FLEX)), None)

    def fla_ran(self, rule: str, device_type: str) -> bool:
        """Whether fla's kernel for the recurrence passed a first use on device_type and is not refused."""
        return rule not in self._choices.fla_refused and any(
            r == rule and d == device_type for r, d, *_ in self._choices.fla_passed)

    @contextmanager
    def compiling(self) -> Iterator[None]:
        """Around a call that compiles (a compiled step, a compiled FlexAttention call): dynamo at the run's
        recompile limit, reaching it an error ``decide`` answers (never a silent fall to uncompiled code),
        and dynamo's config the process's again after."""
        with torch_private.recompile_limit_at(self.recompile_limit):
            yield

    # --- the one recovery (module doc) -------------------------------------------------------------
    def decide(self, failure: Failure, running: Running) -> Decision:
        """What runs instead after ``failure`` where ``running`` ran, or RAISE."""
        retake = functools.partial(Decision, Action.RETAKE, failure.reason, failure.said)
        if failure.kind == failures.RECOMPILE_LIMIT:
            return retake(raise_limit=True)
        if failure.kind == failures.REFUSAL and (running.fused or running.recurrent):
            return retake(fused=running.fused, recurrent=running.recurrent)
        if failure.kind == failures.COMPILE:
            # a compiled FlexAttention call alone: whatever failed to compile is its kernel; in a compiled
            # model, the kernel named in the error, else the model's own compilation
            if running.flex and (failure.flex or not running.compiled_model):
                return retake(flex=running.flex)
            if running.compiled_model:
                return retake(uncompile=True)
        return Decision(Action.RAISE, failure.reason)

    def apply(self, decision: Decision) -> None:
        """Carry out a RETAKE decision: each change recorded as a fallback and said once."""
        if decision.action is not Action.RETAKE:
            raise ValueError(f"only a decision to retake changes what runs, not {decision.action}")
        self.changes += 1
        if decision.raise_limit:
            self.recompile_limit *= 2
            self.say(f"dynamo's recompile limit was reached (many models or score_mods compiled in one process): "
                     f"{torch_private.RECOMPILE_LIMIT} raised to {self.recompile_limit} for this run's "
                     f"compilations, so that every kernel stays compiled")
        for kind, op in decision.fused:
            self._refuse_fused(kind, op, decision)
        for rule, op in decision.recurrent:
            self._refuse_recurrent(rule, op, decision)
        for key in decision.flex:
            self._step_down(key, decision.reason)
        if decision.uncompile and self.compiled:
            self.compiled = False
            self._fell_back("model", COMPILED, UNCOMPILED, decision.reason)
            self.say(f"torch.compile failed ({decision.reason}): the model trains uncompiled "
                     f"(slower; set trainer.compile=false to skip the attempt)")

    def recover(self, failure: Failure, running: Running) -> bool:
        """``decide`` and, where it says retake, ``apply``: whether the caller may take it again."""
        decision = self.decide(failure, running)
        if decision.action is not Action.RETAKE:
            return False
        self.apply(decision)
        return True

    def retry(self, attempt: Callable[[], T], decide: Callable[[Failure], Decision]) -> T:
        """attempt() until it returns; after each failure ``decide(classify(error))`` (``self.decide`` with
        what was running, or a decision the ranks agreed on) is applied and the attempt taken again, at most
        ``failures.MAX_ATTEMPTS`` times. A decision to raise raises the error, as the last attempt does."""
        for n in range(failures.MAX_ATTEMPTS):
            try:
                return attempt()
            except Exception as error:  # noqa: BLE001 - the decision chooses; whatever it refuses is raised
                if n == failures.MAX_ATTEMPTS - 1:
                    raise
                decision = decide(failures.classify(error))
                if decision.action is not Action.RETAKE:
                    raise
                self.apply(decision)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def settled(self, keys: Iterable[KernelKey]) -> None:
        """After a forward or step that compiled: for each kernel that had to step down, record and say once
        which configuration it runs with and why (its first error)."""
        for key in list(keys):
            if key in self._pending:
                why = self._pending.pop(key)
                self._fell_back(key.kind, FLEX, self.flex_path(key), why)
                self.say(f"{describe(key)} did not compile with torch's default configuration ({why}): "
                         f"it runs with kernel_options {self.flex_options(key)} instead")

    def pending(self) -> list[KernelKey]:
        """The FlexAttention kernels that stepped down and have not compiled since."""
        return list(self._pending)

    def stamp(self, since: int, step: int) -> None:
        """The fallbacks from index ``since`` on that have no step happened in optimizer step ``step``."""
        self.fallbacks[since:] = [f if f.step is not None else dataclasses.replace(f, step=step)
                                  for f in self.fallbacks[since:]]

    # --- the changes a decision makes ----------------------------------------------------------------
    def _fell_back(self, kind: str, left: str, took: str, reason: str) -> None:
        self.fallbacks.append(Fallback(kind, self.kinds[kind].encoding if kind in self.kinds else None,
                                       left, took, reason))

    def _step_down(self, key: KernelKey, reason: str) -> None:
        """``key``'s next configuration, or DENSE past its ladder (recorded and said at once). The first error
        is kept for the one warning ``settled`` gives."""
        # the path left: torch's choice, where no step down has compiled yet (the rungs tried since are the
        # warning's), else the rung it settled on
        before = FLEX if key in self._pending else self.flex_path(key)
        level = self._choices.flex.get(key, (0, None))[0] + 1
        steps = ladder(key.head_dim, ITEMSIZE.get(key.dtype, 4), shared_memory())
        self._change().flex[key] = (level, steps[level] if level < len(steps) else DENSE)
        self._pending.setdefault(key, reason)
        if self.flex_options(key) == DENSE:
            why = self._pending.pop(key)
            self._fell_back(key.kind, before, DENSE_PATH, why)
            self.say(f"{describe(key)} did not compile ({why}), nor did any smaller kernel configuration: "
                     f"attention falls back to SDPA with an explicit mask (slower, O(H·T²) memory per layer, "
                     f"query-chunked at long T); the run goes on")

    def _refuse_fused(self, kind: str, op: str, decision: Decision) -> None:
        """The layer kind's own kernel is not used again in this run: its layers take the hooks."""
        if kind in self._choices.fused_refused:
            return
        self._change().fused_refused[kind] = decision.reason
        self._fell_back(kind, f"fused:{op}", HOOKS, decision.reason)
        self.say(decision.said or f"flash-linear-attention's {op} refused in a training step ({decision.reason}): "
                                  f"the {kind} layers compute from their encoding's hooks for the rest of this run, "
                                  f"O(H·T²) memory per layer")

    def _refuse_recurrent(self, rule: str, op: str, decision: Decision) -> None:
        """fla's kernel for a recurrence is not used again in this run: its layers run the chunked form."""
        if rule in self._choices.fla_refused:
            return
        self._change().fla_refused[rule] = decision.reason
        for kind in [k.name for k in self.kinds.values() if k.mixer == rule] or [rule]:
            self._fell_back(kind, f"fla:{op}", CHUNKED, decision.reason)
        self.say(decision.said or f"flash-linear-attention's {op} refused in a training step ({decision.reason}): "
                                  f"the {rule} layers use the chunked PyTorch recurrence for the rest of this run")

    # --- the run's record --------------------------------------------------------------------------
    def record(self) -> dict:
        """How the run ran, as JSON (module doc)."""
        kinds = {}
        for name in [*self.kinds, *(p for p in self.ran.paths if p not in self.kinds)]:
            kind = self.kinds.get(name)
            entry = {} if kind is None else {"layers": list(kind.layers), "encoding": kind.encoding, "mixer": kind.mixer}
            entry["path"] = self.ran.paths.get(name)
            if name in self.ran.options:
                entry["options"] = self.ran.options[name]
            kinds[name] = entry
        return {"compiled": self.compiled, "compile_asked": self.ran.compile_asked, "layer_kinds": kinds,
                "fallbacks": [f.as_dict() for f in self.fallbacks], "recompile_limit": self.recompile_limit}


def compile_backend() -> str | Callable:
    """What torch.compile builds a model with: 'inductor', or what POSENC_COMPILE_BACKEND names
    (a registered backend, or ``module:attribute``)."""
    named = os.environ.get(BACKEND_VARIABLE, "").strip()
    if not named:
        return "inductor"
    if ":" not in named:
        return named
    module, _, attribute = named.partition(":")
    return getattr(importlib.import_module(module), attribute)
