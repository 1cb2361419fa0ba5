"""posenc's model against x-transformers' decoder at equal shape, budget and data (issue 18;
docs/model_recipe.md). Not part of posenc: x-transformers is not a dependency.

    pip install x-transformers==2.31.10
    OMP_NUM_THREADS=1 python scripts/compare_x_transformers.py --impl xt --enc alibi --seed 0
    OMP_NUM_THREADS=1 python scripts/compare_x_transformers.py --impl posenc --enc alibi --flavor llama
    OMP_NUM_THREADS=1 python scripts/compare_x_transformers.py --impl posenc --enc alibi --flavor gpt2 --set mlp=swiglu

Prints one JSON row: validation loss / perplexity / bits per byte on the same 16,384 tokens.
"""
import argparse, dataclasses, json, math, time
import torch
from posenc.config import compose
from posenc.build import build_data, seed_everything, build_encoding
from posenc.data.windows import RandomWindows
from posenc.train.state import configure_optimizer, lr_lambda
from posenc.eval.loss import score_windows
from posenc.nn.flavors import get_flavor
from posenc.nn.model import GPT

SHAPES = {"small": dict(n_layer=2, d_model=128, n_head=4, seq_len=64, batch_size=32, max_steps=400),
          "default": dict(n_layer=4, d_model=256, n_head=4, seq_len=256, batch_size=16, max_steps=300)}

p = argparse.ArgumentParser()
p.add_argument("--impl", default="posenc"); p.add_argument("--enc", default="rope")
p.add_argument("--seed", type=int, default=0); p.add_argument("--shape", default="small")
p.add_argument("--flavor", default="gpt2"); p.add_argument("--set", nargs="*", default=[])
p.add_argument("--xt", nargs="*", default=[], help="extra Decoder kwargs k=v (python literals)")
p.add_argument("--tag", default="")
a = p.parse_args()
s = SHAPES[a.shape]
cfg = compose([f"encoding={a.enc}", f"seed={a.seed}", f"model.n_layer={s['n_layer']}", f"model.d_model={s['d_model']}",
               f"model.n_head={s['n_head']}", f"trainer.seq_len={s['seq_len']}", f"trainer.batch_size={s['batch_size']}",
               f"trainer.max_steps={s['max_steps']}", "trainer.lr=2e-3"])
t = cfg.trainer
device = torch.device("cpu")
seed_everything(a.seed)
data = build_data(cfg)
V, T, B = data.vocab_size, t.seq_len, t.batch_size


class XT(torch.nn.Module):
    def __init__(self, net):
        super().__init__(); self.net = net

    def forward(self, idx, targets=None, pos=None):
        logits = self.net(idx)
        loss = None if targets is None else torch.nn.functional.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))
        return logits, loss


if a.impl == "xt":
    from x_transformers import TransformerWrapper, Decoder
    pos = {"rope": dict(rotary_pos_emb=True), "alibi": dict(alibi_pos_bias=True),
           "t5_bias": dict(rel_pos_bias=True), "nope": {}}[a.enc]
    extra = {k: eval(v) for k, v in (kv.split("=", 1) for kv in a.xt)}
    wrap_kw = {k[5:]: extra.pop(k) for k in list(extra) if k.startswith("wrap_")}
    model = XT(TransformerWrapper(num_tokens=V, max_seq_len=T, use_abs_pos_emb=False, **wrap_kw,
                                  attn_layers=Decoder(dim=s["d_model"], depth=s["n_layer"], heads=s["n_head"],
                                                      attn_dim_head=s["d_model"] // s["n_head"], **pos, **extra)))
    flavor = None
else:
    fl = get_flavor(a.flavor)
    kv = {}
    for item in a.set:
        k, v = item.split("=", 1)
        kv[k] = {"true": True, "false": False}.get(v, v)
        if k.endswith("std"): kv[k] = float(v)
    fl = dataclasses.replace(fl, name=a.flavor + ("+" + ",".join(a.set) if a.set else ""), **kv)
    encoding = build_encoding(cfg)
    model = GPT(V, encoding, s["n_layer"], s["n_head"], s["d_model"], 0.0, "softmax", flavor=fl)
    flavor = dataclasses.asdict(fl)
n_params = sum(p.numel() for p in model.parameters())
batches = RandomWindows(data.train, T, B, seed=a.seed)
opt = configure_optimizer(model, t, device)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, t.max_steps, t.min_lr_ratio))
start = time.time()
for step in range(t.max_steps):
    batch = batches.next()
    _, loss = model(batch.x, batch.y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
    opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
val = score_windows(model, data.validation, T, 16384, batch_size=max(1, 16384 // T), device=device).loss
row = dict(impl=a.impl, enc=a.enc, seed=a.seed, shape=a.shape, flavor=flavor, xt=a.xt, tag=a.tag, params=n_params,
           loss=val, ppl=math.exp(val), bpb=val / math.log(2) / data.bytes_per_token("validation"),
           train_last=loss.item(), seconds=round(time.time() - start))
print(json.dumps(row))
