//! The unit op of full sharding: (input, flat shard) -> output for one wrapped unit.
//!
//! Forward gathers the unit, runs it eagerly without a graph and frees the gathered
//! parameters before returning. Backward gathers again, recomputes the unit with a graph
//! (activation recompute per unit), back-propagates the incoming gradient through it and
//! reduce-scatters the parameter gradient into the shard. Beyond the shards, a rank holds
//! at most three units at once: in backward, the recomputed unit's parameters, its
//! gradients and the previous unit's prefetched gather.

use crate::flat_grad::flatten_consuming;
use crate::flat_layout::FlatLayout;
use crate::gather_op::reduce_to_shard;
use crate::kept_grads::KeptGrads;
use crate::param_use::ParamUse;
use crate::prefetch::{gather, Prefetcher};
use crate::sharded_params::unit_var_builder;
use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor, Var};
use candle_nn::VarBuilder;
use std::sync::Arc;
use wick_core::{Collective, UnitFn};

pub(crate) struct UnitOp {
    pub(crate) world: Arc<dyn Collective>,
    pub(crate) name: String,
    pub(crate) unit: usize,
    pub(crate) layout: FlatLayout,
    pub(crate) run: UnitFn,
    pub(crate) sync: Arc<KeptGrads>,
    /// Where a parameter this unit's backward gives no gradient is reported.
    pub(crate) uses: Arc<ParamUse>,
    pub(crate) device: Device,
    pub(crate) param_dtype: DType,
    pub(crate) reduce_dtype: DType,
    pub(crate) prefetch: Option<Arc<Prefetcher>>,
}

/// A tensor holding a copy of a CPU storage's contiguous elements.
fn host_tensor(storage: &CpuStorage, layout: &Layout) -> Result<Tensor> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("wick unit: inputs must be contiguous".into()))?;
    let shape = layout.shape().clone();
    match storage {
        CpuStorage::F32(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::U32(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::I64(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::U8(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::BF16(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        CpuStorage::F16(v) => Tensor::from_slice(&v[start..end], shape, &Device::Cpu),
        other => candle_core::bail!(
            "wick unit: unsupported input dtype {:?}",
            candle_core::backend::BackendStorage::dtype(other)
        ),
    }
}

impl UnitOp {
    /// The unit's full flat buffer: prefetched if a gather of it is in flight, otherwise
    /// gathered now.
    fn gather(&self, shard: &Tensor) -> Result<Tensor> {
        match self.prefetch.as_ref().and_then(|p| p.take(self.unit)) {
            Some(full) => full,
            None => gather(
                self.world.as_ref(),
                shard,
                self.layout.padded(),
                self.param_dtype,
            ),
        }
    }

    /// The unit's output for `input`, computed without a graph from its gathered
    /// parameters, which are dropped before this returns (before the next unit runs).
    fn forward(&self, input: &Tensor, shard: &Tensor) -> Result<Tensor> {
        let full = self.gather(shard)?;
        self.prefetch(Some(self.unit + 1));
        // Neither the input nor the gathered buffer is a variable: no graph is recorded.
        (self.run)(
            unit_var_builder(&self.name, &self.layout, full, &self.device, None),
            input,
        )
    }

    /// Starts gathering `next`, the unit this pass visits after this one.
    fn prefetch(&self, next: Option<usize>) {
        if let (Some(p), Some(next)) = (&self.prefetch, next) {
            p.request(next);
        }
    }
}

impl CustomOp2 for UnitOp {
    fn name(&self) -> &'static str {
        "wick-unit"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = self.forward(&host_tensor(s1, l1)?, &host_tensor(s2, l2)?)?;
        let shape = out.shape().clone();
        let out = out.flatten_all()?;
        let storage = match out.dtype() {
            DType::BF16 => CpuStorage::BF16(out.to_vec1()?),
            DType::F16 => CpuStorage::F16(out.to_vec1()?),
            _ => CpuStorage::F32(out.to_dtype(DType::F32)?.to_vec1()?),
        };
        Ok((storage, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::cuda_backend::CudaStorage,
        l1: &Layout,
        s2: &candle_core::cuda_backend::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        use crate::device_storage::{storage_of, tensor_of};
        let out = self.forward(&tensor_of(s1, l1)?, &tensor_of(s2, l2)?)?;
        Ok((storage_of(&out)?, out.shape().clone()))
    }

    fn bwd(
        &self,
        input: &Tensor,
        shard: &Tensor,
        _res: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // One variable per parameter, copied out of the gathered buffer (which is dropped at
        // once): back-propagating into views of one flat variable would make candle build a
        // full-size padded gradient per parameter. The previous unit starts gathering only
        // then, so at most two units' parameters are alive at any time.
        let params = {
            let full = self.gather(shard)?;
            self.layout
                .entries()
                .iter()
                .map(|e| {
                    Ok((
                        e.name.clone(),
                        Var::from_tensor(
                            &full
                                .narrow(0, e.offset, e.numel())?
                                .reshape(e.shape.clone())?,
                        )?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?
        };
        self.prefetch(self.unit.checked_sub(1));
        let x = match input.dtype() {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => {
                Some(Var::from_tensor(&input.detach())?)
            }
            _ => None,
        };
        let x_tensor = x
            .as_ref()
            .map_or_else(|| input.detach(), |v| v.as_tensor().clone());
        let tensors = params
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let vb = VarBuilder::from_tensors(tensors, self.param_dtype, &self.device);
        let out = (self.run)(vb, &x_tensor)?;
        // d(sum(out * g))/d(param) is the vector-Jacobian product backward needs.
        let mut grads = (out * grad_out.detach())?.sum_all()?.backward()?;
        let input_grad = match x {
            // The unit cut the graph inside (a layer without backward): the input gets zeros,
            // which candle needs for a node on its path, and is reported as cut.
            Some(v) => Some(match grads.remove(v.as_tensor()) {
                Some(g) => g,
                None => {
                    self.uses.cut(input);
                    input.zeros_like()?
                }
            }),
            None => None,
        };
        let parts: Vec<Option<Tensor>> = params
            .iter()
            .map(|(name, v)| {
                let grad = grads.remove(v.as_tensor());
                if grad.is_none() {
                    self.uses.missed(name);
                }
                grad
            })
            .collect();
        // The parameters go before the flat gradient is allocated, so a rank holds three
        // units at most: gradients, flat buffer and the prefetched previous unit.
        drop(grads);
        drop(params);
        let flat_grad = flatten_consuming(parts, &self.layout, self.param_dtype, &self.device)?;
        let shard_grad = reduce_to_shard(
            self.world.as_ref(),
            &self.sync,
            self.unit,
            &flat_grad,
            self.reduce_dtype,
            shard.elem_count(),
        )?;
        Ok((input_grad, shard_grad))
    }
}
