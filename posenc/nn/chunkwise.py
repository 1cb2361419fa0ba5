"""The two steps of the chunked recurrences (posenc/nn/recurrence.py) that autograd runs slowly,
with hand-written backwards.

- ``unit_lower_solve``: X = (I + A)⁻¹ R for the strictly lower part of A, a batch of C x C
  systems (one per head and chunk). ``torch.linalg.solve_triangular`` solves a CPU batch matrix
  by matrix (a LAPACK call, and a copy, per 32 x 32 system), forwards and again backwards. Here
  the inverse T = (I + A)⁻¹ is built as fla's kernels build it, by blocks: the 8 x 8 diagonal
  blocks by forward substitution, then pairs of blocks merged, T₂₁ = -T₂₂ A₂₁ T₁₁, and X = T R.
  The backward reuses T: dR = Tᵀ dX, dA = -tril₋₁(dR Xᵀ), two batched products instead of a
  second solve.
- ``state_pass``: the chunk-to-chunk pass of the state, S_{n+1} = d_n S_n + K_nᵀ (U_n - W_n S_n)
  (d_n a scalar per head, or a diagonal: one decay per key channel),
  and the outputs' reads of it, Q_n S_n. Run by autograd, each of the T/C steps costs several
  small ops forwards and twice as many backwards, and every chunk's slice of each input a
  zero-filled gradient. Here only the two products that depend on the previous step run in the
  loop (forwards: U - W S and the update; backwards: the same two for dS), and the rest is done
  for all chunks at once after it, from the states S_n saved in the forward (d_k x d_v per head
  and chunk: memory linear in T, as the chunks' own tensors).

Both compute what the composite ops compute (tests/test_recurrent.py holds them to float64
gradients of the token-by-token definition).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from posenc.nn.precision import without_autocast

#: the diagonal blocks inverted by forward substitution before merging (the fastest of 4, 8, 16
#: on a CPU for C = 32: 1.8 ms for 256 systems against 3.5 ms row by row and 4 ms for torch's solve)
BLOCK = 8


def unit_lower_inverse(A: Tensor) -> Tensor:
    """(I + tril₋₁(A))⁻¹ for A (..., C, C); only the strictly lower part of A is read."""
    shape, C = A.shape, A.shape[-1]
    M = A.reshape(-1, C, C)
    b = min(BLOCK, C)
    T = torch.zeros_like(M)
    for j in range(0, C, b):  # each diagonal block by forward substitution: T_i = e_i - A_i,<i T_<i
        e = min(j + b, C)
        blk = T[:, j:e, j:e]
        blk.diagonal(dim1=-2, dim2=-1).fill_(1.0)
        for i in range(1, e - j):
            blk[:, i:i + 1, :i] = -torch.bmm(M[:, j + i:j + i + 1, j:j + i], blk[:, :i, :i])
    s = b
    while s < C:  # merge neighbouring blocks: [[T11, 0], [A21, T22]]⁻¹ has T21 = -T22 A21 T11
        for j in range(0, C, 2 * s):
            m, e = j + s, min(j + 2 * s, C)
            if m >= C:
                break
            T[:, m:e, j:m] = -torch.bmm(T[:, m:e, m:e], torch.bmm(M[:, m:e, j:m], T[:, j:m, j:m]))
        s *= 2
    return T.reshape(shape)


class _UnitLowerSolve(torch.autograd.Function):
    """X = (I + tril₋₁(A))⁻¹ R. Backward, with L = I + tril₋₁(A): dR = L⁻ᵀ dX, dA = -tril₋₁(dR Xᵀ)."""

    @staticmethod
    @without_autocast
    def forward(ctx, A: Tensor, R: Tensor) -> Tensor:
        T = unit_lower_inverse(A)  # (..., C, C)
        X = T @ R  # (..., C, n)
        ctx.save_for_backward(T, X)
        return X

    @staticmethod
    @once_differentiable
    @without_autocast
    def backward(ctx, dX: Tensor) -> tuple[Tensor, Tensor]:
        T, X = ctx.saved_tensors
        dR = T.transpose(-1, -2) @ dX
        dA = (dR @ X.transpose(-1, -2)).tril_(-1).neg_()
        return dA, dR


def unit_lower_solve(A: Tensor, R: Tensor) -> Tensor:
    """(I + tril₋₁(A))⁻¹ R: A (..., C, C) read strictly below its diagonal, R (..., C, n)."""
    return _UnitLowerSolve.apply(A, R)


class _StatePass(torch.autograd.Function):
    """O_n = Q_n S_n with S_0 = 0, S_{n+1} = d_n S_n + K_nᵀ U_n, U_n = U0_n - W_n S_n (W_n = 0 when
    W is None: GLA). Inputs chunk-major, (N, M, C, ·) with N chunks and M = batch x heads, and
    contiguous: a CPU ``bmm`` over a strided batch runs matrix by matrix; d: (N, M, 1, 1), a scalar
    decay per head, or (N, M, d_k, 1), one per key channel (KDA: d_n S_n is then diag(d_n) S_n).

    Backward, from dS_N = 0 down: dU_n = K_n dS_{n+1},
    dS_n = d_n dS_{n+1} + Q_nᵀ dO_n - W_nᵀ dU_n; then for every chunk at once dQ_n = dO_n S_nᵀ,
    dW_n = -dU_n S_nᵀ, dK_n = U_n dS_{n+1}ᵀ, dd_n = <S_n, dS_{n+1}>."""

    @staticmethod
    @without_autocast
    def forward(ctx, Q: Tensor, U0: Tensor, W: Tensor | None, K: Tensor, d: Tensor) -> Tensor:
        N, M, _, dv = U0.shape
        dk = K.shape[-1]
        S_all = U0.new_empty(N, M, dk, dv)  # S_n: the state each chunk starts from
        U = U0 if W is None else torch.empty_like(U0)
        S = S_all[0].zero_()
        for n in range(N - 1):
            if W is not None:
                torch.baddbmm(U0[n], W[n], S, alpha=-1, out=U[n])  # U0 - W S: (M, C, dv)
            S = torch.baddbmm(d[n] * S, K[n].transpose(-1, -2), U[n], out=S_all[n + 1])
        if W is not None:  # the last chunk's U (its state update is never read)
            torch.baddbmm(U0[-1], W[-1], S, alpha=-1, out=U[-1])
        ctx.save_for_backward(Q, W, K, d, S_all, U)
        return Q @ S_all  # (N, M, C, dv)

    @staticmethod
    @once_differentiable
    @without_autocast
    def backward(ctx, dO: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
        Q, W, K, d, S_all, U = ctx.saved_tensors
        dO = dO.contiguous()
        dS_read = Q.transpose(-1, -2) @ dO  # (N, M, dk, dv): each chunk's outputs' pull on its S_n
        dS_next = torch.empty_like(S_all)  # dS_{n+1}, for every n
        dU = torch.empty_like(U)
        dS = dS_next[-1].zero_()
        for n in range(len(U) - 1, -1, -1):
            torch.bmm(K[n], dS, out=dU[n])  # (M, C, dv)
            if n == 0:
                break
            dS = torch.addcmul(dS_read[n], d[n], dS, out=dS_next[n - 1])
            if W is not None:
                dS.baddbmm_(W[n].transpose(-1, -2), dU[n], alpha=-1)
        S_t = S_all.transpose(-1, -2)
        dQ = dO @ S_t
        dW = (dU @ S_t).neg_() if W is not None else None
        dK = U @ dS_next.transpose(-1, -2)
        if d.shape[-2] == 1:  # a scalar per head: <S_n, dS_{n+1}> over the whole state
            dd = torch.linalg.vecdot(S_all.flatten(-2), dS_next.flatten(-2))[..., None, None]
        else:  # one per key channel: the same, row by row
            dd = torch.linalg.vecdot(S_all, dS_next)[..., None]
        return dQ, dU, dW, dK, dd


def state_pass(Q: Tensor, U0: Tensor, W: Tensor | None, K: Tensor, d: Tensor) -> Tensor:
    """Q_n S_n for every chunk n (``_StatePass``): Q, U0, W, K (M, N, C, ·), d (M, N, 1, 1) or
    (M, N, d_k, 1) -> (M, N, C, dv)."""
    major = [t.transpose(0, 1).contiguous() if t is not None else None for t in (Q, U0, W, K, d)]  # (N, M, ...)
    return _StatePass.apply(*major).transpose(0, 1)


@torch.no_grad()
@without_autocast
def final_state(U0: Tensor, W: Tensor | None, K: Tensor, d: Tensor) -> Tensor:
    """S_N, the state after the last chunk, where decoding continues: the inputs as ``state_pass``
    takes them -> (M, dk, dv). The pass's recurrence again, without the outputs' reads of it."""
    S = U0.new_zeros(U0.shape[0], K.shape[-1], U0.shape[-1])
    for n in range(U0.shape[1]):
        U = U0[:, n] if W is None else U0[:, n] - W[:, n] @ S  # (M, C, dv)
        S = d[:, n] * S + K[:, n].transpose(-1, -2) @ U
    return S
