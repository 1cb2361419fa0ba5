"""The hand-written backwards (posenc/nn/fused.py) compute autograd's gradients of the composites
they replace: torch's own RMSNorm, SiLU(a)·b and the complex rotation, and float64 gradcheck."""

import pytest
import torch
import torch.nn.functional as F

from posenc.nn.fused import complex_rotation, rms_norm, swiglu


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
