"""Issue 26's presets: a recipe ablation is a config override (model.<switch>=...), a budget is a
multiple of the experiment's steps, and every swept value of the three presets composes."""

import math

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from posenc.build import build_model
from posenc.config import CONFIG_MODULE, apply_choice_schemas, group_options, parse_overrides, validate
from posenc.errors import UserError
from posenc.nn.blocks import MLP, RMSNorm, SwiGLU
from posenc.nn.flavors import SWITCHES

SHAPE = ["model.n_layer=2", "model.n_head=2", "model.d_model=64"]
PRESETS = ["recipe_ablation", "scale_ladder", "tasks_budget"]


def composed(overrides: list[str], hydra: bool = False):
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=hydra)
    return cfg


def built(overrides: list[str]):
    cfg = apply_choice_schemas(composed(["encoding=rope", *SHAPE, *overrides]))
    validate(cfg)
    torch.manual_seed(0)
    return build_model(cfg, vocab_size=256)


def recipe_of(model) -> dict:
    """The recipe read off the built modules (not off the Flavor): what a switch must change."""
    block = model.blocks[0]
    linears = [m for m in model.blocks.modules() if isinstance(m, torch.nn.Linear)]
    return {
        "norm": "rmsnorm" if isinstance(block.ln_1, RMSNorm) else type(block.ln_1).__name__.lower(),
        "mlp": {SwiGLU: "swiglu", MLP: "gelu"}[type(block.mlp)],
        "bias": all(m.bias is not None for m in linears),
        "tie_embeddings": model.lm_head.weight is model.wte.weight,
        # fan-in σ at d=64 is 1/√192 ≈ 0.072, GPT-2's 0.02: the qkv weights tell them apart
        "init": "gpt2" if block.attn.c_attn.weight.std().item() < 0.04 else "fan_in",
    }


@pytest.mark.parametrize("switch", SWITCHES)
def test_one_switch_under_llama_changes_that_component_to_gpt2s_and_keeps_the_rest(switch):
    llama, gpt2 = recipe_of(built(["model.flavor=llama"])), recipe_of(built(["model.flavor=gpt2"]))
    assert llama[switch] != gpt2[switch]  # each switch is one of the differences between the recipes
    value = str(gpt2[switch]).lower()
    switched = built(["model.flavor=llama", f"model.{switch}={value}"])
    assert recipe_of(switched) == {**llama, switch: gpt2[switch]}
    assert switched.flavor.name == f"llama+{switch}={value}"


def test_null_switches_leave_the_flavour_as_it_is():
    assert recipe_of(built(["model.flavor=gpt2", "model.mlp=null", "model.norm=null"])) == \
        recipe_of(built(["model.flavor=gpt2"]))
    assert built(["model.flavor=llama", "model.mlp=swiglu"]).flavor.name == "llama"  # no change, same name


def test_a_switch_to_an_unknown_component_is_a_user_error():
    with pytest.raises(UserError, match="mlp must be one of gelu, swiglu"):
        built(["model.mlp=relu"])


def sweep_values(preset: str) -> dict[str, list]:
    params = composed([f"experiment={preset}"], hydra=True).hydra.sweeper.params
    return {key: [o.value for o in parse_overrides([f"{key}={value}"])][0] for key, value in params.items()}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_swept_value_of_the_preset_composes_and_validates(preset):
    for key, values in sweep_values(preset).items():
        for value in values:
            cfg = apply_choice_schemas(composed([f"experiment={preset}", f"{key}={value}"]))
            validate(cfg)
            OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_every_recipe_preset_switches_exactly_one_component_to_the_other_flavours():
    """conf/recipe/<flavour>_<part>.yaml is <flavour> with one component taken from the other
    flavour; over the llama_* presets (the ablation) and the gpt2_* ones (its other direction)
    every component is switched once."""
    recipe = {f: recipe_of(built(["experiment=recipe_ablation", f"recipe={f}", *SHAPE])) for f in ("llama", "gpt2")}
    other = {"llama": "gpt2", "gpt2": "llama"}
    changed = {"llama": [], "gpt2": []}
    for option in group_options("recipe"):
        base = option.split("_")[0]
        if option == base:
            continue
        got = recipe_of(built(["experiment=recipe_ablation", f"recipe={option}", *SHAPE]))
        diff = [k for k in got if got[k] != recipe[base][k]]
        assert len(diff) == 1 and got[diff[0]] == recipe[other[base]][diff[0]], (option, diff)
        changed[base] += diff
    assert sorted(changed["llama"]) == sorted(changed["gpt2"]) == sorted(SWITCHES)
    swept = sweep_values("recipe_ablation")["recipe"]
    assert {"llama", "gpt2"} <= set(swept) and {o for o in swept if o.startswith("llama_")} == \
        {o for o in group_options("recipe") if o.startswith("llama_")}


@pytest.mark.parametrize("preset", ["scale_ladder", "tasks_budget"])
def test_a_budget_multiplies_the_tokens_and_changes_nothing_else(preset):
    def flat(budget: str) -> dict:
        cfg = composed([f"experiment={preset}", f"budget={budget}"])
        return {k: v for k, v in _flatten(OmegaConf.to_container(cfg, resolve=True)).items()}

    x1 = flat("x1")
    for factor in sweep_values(preset)["budget"]:
        other = flat(factor)
        f = other["budget.factor"]
        assert other["trainer.max_steps"] == x1["trainer.max_steps"] * f
        tokens = lambda c: c["trainer.max_steps"] * c["trainer.batch_size"] * c["trainer.seq_len"]  # noqa: E731
        assert math.isclose(tokens(other), f * tokens(x1))
        assert {k for k in x1 if x1[k] != other[k]} <= {"trainer.max_steps", "budget.factor"}


def test_the_ladder_runs_unchanged_at_the_gpu_sizes():
    """The same preset at model=small|base: only the model's shape differs from the CPU ladder."""
    ladder = composed(["experiment=scale_ladder"])
    for size in ("small", "base"):
        cfg = apply_choice_schemas(composed(["experiment=scale_ladder", f"model={size}"]))
        validate(cfg)
        assert cfg.trainer == ladder.trainer and cfg.eval == ladder.eval and cfg.model.d_model > 256


def test_a_budget_without_steps_names_the_key_to_set():
    with pytest.raises(UserError, match=r"^budget.steps has no value .*budget.steps=\.\.\."):
        validate(composed(["budget=x2"]))


def _flatten(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
