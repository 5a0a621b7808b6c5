"""Fused relative-position attention in Triton (``backend="triton"``): one flash-attention forward
(online softmax, no ``(B, H, n, n)`` tensor written) and backward with the factorised RPE terms
gathered inside the tile. Opt-in only; its speed is unmeasured (see docs/design.md).

What the kernel fuses (per tile of queries ``i`` and keys ``j``, ``s = scale``)::

    e_ij = s q_i.k_j + sum_p R^Q_p[b, h, i, idQ_p[i, j]] + sum_p R^K_p[b, h, j, idK_p[j, i]] + mask_ij
    PB_p[b, h, i, c] = sum_j a_ij [idV_p[i, j] = c]          (per-row bucket sums of the probabilities)

``R^Q`` are the query-indexed pieces (key-site terms: the contextual rows ``(s q) T_k^T`` or a bias
table broadcast over rows), ``R^K`` the key-indexed ones (query-site terms, which read the reversed
pair). Skip tokens need nothing special: their pairs carry the skip bucket in the id maps. The rows
are computed outside the kernel (a small GEMM) and receive their gradient from it: the backward
reduces ``dS`` into ``(B, H, n, K)`` per query block (``R^Q``, in the dQ kernel) and per key block
(``R^K``, in the dK/dV kernel), each program writing only its own rows (a one-hot in registers up
to 16 buckets, atomic adds beyond, see ONEHOT_LIMIT). ``PB`` is accumulated next to the output (rescaled
with the running max) and turned into the V term by one GEMM with the V table outside; its gradient
is gathered back into ``dP`` by the same id maps.

Triton is imported here only; `rpe.attention` imports this module on demand, so installs without
Triton still import `rpe`. On CPU tensors the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is first imported), which is what the tests do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import LogitPiece
from .config import triton_interpreted

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

__all__ = ["triton_available", "triton_rpe_attention", "dropout_keep_mask"]

# Tile sizes: untuned (no GPU measurement yet). A bucket reduction over at most 16 columns builds a
# (BLOCK_M, BLOCK_N, columns) one-hot in registers (deterministic); wider ones (iRPE's 50 buckets,
# T5's 1025) would not fit, so they are atomic adds into the program's own rows of the
# (B, H, n, K) gradient: no other program writes those rows, but the summation order within a
# tile is not deterministic.
BLOCK_M = 32
BLOCK_N = 32
ONEHOT_LIMIT = BLOCK_M * BLOCK_N * 16
# With 4 warps ptxas (sm_90a, d = 64) spills up to ~400 bytes in the one-hot kernels, with 8 almost none.
NUM_WARPS = 8

INTERPRETED = triton_interpreted()  # read once: Triton reads it when it is first imported


def triton_available() -> bool:
    """Whether Triton could be imported."""
    return triton is not None


def _check_device(q: Tensor) -> None:
    if triton is None:
        raise ValueError("rpe.backend='triton' needs the triton package (pip install triton); use backend=auto")
    if q.device.type == "cuda":
        if INTERPRETED:
            raise ValueError(
                "rpe.backend='triton' was imported under TRITON_INTERPRET=1 (CPU interpreter) but got CUDA"
                " tensors; unset TRITON_INTERPRET"
            )
        return
    if not INTERPRETED:
        raise ValueError(
            f"rpe.backend='triton' runs on CUDA tensors, got device {q.device.type!r}"
            " (on CPU only under Triton's interpreter, TRITON_INTERPRET=1, for tests); use backend=auto"
        )


if triton is not None:

    @triton.jit
    def _load_block(PTR, b, h, sb, sh, sn, offs, offs_d, valid):
        """A (rows, BD) block of a strided (B, H, n, d) tensor."""
        return tl.load(PTR + b.to(tl.int64) * sb + h * sh + offs[:, None] * sn + offs_d[None, :], mask=valid, other=0.0)

    @triton.jit
    def _dense(bh, N, D, offs, offs_d):
        """Offsets of a (rows, BD) block of a contiguous (B, H, n, d) tensor."""
        return bh.to(tl.int64) * N * D + offs[:, None] * D + offs_d[None, :]

    @triton.jit
    def _scores(
        q, k, offs_m, offs_n, tile_valid, b, h, bh, N, scale,
        RQ, IDQ, RK, IDK, MASK, smb, smh, smi, smj,
        PQ: tl.constexpr, WQ: tl.constexpr, PK: tl.constexpr, WK: tl.constexpr, HAS_MASK: tl.constexpr,
    ):
        """Logits of one (BLOCK_M, BLOCK_N) tile with every gathered term; invalid keys -inf."""
        s = tl.dot(q, tl.trans(k)) * scale
        for p in tl.static_range(PQ):
            idx = tl.load(IDQ + p * N * N + offs_m[:, None] * N + offs_n[None, :], mask=tile_valid, other=0)
            s += tl.load(RQ + bh.to(tl.int64) * N * WQ + offs_m[:, None] * WQ + idx, mask=tile_valid, other=0.0)
        for p in tl.static_range(PK):
            idx = tl.load(IDK + p * N * N + offs_n[None, :] * N + offs_m[:, None], mask=tile_valid, other=0)
            s += tl.load(RK + bh.to(tl.int64) * N * WK + offs_n[None, :] * WK + idx, mask=tile_valid, other=0.0)
        if HAS_MASK:
            s += tl.load(
                MASK + b.to(tl.int64) * smb + h * smh + offs_m[:, None] * smi + offs_n[None, :] * smj,
                mask=tile_valid, other=0.0,
            )
        return tl.where(tile_valid, s, float("-inf"))

    @triton.jit
    def _keep(seed, bh, N, offs_m, offs_n, dropout_p):
        """Dropout keep mask of a tile: a function of (seed, b h, i, j) only, so backward regenerates it."""
        offsets = bh.to(tl.int64) * N * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        return tl.rand(seed, offsets) >= dropout_p

    @triton.jit
    def _onehot(IDS, offs_r, offs_c, valid, N, P: tl.constexpr, WP: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
        """(R, C, WP) one-hot of the (offset) bucket ids ``IDS[p, r, c]`` summed over the P maps."""
        cols = tl.arange(0, WP)
        oh = tl.zeros((R, C, WP), dtype=tl.float32)
        for p in tl.static_range(P):
            idx = tl.load(IDS + p * N * N + offs_r[:, None] * N + offs_c[None, :], mask=valid, other=-1)
            oh += (idx[:, :, None] == cols[None, None, :]).to(tl.float32)
        return oh

    @triton.jit
    def _fwd_kernel(
        Q, K, V, O, LSE, PB,
        sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
        RQ, IDQ, RK, IDK, IDV, MASK, smb, smh, smi, smj,
        H, N, D, scale, dropout_p, seed,
        PQ: tl.constexpr, WQ: tl.constexpr, PK: tl.constexpr, WK: tl.constexpr,
        PV: tl.constexpr, WV: tl.constexpr, WVP: tl.constexpr, ATOMIC_V: tl.constexpr,
        HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        bh = tl.program_id(0)  # B H on the first axis: its limit is 2**31 - 1, the others' 65535
        pid_m = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, BD)
        m_valid = offs_m < N
        d_valid = offs_d < D
        q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :],
                    mask=m_valid[:, None] & d_valid[None, :], other=0.0)
        m_i = tl.full((BM,), float("-inf"), dtype=ACC)
        l_i = tl.zeros((BM,), dtype=ACC)
        acc = tl.zeros((BM, BD), dtype=ACC)
        pb = tl.zeros((BM, WVP), dtype=ACC)
        for start_n in range(0, N, BN):
            offs_n = start_n + tl.arange(0, BN)
            n_valid = offs_n < N
            tile_valid = m_valid[:, None] & n_valid[None, :]
            kv_mask = n_valid[:, None] & d_valid[None, :]
            k = _load_block(K, b, h, skb, skh, skn, offs_n, offs_d, kv_mask)
            v = _load_block(V, b, h, svb, svh, svn, offs_n, offs_d, kv_mask)
            s = _scores(q, k, offs_m, offs_n, tile_valid, b, h, bh, N, scale, RQ, IDQ, RK, IDK,
                        MASK, smb, smh, smi, smj, PQ, WQ, PK, WK, HAS_MASK).to(ACC)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far stays at zero
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if DROPOUT:
                keep = _keep(seed, bh, N, offs_m, offs_n, dropout_p)
                p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(ACC)
            if PV > 0 and not ATOMIC_V:
                oh = _onehot(IDV, offs_m, offs_n, tile_valid, N, PV, WVP, BM, BN)
                pb = pb * alpha[:, None] + tl.sum(p[:, :, None] * oh.to(ACC), 1)
            m_i = m_new
        l_i = tl.where(l_i == 0.0, 1.0, l_i)  # padded rows (and fully masked ones: output 0)
        out = acc / l_i[:, None]
        tl.store(O + _dense(bh, N, D, offs_m, offs_d), out.to(O.dtype.element_ty),
                 mask=m_valid[:, None] & d_valid[None, :])
        # +inf for a fully masked row: its recomputed probabilities exp(-inf - lse) are 0, not NaN
        lse = tl.where(m_i == float("-inf"), float("inf"), m_i + tl.log(l_i))
        tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse, mask=m_valid)
        if ATOMIC_V:
            # wide V tables: a second pass with the final normaliser scatters the probabilities
            for start_n in range(0, N, BN):
                offs_n = start_n + tl.arange(0, BN)
                n_valid = offs_n < N
                tile_valid = m_valid[:, None] & n_valid[None, :]
                k = tl.load(K + b.to(tl.int64) * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :],
                            mask=n_valid[:, None] & d_valid[None, :], other=0.0)
                s = _scores(q, k, offs_m, offs_n, tile_valid, b, h, bh, N, scale, RQ, IDQ, RK, IDK,
                            MASK, smb, smh, smi, smj, PQ, WQ, PK, WK, HAS_MASK).to(ACC)
                p = tl.where(tile_valid, tl.exp(s - lse[:, None]), 0.0)
                if DROPOUT:
                    keep = _keep(seed, bh, N, offs_m, offs_n, dropout_p)
                    p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
                for c in tl.static_range(PV):
                    idx = tl.load(IDV + c * N * N + offs_m[:, None] * N + offs_n[None, :], mask=tile_valid, other=0)
                    tl.atomic_add(PB + bh.to(tl.int64) * N * WV + offs_m[:, None] * WV + idx, p, mask=tile_valid)
        elif PV > 0:
            cols = tl.arange(0, WVP)
            tl.store(PB + bh.to(tl.int64) * N * WV + offs_m[:, None] * WV + cols[None, :], pb / l_i[:, None],
                     mask=m_valid[:, None] & (cols[None, :] < WV))

    @triton.jit
    def _dprobs(
        do, v, p, bh, N, offs_m, offs_n, tile_valid, delta, seed, dropout_p,
        IDV, DPB, PV: tl.constexpr, WV: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
    ):
        """``dS`` of a tile from the probabilities ``p``; also returns the dropped probabilities (for dV)."""
        dp = tl.dot(do, tl.trans(v)).to(ACC)
        for c in tl.static_range(PV):
            idx = tl.load(IDV + c * N * N + offs_m[:, None] * N + offs_n[None, :], mask=tile_valid, other=0)
            dp += tl.load(DPB + bh.to(tl.int64) * N * WV + offs_m[:, None] * WV + idx, mask=tile_valid, other=0.0)
        p_used = p
        if DROPOUT:
            keep = _keep(seed, bh, N, offs_m, offs_n, dropout_p)
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
            p_used = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        ds = tl.where(tile_valid, p * (dp - delta[:, None]), 0.0)
        return ds, p_used

    @triton.jit
    def _bwd_dkv_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, GK, DPB,
        sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
        RQ, IDQ, RK, IDK, IDV, MASK, smb, smh, smi, smj,
        H, N, D, scale, dropout_p, seed,
        PQ: tl.constexpr, WQ: tl.constexpr, PK: tl.constexpr, WK: tl.constexpr, WKP: tl.constexpr,
        ATOMIC_K: tl.constexpr, PV: tl.constexpr, WV: tl.constexpr,
        HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        """One key block: dK, dV and the key-indexed rows' gradient, looping over the query blocks."""
        bh = tl.program_id(0)
        pid_n = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_d = tl.arange(0, BD)
        n_valid = offs_n < N
        d_valid = offs_d < D
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = _load_block(K, b, h, skb, skh, skn, offs_n, offs_d, kv_mask)
        v = _load_block(V, b, h, svb, svh, svn, offs_n, offs_d, kv_mask)
        dk = tl.zeros((BN, BD), dtype=ACC)
        dv = tl.zeros((BN, BD), dtype=ACC)
        gk = tl.zeros((BN, WKP), dtype=ACC)
        for start_m in range(0, N, BM):
            offs_m = start_m + tl.arange(0, BM)
            m_valid = offs_m < N
            tile_valid = m_valid[:, None] & n_valid[None, :]
            q_mask = m_valid[:, None] & d_valid[None, :]
            q = _load_block(Q, b, h, sqb, sqh, sqn, offs_m, offs_d, q_mask)
            do = tl.load(DO + _dense(bh, N, D, offs_m, offs_d), mask=q_mask, other=0.0)
            lse = tl.load(LSE + bh.to(tl.int64) * N + offs_m, mask=m_valid, other=0.0)
            delta = tl.load(DELTA + bh.to(tl.int64) * N + offs_m, mask=m_valid, other=0.0)
            s = _scores(q, k, offs_m, offs_n, tile_valid, b, h, bh, N, scale, RQ, IDQ, RK, IDK,
                        MASK, smb, smh, smi, smj, PQ, WQ, PK, WK, HAS_MASK).to(ACC)
            p = tl.where(tile_valid, tl.exp(s - lse[:, None]), 0.0)
            ds, p_used = _dprobs(do, v, p, bh, N, offs_m, offs_n, tile_valid, delta, seed, dropout_p,
                                 IDV, DPB, PV, WV, DROPOUT, ACC)
            dv += tl.dot(tl.trans(p_used.to(do.dtype)), do).to(ACC)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q).to(ACC)
            if ATOMIC_K:
                for c in tl.static_range(PK):
                    idx = tl.load(IDK + c * N * N + offs_n[None, :] * N + offs_m[:, None], mask=tile_valid, other=0)
                    tl.atomic_add(GK + bh.to(tl.int64) * N * WK + offs_n[None, :] * WK + idx, ds, mask=tile_valid)
            elif PK > 0:
                # key-indexed ids are read at (j, i): the one-hot is built over (key, query)
                oh = _onehot(IDK, offs_n, offs_m, tl.trans(tile_valid), N, PK, WKP, BN, BM)
                gk += tl.sum(tl.trans(ds)[:, :, None] * oh.to(ACC), 1)
        tl.store(DK + _dense(bh, N, D, offs_n, offs_d), (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + _dense(bh, N, D, offs_n, offs_d), dv.to(DV.dtype.element_ty), mask=kv_mask)
        if PK > 0 and not ATOMIC_K:
            cols = tl.arange(0, WKP)
            tl.store(GK + bh.to(tl.int64) * N * WK + offs_n[:, None] * WK + cols[None, :], gk,
                     mask=n_valid[:, None] & (cols[None, :] < WK))

    @triton.jit
    def _bwd_dq_kernel(
        Q, K, V, DO, LSE, DELTA, DQ, GQ, DPB,
        sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
        RQ, IDQ, RK, IDK, IDV, MASK, smb, smh, smi, smj,
        H, N, D, scale, dropout_p, seed,
        PQ: tl.constexpr, WQ: tl.constexpr, WQP: tl.constexpr, ATOMIC_Q: tl.constexpr, PK: tl.constexpr,
        WK: tl.constexpr, PV: tl.constexpr, WV: tl.constexpr,
        HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):
        """One query block: dQ and the query-indexed rows' gradient, looping over the key blocks."""
        bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = bh // H
        h = bh % H
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, BD)
        m_valid = offs_m < N
        d_valid = offs_d < D
        q_mask = m_valid[:, None] & d_valid[None, :]
        q = _load_block(Q, b, h, sqb, sqh, sqn, offs_m, offs_d, q_mask)
        do = tl.load(DO + _dense(bh, N, D, offs_m, offs_d), mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * N + offs_m, mask=m_valid, other=0.0)
        delta = tl.load(DELTA + bh.to(tl.int64) * N + offs_m, mask=m_valid, other=0.0)
        dq = tl.zeros((BM, BD), dtype=ACC)
        gq = tl.zeros((BM, WQP), dtype=ACC)
        for start_n in range(0, N, BN):
            offs_n = start_n + tl.arange(0, BN)
            n_valid = offs_n < N
            tile_valid = m_valid[:, None] & n_valid[None, :]
            kv_mask = n_valid[:, None] & d_valid[None, :]
            k = _load_block(K, b, h, skb, skh, skn, offs_n, offs_d, kv_mask)
            v = _load_block(V, b, h, svb, svh, svn, offs_n, offs_d, kv_mask)
            s = _scores(q, k, offs_m, offs_n, tile_valid, b, h, bh, N, scale, RQ, IDQ, RK, IDK,
                        MASK, smb, smh, smi, smj, PQ, WQ, PK, WK, HAS_MASK).to(ACC)
            p = tl.where(tile_valid, tl.exp(s - lse[:, None]), 0.0)
            ds, _ = _dprobs(do, v, p, bh, N, offs_m, offs_n, tile_valid, delta, seed, dropout_p,
                            IDV, DPB, PV, WV, DROPOUT, ACC)
            dq += tl.dot(ds.to(k.dtype), k).to(ACC)
            if ATOMIC_Q:
                for c in tl.static_range(PQ):
                    idx = tl.load(IDQ + c * N * N + offs_m[:, None] * N + offs_n[None, :], mask=tile_valid, other=0)
                    tl.atomic_add(GQ + bh.to(tl.int64) * N * WQ + offs_m[:, None] * WQ + idx, ds, mask=tile_valid)
            elif PQ > 0:
                oh = _onehot(IDQ, offs_m, offs_n, tile_valid, N, PQ, WQP, BM, BN)
                gq += tl.sum(ds[:, :, None] * oh.to(ACC), 1)
        tl.store(DQ + _dense(bh, N, D, offs_m, offs_d), (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)
        if PQ > 0 and not ATOMIC_Q:
            cols = tl.arange(0, WQP)
            tl.store(GQ + bh.to(tl.int64) * N * WQ + offs_m[:, None] * WQ + cols[None, :], gq,
                     mask=m_valid[:, None] & (cols[None, :] < WQ))

    @triton.jit
    def _keep_mask_kernel(OUT, N, dropout_p, seed, BM: tl.constexpr, BN: tl.constexpr):
        bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        for start_n in range(0, N, BN):
            offs_n = start_n + tl.arange(0, BN)
            keep = _keep(seed, bh, N, offs_m, offs_n, dropout_p)
            tl.store(OUT + bh.to(tl.int64) * N * N + offs_m[:, None] * N + offs_n[None, :], keep.to(tl.int8),
                     mask=(offs_m[:, None] < N) & (offs_n[None, :] < N))


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _atomic(width: int) -> bool:
    """Whether the bucket gradients of ``width`` columns are reduced with atomics (see ONEHOT_LIMIT)."""
    return width > 1 and BLOCK_M * BLOCK_N * _next_pow2(width) > ONEHOT_LIMIT


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _FusedRPEAttention(torch.autograd.Function):
    """``(q, k, v, rows_q, rows_k, mask) -> (out (B, H, n, d), pb (B, H, n, WV))``; see the module docstring.

    ``rows_q`` ``(B, H, n, WQ)`` / ``rows_k`` ``(B, H, n, WK)``: the gathered pieces side by side,
    ``ids_q`` / ``ids_k`` / ``ids_v`` ``(P, n, n)`` int32 with each piece's column offset added.
    ``mask`` an additive float view broadcast to ``(B, H, n, n)`` (no gradient) or None.
    """

    @staticmethod
    def forward(ctx, q, k, v, rows_q, rows_k, ids_q, ids_k, ids_v, width_v, mask, scale, dropout_p, seed):
        B, H, n, d = q.shape
        acc = _acc_dtype(q.dtype)
        out = torch.empty(B, H, n, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(B, H, n, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)
        pv = ids_v.shape[0]
        pb = torch.zeros(B, H, n, max(width_v, 1), dtype=lse.dtype, device=q.device)
        mask_args = (mask, *mask.stride()) if mask is not None else (q, 0, 0, 0, 0)
        grid = (B * H, triton.cdiv(n, BLOCK_M))
        _fwd_kernel[grid](
            q, k, v, out, lse, pb,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            rows_q, ids_q, rows_k, ids_k, ids_v, *mask_args,
            H, n, d, scale, dropout_p, seed,
            PQ=ids_q.shape[0], WQ=rows_q.shape[-1], PK=ids_k.shape[0], WK=rows_k.shape[-1],
            PV=pv, WV=max(width_v, 1), WVP=_next_pow2(max(width_v, 1)), ATOMIC_V=pv > 0 and _atomic(width_v),
            HAS_MASK=mask is not None, DROPOUT=dropout_p > 0, ACC=acc,
            BM=BLOCK_M, BN=BLOCK_N, BD=max(16, _next_pow2(d)), num_warps=NUM_WARPS,
        )
        ctx.save_for_backward(q, k, v, out, lse, pb, rows_q, rows_k, ids_q, ids_k, ids_v, mask)
        ctx.config = (scale, dropout_p, seed, width_v)
        return out, pb

    @staticmethod
    def backward(ctx, d_out, d_pb):
        q, k, v, out, lse, pb, rows_q, rows_k, ids_q, ids_k, ids_v, mask = ctx.saved_tensors
        scale, dropout_p, seed, width_v = ctx.config
        B, H, n, d = q.shape
        d_out = d_out.contiguous()
        pv = ids_v.shape[0]
        if pv == 0 or d_pb is None:
            d_pb = torch.zeros_like(pb)
        d_pb = d_pb.to(lse.dtype).contiguous()
        # sum_j a_ij dA_ij: the output part plus the bucket-sum part of the V term
        delta = ((d_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1) + (d_pb * pb).sum(-1)).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if not dq.is_contiguous():
            dq, dk, dv = (torch.empty(B, H, n, d, dtype=q.dtype, device=q.device) for _ in range(3))
        gq = torch.zeros(rows_q.shape, dtype=lse.dtype, device=q.device)
        gk = torch.zeros(rows_k.shape, dtype=lse.dtype, device=q.device)
        mask_args = (mask, *mask.stride()) if mask is not None else (q, 0, 0, 0, 0)
        common = (
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            rows_q, ids_q, rows_k, ids_k, ids_v, *mask_args,
            H, n, d, scale, dropout_p, seed,
        )
        flags = dict(
            HAS_MASK=mask is not None, DROPOUT=dropout_p > 0, ACC=_acc_dtype(q.dtype),
            BM=BLOCK_M, BN=BLOCK_N, BD=max(16, _next_pow2(d)), num_warps=NUM_WARPS,
        )
        pq, wq, pk, wk = ids_q.shape[0], rows_q.shape[-1], ids_k.shape[0], rows_k.shape[-1]
        wv = max(width_v, 1)
        _bwd_dkv_kernel[(B * H, triton.cdiv(n, BLOCK_N))](
            q, k, v, d_out, lse, delta, dk, dv, gk, d_pb, *common,
            PQ=pq, WQ=wq, PK=pk, WK=wk, WKP=_next_pow2(wk), ATOMIC_K=_atomic(wk), PV=pv, WV=wv, **flags,
        )
        _bwd_dq_kernel[(B * H, triton.cdiv(n, BLOCK_M))](
            q, k, v, d_out, lse, delta, dq, gq, d_pb, *common,
            PQ=pq, WQ=wq, WQP=_next_pow2(wq), ATOMIC_Q=_atomic(wq), PK=pk, WK=wk, PV=pv, WV=wv, **flags,
        )
        return (dq, dk, dv, gq.to(rows_q.dtype) if pq else None, gk.to(rows_k.dtype) if pk else None,
                None, None, None, None, None, None, None, None)


def _side_by_side(
    pieces: list[tuple[Tensor, Tensor]], shape: tuple[int, int, int], like: Tensor
) -> tuple[Tensor, Tensor, list[int]]:
    """``[(rows (B|1, H|1, n|1, nb), ids (n, n))]`` -> rows ``(B, H, n, sum nb)``, ids ``(P, n, n)`` int32
    with each piece's column offset added, and the offsets."""
    B, H, n = shape
    if not pieces:
        return like.new_zeros(1, 1, 1, 1), torch.zeros(0, n, n, dtype=torch.int32, device=like.device), []
    offsets, columns, maps, width = [], [], [], 0
    for rows, ids in pieces:
        offsets.append(width)
        columns.append(rows.to(like.dtype).expand(B, H, n, -1))
        maps.append(ids.to(torch.int32) + width)
        width += rows.shape[-1]
    rows = columns[0] if len(columns) == 1 else torch.cat(columns, -1)
    return rows.contiguous(), torch.stack(maps).contiguous(), offsets


def triton_rpe_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pieces: list[LogitPiece],
    value_tables: list[tuple[Tensor, Tensor]],
    attn_mask: Tensor | None,
    dropout_p: float,
    scale: float,
) -> Tensor:
    """Fused attention with factorised RPE terms.

    Args:
        q, k, v: ``(B, H, n, d)`` (q unscaled).
        pieces: `LogitPiece` of kinds "table" and "rows" (built from ``s q`` / ``s k``); a "dense"
            piece of shape ``(B|1, H|1, 1, n)`` (one term per key) is fused as a key-side row of one
            bucket, other dense pieces are added to the mask and must not need a gradient.
        value_tables: ``[(ids (n, n), table (Hs, nb, d))]``, V term ``sum_j a_ij table[h, ids[i, j]]``.
        attn_mask: bool (True = attend) or additive float without gradient, broadcastable to
            ``(B, H, n, n)``.
        dropout_p: attention dropout (regenerated in backward from a seed drawn from torch's RNG).
        scale: logit scale ``s``.

    Returns:
        ``(B, H, n, d)``; a query whose keys are all masked gets zeros and sends no gradient (the
        eager path gives NaN).
    """
    _check_device(q)
    B, H, n, d = q.shape
    q, k, v = (_last_dim_contiguous(t.to(q.dtype)) for t in (q, k, v))
    by_query: list[tuple[Tensor, Tensor]] = []
    by_key: list[tuple[Tensor, Tensor]] = []
    dense: list[Tensor] = []
    for piece in pieces:
        if piece.kind == "dense" and piece.values.dim() == 4 and piece.values.shape[-2] == 1:
            # a per-key term (XL's content bias u.k_j): a key-side row with one bucket, read by every query
            by_key.append((piece.values.transpose(-1, -2), torch.zeros(n, n, dtype=torch.int32, device=q.device)))
            continue
        if piece.kind == "dense":
            if piece.values.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    "rpe.backend='triton' cannot learn a dense logit term that varies per query; use backend=auto"
                )
            dense.append(piece.values)
            continue
        if piece.kind == "table":
            rows = piece.values[None, :, None, :]  # (1, Hs, 1, nb): one row for every query or key
        else:
            rows = piece.values
        (by_key if piece.transposed else by_query).append((rows, piece.ids))
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "rpe.backend='triton' does not take a learned attn_mask (pass a learned table as a LogitPiece);"
            " use backend=auto"
        )
    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dtype != torch.bool else torch.zeros(
            attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    for term in dense:
        mask = term.detach() if mask is None else mask + term.detach()
    if mask is not None:
        mask = mask.to(q.dtype).expand(B, H, n, n)
    rows_q, ids_q, _ = _side_by_side(by_query, (B, H, n), q)
    rows_k, ids_k, _ = _side_by_side(by_key, (B, H, n), q)
    v_ids, v_tables = [], []
    width_v = 0
    offsets_v = []
    for ids, table in value_tables:
        offsets_v.append(width_v)
        v_ids.append(ids.to(torch.int32) + width_v)
        v_tables.append(table)
        width_v += table.shape[1]
    ids_v = torch.stack(v_ids).contiguous() if v_ids else torch.zeros(0, n, n, dtype=torch.int32, device=q.device)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if dropout_p > 0 else 0
    out, pb = _FusedRPEAttention.apply(
        q, k, v, rows_q, rows_k, ids_q, ids_k, ids_v, width_v, mask, float(scale), float(dropout_p), seed
    )
    for offset, table in zip(offsets_v, v_tables, strict=True):
        per_bucket = pb[..., offset:offset + table.shape[1]].to(q.dtype)  # (B, H, n, nb)
        out = out + per_bucket @ table.to(q.dtype).unsqueeze(0)
    return out


def dropout_keep_mask(B: int, H: int, n: int, dropout_p: float, seed: int, device: torch.device | str) -> Tensor:
    """The kernel's dropout keep mask ``(B, H, n, n)`` bool for ``seed`` (tests rebuild the forward with it)."""
    keep = torch.empty(B, H, n, n, dtype=torch.int8, device=device)
    _keep_mask_kernel[(B * H, triton.cdiv(n, BLOCK_M))](keep, n, float(dropout_p), seed, BM=BLOCK_M, BN=BLOCK_N)
    return keep.bool()
