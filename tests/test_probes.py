"""Attention probes: entropy and distance maths, faithfulness to the model, RoPE pair norms, bias curves."""

import json
import math
from pathlib import Path

import pytest
import torch

from posenc.build import build_model
from posenc.config import compose, group_options
from posenc.eval.probes import (attention_distance, attention_entropy, attention_probabilities, attention_probes,
                                capture_qkv, frequency_pairs, pair_sq_norms, split_heads, write_probe_figures)
from posenc.nn.encodings.alibi import ALiBi
from posenc.nn.encodings.rope import RoPE
from posenc.nn.model import GPT

D, H = 32, 4
ENCODINGS = group_options("encoding")


def model_with(encoding, n_layer=2):
    torch.manual_seed(0)
    return GPT(256, encoding, n_layer=n_layer, n_head=H, d_model=D)


def test_uniform_row_has_entropy_log_n_and_one_hot_row_entropy_zero_distance_i_minus_j():
    n = 7
    assert math.isclose(float(attention_entropy(torch.full((1, n), 1 / n))[0]), math.log(n), rel_tol=1e-6)
    T, i, j = 10, 8, 3
    p = torch.zeros(T, T)
    p[i, j] = 1.0
    pos = torch.arange(T)
    assert float(attention_entropy(p)[i]) == 0.0
    assert float(attention_distance(p, pos, pos)[i]) == i - j


@pytest.mark.parametrize("name", ENCODINGS)
def test_recomputed_attention_reproduces_the_models_attention_output(name):
    """The probes' attention probabilities are the model's own: with them and the model's values,
    every layer's attention output is reproduced, for every encoding (its bias, rotation,
    contextual positions or per-layer choice included)."""
    torch.manual_seed(0)
    model = build_model(compose([f"encoding={name}", "model.n_layer=2", f"model.n_head={H}", f"model.d_model={D}",
                                 "trainer.seq_len=24"]), 256)
    with torch.no_grad():  # learned tables start at zero (T5), gates and sinks small: give them something to show
        for p in model.encoding.parameters():
            p.normal_()
    idx = torch.randint(0, 256, (2, 24))
    outputs = {}
    hooks = [b.attn.register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o)) for i, b in enumerate(model.blocks)]
    probs = attention_probabilities(model, idx)
    for h in hooks:
        h.remove()
    qkv = capture_qkv(model, idx)
    for layer, block in enumerate(model.blocks):
        _, _, v = split_heads(qkv[layer], H)
        y = (probs[layer] @ v).transpose(1, 2).reshape(2, 24, D)  # (B, T, C)
        assert torch.allclose(block.attn.c_proj(y), outputs[layer], atol=1e-5)
        total = probs[layer].sum(-1)
        if model.encoding.offers("sink_logit"):  # the sink keeps a share of every row
            assert (total < 1).all() and (total > 0).all()
        else:
            assert torch.allclose(total, torch.ones(2, H, 24))
        assert (probs[layer].triu(1) == 0).all()  # causal


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_shipped_encoding_is_probed_from_what_it_offers(name):
    """Probes read capabilities, never a distance table they assume: a bias entry for each distinct
    layer encoding with a position bias, its distance table where it is relative (overrides
    distance_bias), else the rows of position_bias at several query positions (FIRE's bias
    divides by the query's position); nothing where no layer has a bias."""
    torch.manual_seed(0)
    model = build_model(compose([f"encoding={name}", "model.n_layer=2", f"model.n_head={H}", f"model.d_model={D}",
                                 "trainer.seq_len=24"]), 256)
    probes = attention_probes(model, torch.randint(0, 256, (1, 24)))
    json.dumps(probes)
    biased = [model.encoding.for_layer(layer) for layer in range(2) if model.encoding.for_layer(layer).offers("position_bias")]
    if not biased:
        assert probes["bias"] is None
        return
    [b] = probes["bias"]
    assert b["relative"] == biased[0].offers("distance_bias") and len(b["bias"]) == H and len(b["bias"][0]) == 24
    if not b["relative"]:
        last = biased[0].position_bias(torch.arange(24), torch.arange(24))[:, -1].flip(-1)  # (H, 24) by distance
        assert torch.allclose(torch.tensor(b["bias"]), last.float()) and set(b["by_query"]) == {"5", "11", "23"}


def per_layer_absolute_bias():
    """What no shipped encoding is: a plug-in whose layers each have their own absolute bias
    b^l_h(i, j) = -g_l·(i - j)/(i + 1) (``for_layer``)."""
    from posenc.nn.encodings.base import PositionalEncoding

    class Absolute(PositionalEncoding):
        def __init__(self, gate: float) -> None:
            super().__init__(D, H, "normalised_distance")
            self.gate = torch.nn.Parameter(torch.full((H,), gate))

        def position_bias(self, q_pos, k_pos):  # b_h(i, j) = -g_h·(i - j)/(i + 1): not of i - j alone
            n = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0).to(self.gate.dtype)
            return -self.gate[:, None, None] * (n / (q_pos[..., :, None] + 1).to(self.gate.dtype)).unsqueeze(-3)

    class PerLayer(PositionalEncoding):
        def __init__(self) -> None:
            super().__init__(D, H, "per_layer")
            self.layers = torch.nn.ModuleList(Absolute(g) for g in (1.0, 3.0))

        def for_layer(self, layer):
            return self.layers[layer]

    return PerLayer()


def test_a_plugins_per_layer_absolute_bias_is_probed_and_drawn_per_layer(tmp_path):
    model = model_with(per_layer_absolute_bias())
    probes = attention_probes(model, torch.randint(0, 256, (1, 16)))
    first, second = probes["bias"]
    assert (first["layers"], second["layers"]) == ([0], [1]) and not first["relative"]
    assert first["by_query"]["3"][0] == pytest.approx([-n / 4 for n in range(4)])  # b(3, 3 - n) = -n/4
    assert second["by_query"]["3"][0] == pytest.approx([-3 * n / 4 for n in range(4)])
    names = {p.name for p in write_probe_figures(probes, tmp_path, train_length=8)}
    assert {"bias_layer0.png", "bias_layer1.png"} <= names


@pytest.mark.parametrize("style,fraction", [("interleaved", 1.0), ("half", 1.0), ("half", 0.5)])
def test_rope_pair_norms_sum_to_the_squared_norm_of_q(style, fraction):
    q = torch.randn(3, 5, 16)
    pairs = frequency_pairs(16, int(16 * fraction), style)
    assert sorted(pairs.flatten().tolist()) == list(range(16))  # every dimension in one pair
    assert torch.allclose(pair_sq_norms(q, pairs).sum(-1), q.pow(2).sum(-1))


def test_rope_pairs_are_the_pairs_it_rotates_together():
    """Rotation preserves the norm of each pair it rotates, and no other grouping."""
    rope = RoPE(D, H, style="half")
    rope.prepare(8)
    from posenc.nn.encodings.base import Context
    q = torch.randn(1, H, 8, D // H)
    rq, _ = rope.transform_qk(q, q, Context.arange(8))
    pairs = frequency_pairs(D // H, rope.rot_dim, "half")
    assert torch.allclose(pair_sq_norms(rq, pairs), pair_sq_norms(q, pairs), atol=1e-5)


def test_probes_are_json_ready_and_shaped_per_layer_head_and_position(tmp_path):
    model = model_with(RoPE(D, H))
    probes = attention_probes(model, torch.randint(0, 256, (2, 16)))
    json.dumps(probes)
    assert len(probes["entropy"]) == 2 and len(probes["entropy"][0]) == H and len(probes["entropy"][0][0]) == 16
    assert all(e <= m + 1e-5 for row in probes["entropy"][1] for e, m in zip(row, probes["max_entropy"]))
    rot = probes["rotary"]
    assert len(rot["q_sq_norm"]) == 2 and len(rot["theta"]) == D // H // 2 and probes["bias"] is None
    assert rot["theta"] == sorted(rot["theta"], reverse=True)  # pair 0 is the fastest
    paths = write_probe_figures(probes, tmp_path, train_length=8)
    assert {p.name for p in paths} == {"entropy_T16.png", "distance_T16.png", "rotary_pairs.png"}


def test_bias_curve_is_alibis_linear_penalty():
    probes = attention_probes(model_with(ALiBi(D, H)), torch.randint(0, 256, (1, 12)))
    [b] = probes["bias"]  # one encoding, shared by both layers
    assert b["layers"] == [0, 1] and b["relative"] and "by_query" not in b
    slopes = ALiBi(D, H).slopes
    for h, row in enumerate(b["bias"]):
        assert row == pytest.approx([-float(slopes[h]) * n for n in b["distance"]])
    assert probes["rotary"] is None


def test_linear_attention_is_refused():
    model = GPT(256, RoPE(D, H), n_layer=1, n_head=H, d_model=D, attention="linear")
    with pytest.raises(ValueError, match="softmax"):
        attention_probes(model, torch.randint(0, 256, (1, 8)))


def test_probes_at_several_lengths_write_json_and_one_figure_set_per_length(tmp_path):
    from posenc.eval.probes import probe_lengths, write_probes

    model = model_with(ALiBi(D, H))
    result = probe_lengths(model, {T: torch.randint(0, 256, (1, T)) for T in (8, 16)})
    paths = write_probes(result, tmp_path, train_length=8)
    assert json.loads((tmp_path / "probes.json").read_text()).keys() == {"8", "16"}
    names = {str(p.relative_to(tmp_path)) for p in paths}
    assert {"T8/entropy_T8.png", "T16/bias.png", "entropy_vs_length.png"} <= names
    assert all(p.exists() for p in paths)


def test_posenc_probe_writes_its_figures_into_the_run_dir(workdir):
    """`posenc probe RUN_DIR` on any finished run: probes.json and PNGs at 1x, 2x, 4x its length."""
    import json

    from conftest import TINY, run_cli, run_dirs

    assert run_cli("train", *TINY, "encoding=fire", cwd=workdir).returncode == 0  # a bias that is not of i − j alone
    run = run_dirs(workdir)[0]
    result = run_cli("probe", str(run), cwd=workdir)
    assert result.returncode == 0, result.stderr
    probes = json.loads((run / "probes" / "probes.json").read_text())
    assert set(probes) == {"32", "64", "128", "checkpoint_proof"}  # TINY trains at 32 tokens
    assert probes["checkpoint_proof"]["holds"] is True  # the checkpoint rebuilt the model that trained (eval/proof.py)
    assert (run / "probes" / "entropy_vs_length.png").stat().st_size > 0
    assert list((run / "probes" / "T32").glob("*.png"))
    assert (run / "probes" / "T128" / "bias.png").stat().st_size > 0
    assert set(probes["128"]["bias"][0]["by_query"]) == {"31", "63", "127"}  # FIRE's rows at 3 queries


def test_probe_figures_name_the_run_and_tick_the_probed_lengths(tmp_path, monkeypatch):
    """Every figure says which run and encoding it shows; the length axis reads 8, 16, 32, not
    powers of ten; the training-length line is in the legend."""
    import matplotlib.figure

    from posenc.eval.probes import probe_lengths, write_probes

    seen = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, path, *args, **kwargs):
        texts = [fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes]
        seen.append((Path(path).name.removesuffix(".tmp"), texts, fig))
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    model = model_with(RoPE(D, H))
    write_probes(probe_lengths(model, {T: torch.randint(0, 256, (1, T)) for T in (8, 16, 32)}), tmp_path,
                 train_length=8, title="run-7 · rope base=10000")
    assert len(seen) >= 7
    for name, texts, _ in seen:
        assert any("run-7 · rope base=10000" in s for s in texts), name
    (_, _, fig), = [s for s in seen if s[0] == "entropy_vs_length.png"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["8", "16", "32"]
    assert "training length 8" in [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_entropy_figures_stay_readable_with_many_heads_at_long_lengths(tmp_path, monkeypatch):
    """8 heads at 512 positions: each layer's panel draws the mean over heads and their range, a
    bounded number of lines whatever the heads, on a log position axis where the training length
    (ticked) gets the room its doublings deserve, not 1/16 of the panel."""
    import posenc.eval.probe_figures as probes_module

    kept = []
    monkeypatch.setattr(probes_module, "save_figure", lambda fig, path: kept.append((Path(path).name, fig)) or path)
    torch.manual_seed(0)
    model = GPT(256, RoPE(D, 8), n_layer=2, n_head=8, d_model=D)
    write_probe_figures(attention_probes(model, torch.randint(0, 256, (1, 512))), tmp_path, train_length=32)
    [fig] = [f for name, f in kept if name == "entropy_T512.png"]
    assert len(fig.axes) == 2  # a panel per layer
    for ax in fig.axes:
        assert len(ax.get_lines()) <= 3  # mean over heads, a uniform row, the training length: not 8 heads
        assert "32" in [t.get_text() for t in ax.get_xticklabels()]
        to_pixels = ax.transData.transform
        below = to_pixels((32, 0))[0] - to_pixels((0, 0))[0]
        assert below >= 0.3 * ax.get_window_extent().width  # a linear axis would give it 1/16
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "mean over heads" in labels and "range over the 8 heads" in labels


def test_each_lengths_distance_map_reads_on_its_own_scale_and_the_rotary_pairs_are_drawn_once(tmp_path, monkeypatch):
    """One colour scale over every length left T=8 a single dark colour beside T=32's range: each
    map takes its own range, and its numbers are written in its cells, which compare across lengths
    where colours cannot. The rotary pair norms hardly move with the length: one figure, which says
    by how much the others differ, not one per length."""
    import matplotlib.figure

    from posenc.eval.probes import probe_lengths, write_probes

    maps = {}
    save = matplotlib.figure.Figure.savefig

    def spy(fig, path, *args, **kwargs):
        name = Path(path).name.removesuffix(".tmp")
        if name.startswith("distance_T"):
            maps[name] = (fig.axes[0].images[0].get_clim(), [t.get_text() for t in fig.axes[0].texts])
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    result = probe_lengths(model_with(RoPE(D, H)), {T: torch.randint(0, 256, (1, T)) for T in (8, 32)})
    paths = write_probes(result, tmp_path, train_length=8)
    for T in (8, 32):
        values = [v for row in result[str(T)]["distance"] for v in row]
        limits, texts = maps[f"distance_T{T}.png"]
        assert limits == pytest.approx((min(values), max(values)))
        assert len(texts) == len(values) and texts[0] == (f"{values[0]:.0f}" if values[0] >= 10 else f"{values[0]:.1f}")
    assert [p.relative_to(tmp_path) for p in paths if p.name == "rotary_pairs.png"] == [Path("rotary_pairs.png")]
