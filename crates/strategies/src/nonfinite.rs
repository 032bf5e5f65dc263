//! Inf and NaN in a step's reduced gradients: found on each rank, agreed on by the ranks,
//! then either an error naming the first rank and parameter or a step skipped everywhere
//! ([`OnNonFinite`]).
//!
//! A tensor holds inf or NaN exactly when its sum does (finite gradients do not overflow
//! f32 when summed), so the check is one reduction per tensor; the pieces of a flat buffer
//! are looked at one by one only once that sum says something is there.

use crate::flat_layout::FlatLayout;
use candle_core::{DType, Device, Tensor};
use std::ops::Range;
use wick_core::{Collective, Error, OnNonFinite, ReduceOp, Result};

/// Whether `t` holds inf or NaN.
fn holds_nonfinite(t: &Tensor) -> Result<bool> {
    let sum = t.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    Ok(!sum.is_finite())
}

/// The index of the first of `grads` that holds inf or NaN.
pub(crate) fn first_nonfinite(grads: &[Tensor]) -> Result<Option<usize>> {
    for (i, g) in grads.iter().enumerate() {
        if holds_nonfinite(g)? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The first parameter of `layout` (an index into its entries) whose elements in `flat`
/// hold inf or NaN, where `flat` holds `range` of the layout's flat buffer (a rank's shard,
/// or the whole).
pub(crate) fn first_nonfinite_in(
    layout: &FlatLayout, range: Range<usize>, flat: &Tensor,
) -> Result<Option<usize>> {
    if !holds_nonfinite(flat)? {
        return Ok(None);
    }
    for (i, _, within, at) in layout.pieces_in(range) {
        if holds_nonfinite(&flat.narrow(0, at, within.len())?)? {
            return Ok(Some(i));
        }
    }
    // Only padding is left, and padding is zeros.
    Ok(None)
}

/// Whether to step, given `local`: this rank's first parameter with a non-finite gradient
/// (an index `name_of` names). The ranks of `shards_over` hold disjoint parts of the
/// gradients and decide together with one scalar all-reduce; `None` when every rank holds
/// the same gradients, so each decides alone. `Ok(false)`: skip the step (under
/// [`OnNonFinite::Skip`]). Under [`OnNonFinite::Error`] every rank returns the same
/// [`Error::NonFinite`], naming the first rank with one and that rank's first parameter.
pub(crate) fn agree_finite(
    local: Option<usize>, shards_over: Option<&dyn Collective>, device: &Device,
    policy: OnNonFinite, name_of: impl Fn(usize) -> String,
) -> Result<bool> {
    let Some(world) = shards_over else {
        return match (local, policy) {
            (None, _) => Ok(true),
            (Some(_), OnNonFinite::Skip) => Ok(false),
            (Some(i), OnNonFinite::Error) => Err(Error::NonFinite {
                rank: 0,
                parameter: name_of(i),
            }),
        };
    };
    let found = world.all_reduce_scalar(f32::from(u8::from(local.is_some())), ReduceOp::Sum)?;
    if found == 0.0 {
        return Ok(true);
    }
    if policy == OnNonFinite::Skip {
        return Ok(false);
    }
    // Which ranks found one, and where: one slot per rank, its parameter's index + 1.
    let mut slots = vec![0f32; world.world_size()];
    slots[world.rank()] = local.map_or(0.0, |i| (i + 1) as f32);
    let slots = Tensor::from_vec(slots, world.world_size(), device)?;
    world.all_reduce_in_place(&slots, ReduceOp::Sum)?;
    let slots = slots.to_vec1::<f32>()?;
    let (rank, index) = slots
        .iter()
        .enumerate()
        .find(|(_, &v)| v > 0.0)
        .map(|(r, &v)| (r, v as usize - 1))
        .expect("some rank reported one");
    Err(Error::NonFinite {
        rank,
        parameter: name_of(index),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Shape;

    #[test]
    fn the_first_nonfinite_piece_is_found_in_a_shard() {
        let layout = FlatLayout::new(
            [
                ("a".to_string(), Shape::from(3)),
                ("b".to_string(), Shape::from(4)),
            ],
            2,
        );
        // Rank 1 holds elements 4..8: b's elements 1..4, then one of padding.
        let shard = Tensor::new(&[1f32, f32::NAN, 2.0, 0.0], &Device::Cpu).unwrap();
        assert_eq!(
            first_nonfinite_in(&layout, layout.shard(1).start..layout.shard(1).end, &shard)
                .unwrap(),
            Some(1)
        );
        let whole = Tensor::new(
            &[1f32, 2.0, f32::INFINITY, 0.0, 0.0, 0.0, 0.0, 0.0],
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(first_nonfinite_in(&layout, 0..8, &whole).unwrap(), Some(0));
        let fine = Tensor::new(&[1f32, 2.0, 3.0, 4.0], &Device::Cpu).unwrap();
        assert_eq!(first_nonfinite(&[fine.clone(), shard]).unwrap(), Some(1));
        let err = agree_finite(Some(1), None, &Device::Cpu, OnNonFinite::Error, |i| {
            ["a", "b"][i].to_string()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("'b'"), "{err}");
        assert!(
            !agree_finite(Some(1), None, &Device::Cpu, OnNonFinite::Skip, |_| {
                String::new()
            })
            .unwrap()
        );
    }
}
