"""The hand-written backwards (posenc/nn/fused.py) compute autograd's gradients of the composites
they replace: torch's own RMSNorm, SiLU(a)·b, the complex rotation, a depthwise causal conv1d and
F.normalize, and float64 gradcheck."""

import pytest
import torch
import torch.nn.functional as F

from posenc.nn.fused import (
    _conv,
    causal_conv_silu,
    complex_rotation,
    l2_normalize,
    rms_norm,
    swiglu,
)


def grads(fn, *inputs, seed: int = 0):
    """fn's output and the gradients of its inputs for a random upstream gradient."""
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*inputs)
    torch.manual_seed(seed)
    out.backward(torch.randn(out.shape, dtype=out.dtype))  # not randn_like: it follows the output's layout
    return out.detach(), [t.grad for t in inputs if t.requires_grad]


def test_rms_norm_matches_torch_rmsnorm_and_gradcheck():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.3 * torch.randn(16, dtype=torch.float64)).requires_grad_()
    out, (dx, dw) = grads(lambda a, b: rms_norm(a, b, 1e-6), x, w)
    ref, (rx, rw) = grads(lambda a, b: F.rms_norm(a, (16,), b, 1e-6), x, w)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, rx)
    torch.testing.assert_close(dw, rw)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-6), (x, w))


def test_swiglu_matches_silu_times_up_and_gradcheck():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    out, (dh,) = grads(swiglu, h)
    ref, (rh,) = grads(lambda t: F.silu(t[..., :6]) * t[..., 6:], h)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dh, rh)
    assert torch.autograd.gradcheck(swiglu, (h,))


@pytest.mark.parametrize("modulus", ["rope", "xpos"])
@pytest.mark.parametrize("transposed", [False, True])
def test_complex_rotation_gradient_is_the_inverse_rotation(transposed, modulus):
    """Rotating by e^{iφ} is orthogonal, so its gradient is the rotation by e^{-iφ}; scaled by r
    (xPos), it is the product by r·e^{-iφ}, the conjugate: the same as autograd's through
    view_as_complex, for q as attention sees it (a head view of the projection)."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 6, 3 * 16, dtype=torch.float64)  # (B, T, 3C), two heads of 8
    x = qkv[..., :16].view(2, 6, 2, 8).transpose(1, 2) if transposed else qkv[..., 16:24].view(2, 1, 6, 8)
    r = torch.ones(6, 4, dtype=torch.float64) if modulus == "rope" else 0.5 + torch.rand(6, 4, dtype=torch.float64)
    freqs = torch.polar(r, torch.randn(6, 4, dtype=torch.float64))
    composite = lambda t: torch.view_as_real(torch.view_as_complex(t.contiguous().unflatten(-1, (-1, 2))) * freqs).flatten(-2)
    out, (dx,) = grads(lambda t: complex_rotation(t, freqs), x.requires_grad_())
    ref, (rx,) = grads(composite, x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, rx)
    assert torch.autograd.gradcheck(lambda t: complex_rotation(t, freqs), (x.detach().requires_grad_(),))


def depthwise_conv1d_silu(x, weight):
    """SiLU(torch's depthwise Conv1d, zero-padded on the left): x (B, T, C), weight (C, K) with
    w_0 on the current token (conv1d's kernel runs oldest first, so it is flipped)."""
    K = weight.shape[1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), weight.flip(-1)[:, None], groups=x.shape[-1])
    return F.silu(y.transpose(1, 2))


def test_the_causal_convolution_is_torchs_depthwise_conv1d_and_keeps_to_its_document():
    """One sequence: Conv1d's values and gradients. Documents packed [0]*3 + [1]*4 + [2]*2: each
    document's rows are the convolution of that document alone."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    w = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    out, (dx, dw) = grads(lambda a, b: causal_conv_silu(a, b, None), x.requires_grad_(), w)
    ref, (rx, rw) = grads(depthwise_conv1d_silu, x, w)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, rx)
    torch.testing.assert_close(dw, rw)
    composite, (cx, cw) = grads(lambda a, b: F.silu(_conv(a, b, None)), x, w)  # what compiled and CUDA runs
    torch.testing.assert_close(composite, ref)
    torch.testing.assert_close(cx, rx)
    torch.testing.assert_close(cw, rw)
    seg = torch.tensor([0] * 3 + [1] * 4 + [2] * 2).expand(2, 9)
    packed = causal_conv_silu(x, w, seg)
    for lo, hi in ((0, 3), (3, 7), (7, 9)):
        torch.testing.assert_close(packed[:, lo:hi], depthwise_conv1d_silu(x[:, lo:hi], w))
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: causal_conv_silu(a, b, seg), (x, w))


def test_l2_normalize_is_f_normalize():
    """Gradients too, for a zero row (below eps F.normalize divides by eps, a constant)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    x[0, 1, 2] = 0.0
    out, (dx,) = grads(l2_normalize, x.requires_grad_())
    ref, (rx,) = grads(lambda t: F.normalize(t, dim=-1), x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, rx)
    assert torch.autograd.gradcheck(l2_normalize, (torch.randn(3, 8, dtype=torch.float64, requires_grad=True),))


@pytest.mark.parametrize("name", ["rms_norm", "causal_conv_silu", "l2_normalize"])
def test_the_hand_written_steps_compute_in_float32_under_bf16_autocast(name):
    """Under CPU bf16 autocast (trainer.precision=bf16) a float32 input gives the float32 result,
    values and gradients: autocast lowers vecdot and matmul to bf16, and these steps use both."""
    torch.manual_seed(0)
    x, w = torch.randn(4, 64, 96, requires_grad=True), (1 + 0.3 * torch.randn(96)).requires_grad_()
    conv_w = torch.randn(96, 4, requires_grad=True)
    seg = torch.repeat_interleave(torch.arange(2), torch.tensor([20, 44])).expand(4, 64)
    fn, inputs = {"rms_norm": (lambda a, b: rms_norm(a, b, 1e-6), (x, w)),
                  "causal_conv_silu": (lambda a, b: causal_conv_silu(a, b, seg), (x, conv_w)),
                  "l2_normalize": (l2_normalize, (x,))}[name]
    want, want_grads = grads(fn, *inputs)
    with torch.autocast("cpu", torch.bfloat16):
        got, got_grads = grads(fn, *inputs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
