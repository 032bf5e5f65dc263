//! `swiglu`: Llama's gated MLP activation, `silu(gate) * up`, one op forward and one op
//! backward, where Candle runs a unary op, a product and their backward's four more.

use crate::cpu::{f32_inputs, fused, map_pairs, ELEMENTWISE_CHUNK};
use crate::fused_op::{CpuOp, CpuOut, Fused, GradsOf, Input};
use crate::vector_math;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use rayon::prelude::*;

/// `silu(gate) * up`, element-wise, for `gate` and `up` of one shape (`silu(x) = x *
/// sigmoid(x)`). Fused on the CPU in f32; Candle's `silu` and product elsewhere.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        candle_core::bail!(
            "swiglu: gate {:?} and up {:?} differ in shape",
            gate.dims(),
            up.dims()
        )
    }
    match fused(&[gate, up]) {
        true => gate
            .contiguous()?
            .apply_op2(&up.contiguous()?, Fused(Forward)),
        false => swiglu_composite(gate, up),
    }
}

/// The same from Candle's ops (the fallback, and the reference in tests).
pub fn swiglu_composite(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

struct Forward;

impl CpuOp<2> for Forward {
    const NAME: &'static str = "wick-swiglu";

    fn cpu(&self, inputs: [Input<'_>; 2]) -> CpuOut {
        let [g, u] = f32_inputs(Self::NAME, inputs)?;
        let y = map_pairs(Self::NAME, g, u, vector_math::swiglu)?;
        Ok((CpuStorage::F32(y), inputs[0].1.shape().clone()))
    }

    fn grads(&self, [gate, up]: [&Tensor; 2], _res: &Tensor, grad: &Tensor) -> GradsOf<2> {
        let n = gate.elem_count();
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &Fused(Backward))?;
        Ok([
            Some(both.narrow(0, 0, n)?.reshape(gate.shape())?),
            Some(both.narrow(0, n, n)?.reshape(gate.shape())?),
        ])
    }
}

/// (gate, up, dy) -> [dgate, dup] end to end.
struct Backward;

impl CpuOp<3> for Backward {
    const NAME: &'static str = "wick-swiglu-backward";

    fn cpu(&self, inputs: [Input<'_>; 3]) -> CpuOut {
        let [g, u, dy] = f32_inputs(Self::NAME, inputs)?;
        let n = g.len();
        let mut both = vec![0f32; 2 * n];
        let (dg, du) = both.split_at_mut(n);
        dg.par_chunks_mut(ELEMENTWISE_CHUNK)
            .zip(du.par_chunks_mut(ELEMENTWISE_CHUNK))
            .zip(
                g.par_chunks(ELEMENTWISE_CHUNK)
                    .zip(u.par_chunks(ELEMENTWISE_CHUNK)),
            )
            .zip(dy.par_chunks(ELEMENTWISE_CHUNK))
            .for_each(|(((dg, du), (g, u)), dy)| vector_math::swiglu_backward(dg, du, g, u, dy));
        Ok((CpuStorage::F32(both), Shape::from(2 * n)))
    }
}
