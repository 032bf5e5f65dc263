//! `swiglu`: Llama's gated MLP activation, `silu(gate) * up`, one op forward and one op
//! backward, where Candle runs a unary op, a product and their backward's four more.

use crate::cpu::{f32_inputs, fused};
use crate::vector_math;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 32 * 1024;

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
        true => gate.contiguous()?.apply_op2(&up.contiguous()?, Forward),
        false => swiglu_composite(gate, up),
    }
}

/// The same from Candle's ops (the fallback, and the reference in tests).
pub fn swiglu_composite(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

struct Forward;

impl CustomOp2 for Forward {
    fn name(&self) -> &'static str {
        "wick-swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [g, u] = f32_inputs(self.name(), [(gs, gl), (us, ul)])?;
        let mut y = vec![0f32; g.len()];
        y.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(y, (g, u))| vector_math::swiglu(y, g, u));
        Ok((CpuStorage::F32(y), gl.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = gate.elem_count();
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &Backward)?;
        Ok((
            Some(both.narrow(0, 0, n)?.reshape(gate.shape())?),
            Some(both.narrow(0, n, n)?.reshape(gate.shape())?),
        ))
    }
}

/// (gate, up, dy) -> [dgate, dup] end to end.
struct Backward;

impl CustomOp3 for Backward {
    fn name(&self) -> &'static str {
        "wick-swiglu-backward"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let name = self.name();
        let [g, u, dy] = f32_inputs(name, [(gs, gl), (us, ul), (ds, dl)])?;
        let n = g.len();
        let mut both = vec![0f32; 2 * n];
        let (dg, du) = both.split_at_mut(n);
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .zip(dy.par_chunks(CHUNK))
            .for_each(|(((dg, du), (g, u)), dy)| vector_math::swiglu_backward(dg, du, g, u, dy));
        Ok((CpuStorage::F32(both), Shape::from(2 * n)))
    }
}
