"""Dot-product attention: the one place an attention kernel is chosen.

    from stages.train.attention import attention
    out = attention(q, k, v)                                   # causal, kernel picked by platform and shape
    out = attention(q, k, v, segment_ids=doc_ids)              # packed documents, (B, T) ints
    out = attention(q, k_cache, v_cache, segment_ids=(q_ids, kv_ids), impl="blockwise")   # T < S decoding

q (B, T, N, H); k, v (B, S, K, H) with N % K == 0 (grouped-query attention); the result is (B, T, N, H) in
q.dtype, scores scaled by 1/sqrt(H). A query attends to a key only where their segment ids are equal and,
when `causal`, where the key is not in its future: the LAST query is aligned with the LAST key, so query i
sees keys j <= i + (S - T), which is what a chunk of new tokens against a KV cache needs. A query that sees
no key at all gets zeros (never NaN) from every implementation.

Implementations (`IMPLS`):
  xla        the reference: float32 scores, masks, softmax. Materializes (B, N, T, S); fine for short T.
  blockwise  flash attention in pure JAX (online softmax over key blocks, causal blocks above the
             diagonal skipped) with a custom VJP that recomputes block scores from the saved (out,
             logsumexp): activation memory grows with T, not T * S. Runs everywhere.
  cudnn      `jax.nn.dot_product_attention(implementation="cudnn")`; GPU, bfloat16/float16 only. Packed
             documents (segment ids) run blockwise instead, logged once: cuDNN would take them only as a
             dense T x S mask.
  splash     Pallas TPU splash attention; TPU only. A one-device kernel: under a mesh (`jax.set_mesh`) it
             runs inside `shard_map` over the batch and head axes.
  auto       by the platform the step will run on (the active mesh's devices, so compiling ahead of time
             for a TPU topology picks splash; else JAX's backend): cudnn on GPU, splash on TPU, on CPU
             blockwise once T * S >= AUTO_BLOCKWISE_SCORES, else xla.
             A kernel that refuses the shape or dtype (raises while tracing) falls back to blockwise,
             then xla, and the reason is logged once.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from stages.train.mesh import AXES
from stages.train.sharding import logical_to_spec, target_platform

log = logging.getLogger(__name__)

IMPLS = ("xla", "blockwise", "cudnn", "splash", "auto")
AUTO_BLOCKWISE_SCORES = 1024 * 1024      # on CPU, T * S from which `auto` stops materializing the scores
_LOGGED: set[str] = set()                # fallback reasons already logged (each is logged once per process)
# Matmuls accumulate in float32 whatever the input dtype (bfloat16 products, float32 sums).
_einsum32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = True, segment_ids=None,
              impl: str = "auto", block_q: int = 512, block_k: int = 512) -> jax.Array:
    """Softmax(q k^T / sqrt(H)) v with causal and segment masks; see the module docstring.

    segment_ids: None; one int array (B, T) for queries and keys (self-attention, needs T == S); or a pair
      (q_segment_ids (B, T), kv_segment_ids (B, S)). Mark empty KV-cache slots with an id no query has.
    block_q, block_k: tile sizes for `blockwise` and `splash` (clipped to T and S).
    """
    if impl not in IMPLS:
        raise ValueError(f"attention impl={impl!r} is not one of {IMPLS}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"attention block_q={block_q}, block_k={block_k}: both must be >= 1")
    _check_shapes(q, k, v)
    q_seg, kv_seg = _segments(segment_ids, q.shape[:2], k.shape[:2])
    args = (q, k, v, q_seg, kv_seg)
    kwargs = {"causal": bool(causal), "block_q": block_q, "block_k": block_k}
    if impl != "auto":
        return _KERNELS[impl](*args, **kwargs)

    first = _auto_choice(q.shape[1], k.shape[1])
    candidates = list(dict.fromkeys((first, "blockwise", "xla")))
    for i, name in enumerate(candidates):
        try:
            return _KERNELS[name](*args, **kwargs)
        except Exception as e:     # a refusal is whatever the kernel raises while tracing
            if i == len(candidates) - 1:
                raise
            _log_once(f"attention: {name} refused q{q.shape} {q.dtype} k{k.shape}: {e}; "
                      f"falling back to {candidates[i + 1]}")
    raise AssertionError("unreachable")


def _log_once(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        log.warning(reason)


def _auto_choice(T: int, S: int) -> str:
    backend = target_platform()         # the mesh's: "tpu" when compiling ahead of time for a TPU topology
    if backend == "gpu":
        return "cudnn"
    if backend == "tpu":
        return "splash"
    return "blockwise" if T * S >= AUTO_BLOCKWISE_SCORES else "xla"


def _check_shapes(q, k, v) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention wants q (B, T, N, H) and k, v (B, S, K, H); got q{q.shape} k{k.shape} "
                         f"v{v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"attention: k{k.shape} and v{v.shape} must have the same shape (B, S, K, H)")
    (B, _, N, H), (Bk, _, K, Hk) = q.shape, k.shape
    if (Bk, Hk) != (B, H):
        raise ValueError(f"attention: q{q.shape} and k{k.shape} must agree on batch B and head dim H")
    if N % K:
        raise ValueError(f"attention: query heads N={N} must be a multiple of kv heads K={K}")


def _segments(segment_ids, q_shape, kv_shape):
    """Returns (q_seg (B, T), kv_seg (B, S)) as int32, or (None, None)."""
    if segment_ids is None:
        return None, None
    if isinstance(segment_ids, tuple | list):
        if len(segment_ids) != 2:
            raise ValueError(f"attention segment_ids: a pair (q_ids (B, T), kv_ids (B, S)) was expected, "
                             f"got {len(segment_ids)} arrays")
        q_seg, kv_seg = segment_ids
    else:
        if q_shape[1] != kv_shape[1]:
            raise ValueError(f"attention: one segment_ids array needs T == S, got T={q_shape[1]} "
                             f"S={kv_shape[1]}; pass a pair (q_segment_ids, kv_segment_ids)")
        q_seg = kv_seg = segment_ids
    q_seg, kv_seg = jnp.asarray(q_seg), jnp.asarray(kv_seg)
    for name, seg, want in (("q", q_seg, q_shape), ("kv", kv_seg, kv_shape)):
        if tuple(seg.shape) != tuple(want) or not jnp.issubdtype(seg.dtype, jnp.integer):
            raise ValueError(f"attention: {name} segment ids must be integers of shape {tuple(want)}, "
                             f"got {seg.dtype}{tuple(seg.shape)}")
    return q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32)


def _visible(q_pos, kv_pos, q_seg, kv_seg, *, causal: bool, offset: int):
    """Which keys each query may see: (B or 1, Tq, Sk) bool. q_pos (Tq,), kv_pos (Sk,) absolute positions;
    q_seg (B, Tq), kv_seg (B, Sk) or None; offset = S - T aligns the last query with the last key."""
    mask = jnp.ones((1, q_pos.shape[0], kv_pos.shape[0]), bool)
    if causal:
        mask = (kv_pos[None, :] <= q_pos[:, None] + offset)[None]
    if q_seg is not None:
        mask = mask & (q_seg[:, :, None] == kv_seg[:, None, :])
    return mask


def _may_have_empty_rows(q_seg, T: int, S: int, causal: bool) -> bool:
    return q_seg is not None or (causal and T > S)


def _zero_empty_rows(out, q_seg, kv_seg, S: int, *, causal: bool):
    """Zeros the output of queries that see no key (kernels that add a finite mask bias average v there)."""
    T = out.shape[1]
    if not _may_have_empty_rows(q_seg, T, S, causal):
        return out
    # (B, T): a reduction XLA fuses with the comparison, so the (T, S) mask is not stored.
    any_key = _visible(jnp.arange(T), jnp.arange(S), q_seg, kv_seg, causal=causal, offset=S - T).any(-1)
    return jnp.where(any_key[:, :, None, None], out, jnp.zeros((), out.dtype))


# ----------------------------------------------------------------------------------------------- xla
def xla_attention(q, k, v, q_seg=None, kv_seg=None, *, causal: bool = True, block_q: int = 0,
                  block_k: int = 0):
    """The reference: float32 scores (B, K, G, T, S), masked softmax, einsum. Block sizes are ignored."""
    del block_q, block_k
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    q5 = q.reshape(B, T, K, N // K, H)                                               # (B, T, K, G, H)
    s = jnp.einsum("btkgh,bskh->bkgts", q5, k, preferred_element_type=jnp.float32) / math.sqrt(H)
    mask = _visible(jnp.arange(T), jnp.arange(S), q_seg, kv_seg, causal=causal, offset=S - T)
    s = jnp.where(mask[:, None, None], s, -jnp.inf)                                   # (B, K, G, T, S)
    # A fully masked row has max -inf; subtracting 0 instead keeps exp() at 0 and the row at 0, not NaN.
    m = jax.lax.stop_gradient(s.max(-1, keepdims=True))
    e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
    total = e.sum(-1, keepdims=True)
    p = e / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bkgts,bskh->btkgh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, N, H).astype(q.dtype)


# ----------------------------------------------------------------------------------------- blockwise
class _Static(NamedTuple):
    """What the blockwise kernel knows at trace time (hashable: it is a non-differentiable argument)."""
    causal: bool
    segments: bool        # whether segment ids take part (False: the arrays passed are dummies)
    bq: int               # query block
    bk: int               # key block
    T: int                # unpadded lengths: padding keys are masked by position, padded queries are dropped
    S: int


def blockwise_attention(q, k, v, q_seg=None, kv_seg=None, *, causal: bool = True, block_q: int = 512,
                        block_k: int = 512):
    """Flash attention in pure JAX: O(T) activation memory, exact (not approximate) softmax.

    Pads T and S up to multiples of the blocks; grouped-query attention runs on q viewed as (B, T, K, G, H),
    so k and v heads are never repeated.
    """
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    bq, bk = min(block_q, T), min(block_k, S)
    Tp, Sp = -(-T // bq) * bq, -(-S // bk) * bk
    segments = q_seg is not None
    if not segments:
        q_seg, kv_seg = jnp.zeros((B, T), jnp.int32), jnp.zeros((B, S), jnp.int32)
    q5 = _pad(q.reshape(B, T, K, N // K, H), Tp)                                     # (B, Tp, K, G, H)
    out = _flash(q5, _pad(k, Sp), _pad(v, Sp), _pad(q_seg, Tp), _pad(kv_seg, Sp),
                 _Static(causal, segments, bq, bk, T, S))
    return out[:, :T].reshape(B, T, N, H)


def _pad(x, length: int):
    if x.shape[1] == length:
        return x
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _block_mask(qi, kj, qs, ks, st: _Static):
    """(B or 1, 1, 1, bq, bk) bool for query block qi and key block kj; qs (B, bq), ks (B, bk)."""
    q_pos = qi * st.bq + jnp.arange(st.bq)
    kv_pos = kj * st.bk + jnp.arange(st.bk)
    mask = _visible(q_pos, kv_pos, qs if st.segments else None, ks, causal=st.causal, offset=st.S - st.T)
    if st.S % st.bk:                                   # padding keys exist: mask them by position
        mask = mask & (kv_pos < st.S)[None, None, :]
    return mask[:, None, None]


def _kv_blocks_for(qi, st: _Static, nk: int):
    """Key blocks [0, hi) that query block qi can see: with causal, blocks above the diagonal are skipped."""
    if not st.causal:
        return nk
    last_key = qi * st.bq + st.bq - 1 + (st.S - st.T)   # the last key the block's last query may see
    return jnp.clip(last_key // st.bk + 1, 0, nk)


def _q_blocks_for(kj, st: _Static, nq: int):
    """Query blocks [lo, nq) that can see key block kj."""
    if not st.causal:
        return 0
    first_query = kj * st.bk - (st.S - st.T)              # the first query that may see the block's first key
    return jnp.clip(first_query // st.bq, 0, nq)


def _blocks(x, n: int):
    """(B, n * b, ...) -> (n, B, b, ...): blocks along the sequence axis, block index first for scan."""
    return jnp.swapaxes(x.reshape(x.shape[0], n, x.shape[1] // n, *x.shape[2:]), 0, 1)


def _unblock(x):
    """(n, B, b, ...) -> (B, n * b, ...)."""
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, q_seg, kv_seg, st: _Static):
    return _flash_forward(q, k, v, q_seg, kv_seg, st)[0]


def _flash_forward(q, k, v, q_seg, kv_seg, st: _Static):
    """q (B, Tp, K, G, H), k, v (B, Sp, K, H) -> out (B, Tp, K, G, H) in q.dtype, lse (nq, B, K, G, bq)."""
    B, Tp, K, G, H = q.shape
    nq, nk = Tp // st.bq, k.shape[1] // st.bk
    scale = 1.0 / math.sqrt(H)
    kb, vb, ksb = _blocks(k, nk), _blocks(v, nk), _blocks(kv_seg, nk)             # (nk, B, bk, ...)

    def q_block(_, xs):
        qi, q_i, qs_i = xs                                                        # q_i (B, bq, K, G, H)

        def kv_step(kj, carry):
            m, total, acc = carry                            # (B, K, G, bq), same, (B, K, G, bq, H)
            s = _einsum32("bqkgh,bskh->bkgqs", q_i, kb[kj]) * scale
            s = jnp.where(_block_mask(qi, kj, qs_i, ksb[kj], st), s, -jnp.inf)   # (B, K, G, bq, bk)
            m_new = jnp.maximum(m, s.max(-1))
            # While a row has seen no visible key its max is -inf; shift by 0 so exp() gives 0, not NaN.
            shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            p = jnp.exp(s - shift[..., None])
            alpha = jnp.exp(m - shift)                                              # rescales the old sums
            pv = _einsum32("bkgqs,bskh->bkgqh", p.astype(v.dtype), vb[kj])
            return m_new, alpha * total + p.sum(-1), alpha[..., None] * acc + pv

        stats = jnp.full((B, K, G, st.bq), -jnp.inf, jnp.float32), jnp.zeros((B, K, G, st.bq), jnp.float32)
        init = (*stats, jnp.zeros((B, K, G, st.bq, H), jnp.float32))
        m, total, acc = jax.lax.fori_loop(0, _kv_blocks_for(qi, st, nk), kv_step, init)
        seen = total > 0                                     # False: the query sees no key, output 0
        total = jnp.where(seen, total, 1.0)
        out = acc / total[..., None]
        lse = jnp.where(seen, m + jnp.log(total), 0.0)
        return None, (jnp.moveaxis(out, 3, 1).astype(q.dtype), lse)              # (B, bq, K, G, H)

    _, (out, lse) = jax.lax.scan(q_block, None, (jnp.arange(nq), _blocks(q, nq), _blocks(q_seg, nq)))
    return _unblock(out), lse


def _flash_fwd(q, k, v, q_seg, kv_seg, st: _Static):
    out, lse = _flash_forward(q, k, v, q_seg, kv_seg, st)
    return out, (q, k, v, q_seg, kv_seg, out, lse)


def _flash_bwd(st: _Static, residuals, d_out):
    """FlashAttention-2 backward: outer loop over key blocks (dk, dv accumulate in the carry), inner loop over
    the query blocks that see them; dq accumulates in place in an O(T) buffer. Scores are recomputed per block
    from lse, so no (T, S) array exists."""
    q, k, v, q_seg, kv_seg, out, lse = residuals
    B, Tp, K, G, H = q.shape
    nq, nk = Tp // st.bq, k.shape[1] // st.bk
    scale = 1.0 / math.sqrt(H)
    # delta_i = sum_h dO_ih O_ih = sum_j P_ij dP_ij: the softmax Jacobian's row term.
    delta = jnp.einsum("btkgh,btkgh->bkgt", d_out.astype(jnp.float32), out.astype(jnp.float32))
    delta = jnp.moveaxis(delta.reshape(B, K, G, nq, st.bq), 3, 0)                  # (nq, B, K, G, bq)
    qb, dob, qsb = _blocks(q, nq), _blocks(d_out, nq), _blocks(q_seg, nq)

    def kv_block(dq, xs):
        kj, k_j, v_j, ks_j = xs                                                   # k_j (B, bk, K, H)

        def q_step(qi, carry):
            dk, dv, dq = carry
            q_i, do_i = qb[qi], dob[qi]                                           # (B, bq, K, G, H)
            s = _einsum32("bqkgh,bskh->bkgqs", q_i, k_j) * scale
            p = jnp.where(_block_mask(qi, kj, qsb[qi], ks_j, st), jnp.exp(s - lse[qi][..., None]), 0.0)
            dv = dv + _einsum32("bkgqs,bqkgh->bskh", p.astype(do_i.dtype), do_i)
            dp = _einsum32("bqkgh,bskh->bkgqs", do_i, v_j)
            ds = p * (dp - delta[qi][..., None]) * scale                           # (B, K, G, bq, bk)
            dk = dk + _einsum32("bkgqs,bqkgh->bskh", ds.astype(q.dtype), q_i)
            dq_i = _einsum32("bkgqs,bskh->bqkgh", ds.astype(k.dtype), k_j)
            return dk, dv, dq.at[qi].add(dq_i)

        zeros = jnp.zeros((B, st.bk, K, H), jnp.float32)
        dk, dv, dq = jax.lax.fori_loop(_q_blocks_for(kj, st, nq), nq, q_step, (zeros, zeros, dq))
        return dq, (dk, dv)

    dq0 = jnp.zeros((nq, B, st.bq, K, G, H), jnp.float32)
    dq, (dk, dv) = jax.lax.scan(kv_block, dq0, (jnp.arange(nk), _blocks(k, nk), _blocks(v, nk),
                                                 _blocks(kv_seg, nk)))
    return (_unblock(dq).astype(q.dtype), _unblock(dk).astype(k.dtype), _unblock(dv).astype(v.dtype),
            None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


# --------------------------------------------------------------------------------------------- cudnn
def cudnn_attention(q, k, v, q_seg=None, kv_seg=None, *, causal: bool = True, block_q: int = 512,
                    block_k: int = 512):
    """cuDNN flash attention through `jax.nn.dot_product_attention`; GPU and bfloat16/float16 only.

    Packed documents (segment ids) go to `blockwise` instead, logged once: jax.nn.dot_product_attention
    takes them only as a dense (B, 1, T, S) mask, which becomes a T x S bias per call (512 MiB per layer at
    T = 16K), and that is not flash attention. Its `is_causal` aligns the first query with the first key, so
    it is used when T == S; for T != S (a few queries against a KV cache) the small (B, 1, T, S) causal mask
    is passed instead. The block sizes are used only by the blockwise fallback.
    """
    _require_backend("cudnn", "gpu")
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"attention impl='cudnn' needs bfloat16 or float16 inputs, got {q.dtype}")
    if q_seg is not None:
        _log_once(f"attention: cudnn takes packed documents only as a dense (T, S) mask; using blockwise "
                  f"for q{q.shape} k{k.shape} with segment ids")
        return blockwise_attention(q, k, v, q_seg, kv_seg, causal=causal, block_q=block_q, block_k=block_k)
    T, S = q.shape[1], k.shape[1]
    is_causal = causal and T == S
    mask = None
    if causal and not is_causal:
        mask = _visible(jnp.arange(T), jnp.arange(S), None, None, causal=True, offset=S - T)[:, None]
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, implementation="cudnn")
    return _zero_empty_rows(out, None, None, S, causal=causal).astype(q.dtype)


def _require_backend(impl: str, platform: str) -> None:
    backend = target_platform()
    if backend != platform:
        raise ValueError(f"attention impl={impl!r} needs a {platform.upper()}, but it would run on "
                         f"{backend!r}; use impl='blockwise' (any platform) or 'auto'")


# -------------------------------------------------------------------------------------------- splash
def splash_attention(q, k, v, q_seg=None, kv_seg=None, *, causal: bool = True, block_q: int = 512,
                     block_k: int = 512, interpret: bool = False):
    """Pallas splash attention (TPU). T and S must be multiples of 128 and of the (clipped) blocks.

    Grouped-query attention uses the MQA kernel once per kv head: q (G, T, H) against k, v (S, H).
    The kernel sees one device's arrays, so under a mesh (`jax.set_mesh`, as training traces its steps) it
    runs inside `jax.shard_map`: each device takes its rows of the batch and its heads, placed as the model
    places them (logical axes "batch", "heads", "kv_heads"), and the whole sequence.
    `interpret=True` runs the kernel in the Pallas interpreter (any backend; slow, for tests only).
    """
    if not interpret:
        _require_backend("splash", "tpu")
    T, S = q.shape[1], k.shape[1]
    bq, bk = min(block_q, T), min(block_k, S)
    if T % 128 or S % 128 or T % bq or S % bk or bq % 128 or bk % 128:
        raise ValueError(f"attention impl='splash' needs T={T} and S={S} to be multiples of 128 and of the "
                         f"blocks (block_q={bq}, block_k={bk}, themselves multiples of 128)")
    local = functools.partial(_splash_one_device, causal=causal, bq=bq, bk=bk, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(q, k, v, q_seg, kv_seg)
    return _splash_sharded(local, mesh, q, k, v, q_seg, kv_seg)


def _splash_sharded(local, mesh, q, k, v, q_seg, kv_seg):
    """`local` under `jax.shard_map` over the batch and head axes of `mesh`; the sequence stays whole.

    When the kv heads are not split like the query heads (K not divisible by the tensor axis), k and v are
    repeated to one head per query head first, so every device holds the kv heads its query heads use.
    """
    if not set(AXES) <= set(mesh.axis_names):       # not a training mesh: every device computes it all
        q_spec = kv_spec = seg_spec = jax.P()
    else:
        q_spec = logical_to_spec(("batch", "length", "heads", "head_dim"), q.shape, mesh)
        kv_spec = logical_to_spec(("batch", "length", "kv_heads", "head_dim"), k.shape, mesh)
        if kv_spec[2] != q_spec[2]:
            G = q.shape[2] // k.shape[2]
            k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)              # (B, S, N, H)
            kv_spec = q_spec
        seg_spec = jax.P(q_spec[0], None)
    if q_seg is None:
        body = lambda q, k, v: local(q, k, v, None, None)                          # noqa: E731
        specs, args = (q_spec, kv_spec, kv_spec), (q, k, v)
    else:
        body, specs, args = local, (q_spec, kv_spec, kv_spec, seg_spec, seg_spec), (q, k, v, q_seg, kv_seg)
    # check_vma=False: the Pallas call does not annotate how its outputs vary over the mesh axes.
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)(*args)


def _splash_one_device(q, k, v, q_seg, kv_seg, *, causal: bool, bq: int, bk: int, interpret: bool):
    """The kernel on one device's arrays: q (B, T, N, H), k, v (B, S, K, H) -> (B, T, N, H)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    kernel = _splash_kernel(T, S, G, causal, bq, bk, interpret)
    # The kernel does not scale the scores; scale q (cheaper than the (T, S) scores).
    q_kgth = jnp.transpose(q.reshape(B, T, K, G, H), (0, 2, 3, 1, 4)) * jnp.asarray(H ** -0.5, q.dtype)
    k_ksh, v_ksh = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # (B, K, S, H)

    if q_seg is None:
        def one(q1, k1, v1):                                     # (G, T, H), (S, H), (S, H) -> (G, T, H)
            return kernel(q1, k1, v1)
        out = jax.vmap(jax.vmap(one))(q_kgth, k_ksh, v_ksh)
    else:
        def one(q1, k1, v1, qs, ks):
            return kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=qs, kv=ks))
        per_batch = jax.vmap(one, in_axes=(0, 0, 0, None, None))             # over kv heads
        out = jax.vmap(per_batch)(q_kgth, k_ksh, v_ksh, q_seg, kv_seg)      # over batch
    out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, N, H)         # (B, K, G, T, H) -> (B, T, N, H)
    return _zero_empty_rows(out, q_seg, kv_seg, S, causal=causal).astype(q.dtype)


def _splash_kernel(T: int, S: int, G: int, causal: bool, bq: int, bk: int, interpret: bool):
    """The MQA kernel for G query heads per kv head, built anew in every trace that uses it.

    Never cache the kernel across traces: `make_splash_mqa` turns its mask tables into arrays with
    `jnp.array`, which inside a trace makes constants of that program (tracers), so a kernel kept from the
    train step's trace breaks the eval step's (UnexpectedTracerError), and building it outside the trace
    would run JAX eagerly on the mesh's devices, which an ahead-of-time compile for a TPU topology does
    not have. The costly part, turning the mask into block tables (numpy), is cached by JAX itself
    (`splash_attention_mask_info._process_mask`, keyed by the mask's shape and blocks), so a rebuild is
    cheap: this is how the splash API expects to be called.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    head_mask = splash.CausalMask((T, S), offset=S - T) if causal else splash.FullMask((T, S))
    sizes = splash.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                              block_kv_dkv_compute=bk, use_fused_bwd_kernel=True)
    return splash.make_splash_mqa(splash.MultiHeadMask([head_mask] * G), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


_KERNELS = {"xla": xla_attention, "blockwise": blockwise_attention, "cudnn": cudnn_attention,
            "splash": splash_attention}
