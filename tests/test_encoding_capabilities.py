"""What posenc draws, probes, records and optimises comes from the hooks an encoding offers and
the arguments it was built with, never from its name: shown on the out-of-tree plugin of
test_plugins.py and on the shipped encodings."""

from __future__ import annotations


import pytest
import torch

from test_plugins import plugin  # noqa: F401 - the shared plug-in package fixture


def test_options_default_to_the_constructors_arguments(plugin):
    from myplug.encodings import LearnedRoPE, LogDistanceBias

    from posenc.nn.encodings.alibi import ALiBi
    from posenc.nn.encodings.rope import RoPE

    assert LogDistanceBias(32, 2, init_slope=0.5).options() == {"init_slope": 0.5, "slope_lr_scale": 1.0}
    assert LearnedRoPE(32, 2, base=500.0).options() == {"base": 500.0}
    assert ALiBi(32, 2).options() == {}  # only sizes: nothing to show
    assert RoPE(32, 2).options() == {"base": 10000, "fraction": 1.0, "style": "interleaved"}  # its own override


def test_options_are_recorded_from_the_call_whoever_makes_it(plugin):
    """The arguments bound to the constructor's signature, defaults included, by keyword or by
    position, through a subclass's super().__init__ or a factory: never the sizes or the name."""
    import functools

    from myplug.encodings import LogDistanceBias

    class Steeper(LogDistanceBias):
        def __init__(self, d_model: int, n_head: int, steepness: int = 3) -> None:
            super().__init__(d_model, n_head, "steeper", init_slope=float(steepness))

    assert LogDistanceBias(32, 2, "logdist", 0.5).options() == {"init_slope": 0.5, "slope_lr_scale": 1.0}
    assert functools.partial(LogDistanceBias, 32, slope_lr_scale=3.0)(2).options() == {"init_slope": 1.0,
                                                                                       "slope_lr_scale": 3.0}
    assert Steeper(32, 2, steepness=4).options() == {"steepness": 4}  # the class built, not the one it extends


def test_a_bias_is_offered_by_either_hook_and_relative_only_by_its_distance_table(plugin):
    """One query, offers(hook): a bias written as a distance table alone (the plug-in's log-distance
    bias, ALiBi, Kerple) offers the dense position bias derived from it and is relative; a bias of i
    and j apart (FIRE, the plug-in's normalised distance) offers position_bias and is not."""
    from myplug.encodings import LogDistanceBias, NormalisedDistance

    from posenc.build import build_encoding
    from posenc.config import compose, group_options

    relative, biased = set(), set()
    for name in group_options("encoding"):
        encoding = build_encoding(compose([f"encoding={name}", "model.d_model=32", "model.n_head=2"], bench=False))
        relative |= {name} if encoding.offers("distance_bias") else set()
        biased |= {name} if encoding.offers("position_bias") else set()
    assert relative == {"alibi", "kerple", "t5_bias"} and biased == relative | {"fire"}
    written_once, absolute = LogDistanceBias(32, 2), NormalisedDistance(32, 2)
    assert written_once.offers("position_bias") and written_once.offers("distance_bias") and written_once.needs_scores
    assert absolute.offers("position_bias") and not absolute.offers("distance_bias")
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [3, 4, 0, 1, 2, 3]])  # (B, T): positions restart in a document
    bias = written_once.position_bias(pos[:, 2:], pos)  # a slice of queries, as long evaluation asks
    table = written_once.distance_bias(torch.arange(8))  # (H, 8)
    assert bias.shape == (2, 2, 4, 6)
    for b, i, j in ((0, 2, 0), (0, 5, 5), (1, 4, 2), (1, 5, 0)):  # bias of query i and key j = table at i - j
        assert torch.equal(bias[b, :, i - 2, j], table[:, pos[b, i] - pos[b, j]])
    with pytest.raises(ValueError, match="not a hook of the encoding contract"):
        written_once.offers("sink")


def test_figure_family_and_rotary_probe_come_from_hooks_not_names(plugin):
    from posenc.eval.probes import attention_probes
    from posenc.nn.model import GPT
    from posenc.report.style import ADDITIVE, BIAS, ROTARY, family_of, styles_for

    assert family_of("myplug.encodings.LogDistanceBias") == BIAS
    assert family_of("myplug.encodings.LearnedRoPE") == ROTARY
    assert family_of("posenc.nn.encodings.sinusoidal.Sinusoidal") == ADDITIVE
    # a bias encoding labelled with a rotary encoding's name is still drawn as a bias (beside another family;
    # a figure of one family draws each group in a line style of its own: report/style.py)
    assert styles_for(["rope", "mine", "nope"], {"rope": BIAS, "mine": BIAS, "nope": ADDITIVE})["rope"].linestyle == BIAS

    from myplug.encodings import LearnedRoPE

    encoding = LearnedRoPE(32, 2)
    with torch.no_grad():
        encoding.log_theta.mul_(0.5)  # learned frequencies, moved from their initial values
    probes = attention_probes(GPT(256, encoding, n_layer=2, n_head=2, d_model=32), torch.randint(0, 256, (1, 16)))
    assert probes["rotary"]["theta"] == pytest.approx(encoding.log_theta.exp().tolist())
    assert len(probes["rotary"]["q_sq_norm"]) == 2


def test_param_groups_reach_the_optimizer(plugin):
    from myplug.encodings import LogDistanceBias
    from omegaconf import OmegaConf

    from posenc.nn.model import GPT
    from posenc.train.state import configure_optimizer

    tcfg = OmegaConf.create({"lr": 1e-3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95})
    model = GPT(256, LogDistanceBias(32, 2, slope_lr_scale=30.0), n_layer=1, n_head=2, d_model=32)
    groups = configure_optimizer(model, tcfg, torch.device("cpu")).param_groups
    own = [g for g in groups if any(p is model.encoding.log_slope for p in g["params"])]
    assert len(groups) == 3 and len(own) == 1 and own[0]["params"] == [model.encoding.log_slope]
    assert own[0]["lr"] == pytest.approx(30 * 1e-3) and own[0]["weight_decay"] == 0.0
    assert groups[0]["weight_decay"] == 0.1 and groups[0]["lr"] == 1e-3


def test_every_shipped_encodings_optimizer_groups_are_the_documented_default():
    """No decay on the encoding's parameters, biases and norms; decay on the other matrices, at
    trainer.lr: the default hook keeps the optimiser (and every published number) as it was."""
    from omegaconf import OmegaConf

    from posenc.build import build_model
    from posenc.config import compose, group_options
    from posenc.train.state import configure_optimizer

    tcfg = OmegaConf.create({"lr": 1e-3, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95})
    for name in group_options("encoding"):
        model = build_model(compose([f"encoding={name}", "model.n_layer=2", "model.n_head=2", "model.d_model=32",
                                     "trainer.seq_len=32"], bench=False), 256)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        decay = [p for n, p in named if p.dim() >= 2 and not n.startswith("encoding.")]
        rest = [p for n, p in named if p.dim() < 2 or n.startswith("encoding.")]
        groups = configure_optimizer(model, tcfg, torch.device("cpu")).param_groups
        assert len(groups) == 2, name
        assert [id(p) for p in groups[0]["params"]] == [id(p) for p in decay] and groups[0]["weight_decay"] == 0.1
        assert [id(p) for p in groups[1]["params"]] == [id(p) for p in rest] and groups[1]["weight_decay"] == 0.0


def test_compare_counts_10000_and_10000_0_as_one_value():
    from posenc.report.setup import describe_varied, fixed_and_varied

    runs = [{"encoding.base": 10000}, {"encoding.base": 10000.0}, {"encoding.name": "alibi"}]
    assert describe_varied(fixed_and_varied(runs)[1]) == ""  # one value where set: nothing varied
    runs.append({"encoding.base": 500})
    assert describe_varied(fixed_and_varied(runs)[1]) == "encoding.base ∈ {500, 10000} (where set)"
