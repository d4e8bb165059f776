"""A training runtime as torch custom ops (imported only when torch is wanted).

Each kernel — the forward and every backward kernel of the manifest — is one
`torch.library.custom_op` `derivc::<spec>_<digest>[__<kernel>]` with a fake implementation (the
output's shape from the kernel's dims, its dtype from the build), so torch.compile traces through
it without a graph break and without running it.  The forward op carries the autograd formula:
setup_context saves the inputs and the saved forward outputs, backward calls the backward ops in
manifest order and gives None for the inputs not in wrt.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from compiler.machine import DTYPES

from .build_dir import LoadedBuild
from .kernel_check import given_sizes

if TYPE_CHECKING:
    from .training import Training


def register_training_op(t: "Training") -> Callable[..., Any]:
    import torch

    for b in (t.forward_build, *t.backward_builds):
        k = b.printed.kernel
        by_name = given_sizes(b.printed, {n: 0 for n in k.dynamic()})
        if by_name:
            raise ValueError(f"{b.out_dir}: size {', '.join(by_name)} is given by name (no input's shape gives it): "
                             "the torch op cannot take it; use Training.forward / backward")
    m = t.manifest
    forward = _kernel_op(torch, f"derivc::{t.name}", t.forward_build, t._forward)
    backward_ops = tuple(_kernel_op(torch, f"derivc::{t.name}__{e.name}", b, run)
                         for e, b, run in zip(m.kernels, t.backward_builds, t._backward))
    n_inputs = len(t.inputs)
    out_names = tuple(o.name for o in t.forward_build.printed.kernel.outputs)  # O, then LSE, …

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        if len(outs) > 1:  # a statistic the forward writes for the backward (LSE): no gradient
            ctx.mark_non_differentiable(*outs[1:])
        by_name = dict(zip(out_names, outs))
        ctx.save_for_backward(*inputs, *(by_name[s] for s in m.saved))

    def backward(ctx: Any, grad: Any, *_statistics: Any) -> Any:
        saved = ctx.saved_tensors
        env = dict(zip(t.inputs, saved[:n_inputs]))
        env.update(zip(m.saved, saved[n_inputs:]))
        env[m.seed] = grad.contiguous()
        for entry, build, op in zip(m.kernels, t.backward_builds, backward_ops):
            res = op(*(env[n] for n in build.inputs))
            env.update(zip((n for n, _, _ in entry.outputs), res if entry.also else (res,)))
        grads = dict(m.grads)
        return tuple(env[grads[x]] if x in grads else None for x in t.inputs)

    forward.register_autograd(backward, setup_context=setup_context)
    if len(out_names) == 1:
        return forward

    def output_only(*xs: Any) -> Any:
        """The forward output (the op returns the further outputs too, for the backward)."""
        return forward(*xs)[0]

    output_only.op = forward  # type: ignore[attr-defined]
    return output_only


def _kernel_op(torch: Any, qualname: str, build: LoadedBuild, run: Callable[..., Any]) -> Any:
    """One kernel as a custom op: (its inputs, by name) -> its output (a tuple: its outputs, for a
    forward that writes LSE beside O); fake: shapes and dtypes."""
    kernel = build.printed.kernel
    names = tuple(t.name for t in kernel.inputs)
    fixed = kernel.fixed()
    outs = kernel.outputs
    out_dtypes = tuple(getattr(torch, DTYPES[o.dtype].torch) for o in outs)
    result = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    schema = f"({', '.join(f'Tensor {n}' for n in names)}) -> {result}"

    def impl(*xs: Any) -> Any:
        return run(*xs)

    def fake(*xs: Any) -> Any:
        sizes: dict[str, Any] = dict(fixed)
        for t, x in zip(kernel.inputs, xs):
            for a, n in zip(t.dims, x.shape):
                if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const:
                    sizes.setdefault(a.terms[0][0], n)
        made = tuple(xs[0].new_empty(tuple(a.evaluate(sizes) for a in o.dims), dtype=dt)
                     for o, dt in zip(outs, out_dtypes))
        return made[0] if len(made) == 1 else made

    op = torch.library.custom_op(qualname, impl, mutates_args=(), device_types="cuda", schema=schema)
    op.register_fake(fake)
    return op
