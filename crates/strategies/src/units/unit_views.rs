//! A gathered unit's parameters as views of its flat buffers: the `VarBuilder` its block
//! is rebuilt over each step.
//!
//! A unit has one flat buffer of trainable parameters and, when some of its parameters are
//! frozen (LoRA's base weights), a second one of those, gathered alike but never a variable
//! and never reduced.

use crate::layout::flat_layout::{FlatEntry, FlatLayout};
use crate::units::param_use::ParamUse;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use std::sync::Arc;

/// A unit's frozen parameters (LoRA's base weights): a flat layout and shard of their own,
/// gathered like the trainable ones but never a variable, never reduced, never stepped.
#[derive(Clone)]
pub(crate) struct FrozenPart {
    pub(crate) layout: FlatLayout,
    pub(crate) shard: Tensor,
}

/// One gathered flat buffer of a unit and where its parameters lie in it.
pub(crate) struct GatheredPart {
    pub(crate) layout: FlatLayout,
    pub(crate) flat: Tensor,
    /// Whether handing out its views is recorded (the trainable part, when looking for
    /// parameters without gradient; a frozen one never has a gradient).
    pub(crate) counted: bool,
}

/// A `VarBuilder` (at the root of the names) whose parameters are views of unit `name`'s
/// gathered `parts`; each view of a counted part handed out is recorded in `uses`, if given.
pub(crate) fn unit_var_builder(
    name: &str,
    parts: Vec<GatheredPart>,
    device: &Device,
    uses: Option<Arc<ParamUse>>,
) -> VarBuilder<'static> {
    // The VarBuilder casts what it hands out to its dtype: keep the buffers' (mixed precision).
    let dtype = parts.first().map_or(DType::F32, |p| p.flat.dtype());
    let views = UnitViews {
        unit: name.to_string(),
        parts,
        uses,
    };
    VarBuilder::from_backend(Box::new(views), dtype, device.clone())
}

/// The parameters of one gathered unit, as views of its flat buffers.
struct UnitViews {
    unit: String,
    parts: Vec<GatheredPart>,
    uses: Option<Arc<ParamUse>>,
}

impl UnitViews {
    fn find(&self, name: &str) -> Option<(&GatheredPart, &FlatEntry)> {
        self.parts
            .iter()
            .find_map(|p| Some((p, p.layout.entry(name)?)))
    }

    /// Parameter `name`'s view of its part's flat buffer.
    fn view(
        &self,
        name: &str,
        part: &GatheredPart,
        entry: &FlatEntry,
    ) -> candle_core::Result<Tensor> {
        let view = entry.view(&part.flat)?;
        if let (Some(uses), true) = (&self.uses, part.counted) {
            uses.hand_out(&view, || vec![name.to_string()]);
        }
        Ok(view)
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
        let (part, entry) = self.find(name).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "unit '{}' asked for parameter '{name}', which it did not create at wrap time; \
                 a unit must ask for the same names every time",
                self.unit
            ))
        })?;
        if entry.shape != shape {
            candle_core::bail!(
                "unit '{}' asked for '{name}' with shape {shape:?}, created with {:?}",
                self.unit,
                entry.shape
            )
        }
        self.view(name, part, entry)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        let (part, entry) = self.find(name).ok_or_else(|| {
            candle_core::Error::Msg(format!("no parameter '{name}' in unit '{}'", self.unit))
        })?;
        self.view(name, part, entry)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.find(name).is_some()
    }
}
