//! A gathered unit's parameters as views of its flat buffers: the `VarBuilder` its block
//! is rebuilt over each step.
//!
//! A unit has one flat buffer of trainable parameters and, when some of its parameters are
//! frozen (LoRA's base weights), frozen parts gathered alike but never a variable and never
//! reduced: one of values and, for a base born quantized, one of stored blocks, whose
//! parameters are handed out as their stored bytes.

use crate::layout::block_layout::{decoded, BlockLayout};
use crate::layout::flat_layout::FlatLayout;
use crate::units::param_use::ParamUse;
use crate::units::prefetch::gather;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use std::collections::HashMap;
use std::sync::Arc;
use wick_core::Collective;

/// How a part of a unit lays out its parameters: values end to end (in the compute dtype
/// once gathered), or a quantized base's stored blocks (bytes, gathered as they are).
#[derive(Clone)]
pub(crate) enum PartLayout {
    Values(FlatLayout),
    Blocks(BlockLayout),
}

impl PartLayout {
    /// The gathered buffer's length, in elements of the shard's dtype.
    pub(crate) fn padded(&self) -> usize {
        match self {
            PartLayout::Values(l) => l.padded(),
            PartLayout::Blocks(l) => l.padded(),
        }
    }

    /// The values its parameters hold together.
    pub(crate) fn numel(&self) -> usize {
        match self {
            PartLayout::Values(l) => l.numel(),
            PartLayout::Blocks(l) => l.numel(),
        }
    }

    /// The buffer its views are taken from, out of the gathered one: the same, or, for
    /// blocks, packed again without the shards' padding.
    pub(crate) fn unpack(&self, gathered: Tensor) -> candle_core::Result<Tensor> {
        match self {
            PartLayout::Values(_) => Ok(gathered),
            PartLayout::Blocks(l) => l.pack(&gathered),
        }
    }

    /// Whether the part holds parameter `name`.
    fn holds(&self, name: &str) -> bool {
        match self {
            PartLayout::Values(l) => l.entry(name).is_some(),
            PartLayout::Blocks(l) => l.entry(name).is_some(),
        }
    }

    /// Parameter `name`'s full shape and its view of the unpacked buffer `flat` (its values
    /// in its shape, or its stored blocks, u8, as a strategy hands out a weight born
    /// quantized), if the part holds it.
    fn view(&self, name: &str, flat: &Tensor) -> Option<candle_core::Result<(Shape, Tensor)>> {
        let shaped =
            |shape: &Shape, view: candle_core::Result<Tensor>| view.map(|v| (shape.clone(), v));
        match self {
            PartLayout::Values(l) => l.entry(name).map(|e| shaped(&e.shape, e.view(flat))),
            PartLayout::Blocks(l) => l.entry(name).map(|e| shaped(&e.shape, e.view(flat))),
        }
    }

    /// Every parameter's f32 values, decoded where kept as blocks, from the unpacked `flat`.
    pub(crate) fn values(&self, flat: &Tensor) -> candle_core::Result<Vec<(String, Tensor)>> {
        match self {
            PartLayout::Values(l) => l.views(flat),
            PartLayout::Blocks(l) => l
                .entries()
                .iter()
                .map(|e| {
                    Ok((
                        e.name.clone(),
                        decoded(l.format(), &e.name, &e.view(flat)?, &e.shape)?,
                    ))
                })
                .collect(),
        }
    }
}

/// A unit's frozen parameters (LoRA's base weights): a layout and shard of their own,
/// gathered like the trainable ones but never a variable, never reduced, never stepped. A
/// unit has one of values and, with a quantized base, one of stored blocks.
#[derive(Clone)]
pub(crate) struct FrozenPart {
    pub(crate) layout: PartLayout,
    pub(crate) shard: Tensor,
}

impl FrozenPart {
    /// The part's unpacked buffer, gathered now over `world` (values in `dtype`).
    pub(crate) fn gather(
        &self,
        world: &dyn Collective,
        dtype: DType,
    ) -> candle_core::Result<Tensor> {
        let full = gather(world, &self.shard, self.layout.padded(), dtype)?;
        self.layout.unpack(full)
    }

    /// The part over its unpacked buffer `flat`, as a unit's parameters are viewed (never
    /// counted: a frozen parameter has no gradient to miss).
    pub(crate) fn gathered(&self, flat: Tensor) -> GatheredPart {
        GatheredPart {
            layout: self.layout.clone(),
            flat,
            counted: false,
        }
    }
}

/// One gathered buffer of a unit (unpacked) and where its parameters lie in it.
pub(crate) struct GatheredPart {
    pub(crate) layout: PartLayout,
    pub(crate) flat: Tensor,
    /// Whether handing out its views is recorded (the trainable part, when looking for
    /// parameters without gradient; a frozen one never has a gradient).
    pub(crate) counted: bool,
}

/// A `VarBuilder` (at the root of the names) of dtype `dtype` whose parameters are `given`
/// tensors (the kept graph's variables) and views of unit `name`'s gathered `parts`; each
/// view of a counted part handed out is recorded in `uses`, if given.
pub(crate) fn unit_var_builder(
    name: &str,
    given: HashMap<String, Tensor>,
    parts: Vec<GatheredPart>,
    dtype: DType,
    device: &Device,
    uses: Option<Arc<ParamUse>>,
) -> VarBuilder<'static> {
    let views = UnitViews {
        unit: name.to_string(),
        given,
        parts,
        uses,
    };
    VarBuilder::from_backend(Box::new(views), dtype, device.clone())
}

/// The parameters of one gathered unit, as given tensors and views of its buffers.
struct UnitViews {
    unit: String,
    given: HashMap<String, Tensor>,
    parts: Vec<GatheredPart>,
    uses: Option<Arc<ParamUse>>,
}

impl UnitViews {
    /// Parameter `name`'s full shape and tensor.
    fn find(&self, name: &str) -> Option<candle_core::Result<(Shape, Tensor)>> {
        if let Some(t) = self.given.get(name) {
            return Some(Ok((t.shape().clone(), t.clone())));
        }
        self.parts.iter().find_map(|part| {
            let found = part.layout.view(name, &part.flat)?;
            Some(found.inspect(|(_, view)| {
                if let (Some(uses), true) = (&self.uses, part.counted) {
                    uses.hand_out(view, || vec![name.to_string()]);
                }
            }))
        })
    }

    fn missing(&self, name: &str) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "unit '{}' asked for parameter '{name}', which it did not create at wrap time; \
             a unit must ask for the same names every time",
            self.unit
        ))
    }
}

impl SimpleBackend for UnitViews {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _: Init,
        _: DType,
        _: &Device,
    ) -> candle_core::Result<Tensor> {
        let (created, tensor) = self.find(name).ok_or_else(|| self.missing(name))??;
        if created != shape {
            candle_core::bail!(
                "unit '{}' asked for '{name}' with shape {shape:?}, created with {created:?}",
                self.unit
            )
        }
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        let (_, tensor) = self.find(name).ok_or_else(|| self.missing(name))??;
        Ok(tensor)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.given.contains_key(name) || self.parts.iter().any(|p| p.layout.holds(name))
    }
}
