//! Inf and NaN in a step's reduced gradients: found on each rank, agreed on by the ranks
//! in the same all-reduce as the gradients' norm, then either an error naming the first
//! rank and parameter or a step skipped everywhere ([`OnNonFinite`]).
//!
//! Each gradient is checked by the pass that sums its squares for the norm ([`Squares`]:
//! on the CPU in f64, which finite f32 elements never overflow); the pieces of a flat
//! buffer are looked at one by one only once that check says something is there.

use crate::layout::flat_layout::FlatLayout;
use crate::step::clip::{clip_to, squares_each, Squares};
use candle_core::{Device, Tensor};
use std::ops::Range;
use wick_core::{
    Collective, CollectiveExt, Error, OnNonFinite, ReduceOp, Result, StepOptions, StepReport,
};

/// The report of a step without loss scaling whose verdict was `grad_norm` (`None`: skipped).
pub(crate) fn step_report(grad_norm: Option<f64>) -> StepReport {
    StepReport {
        skipped: grad_norm.is_none(),
        grad_norm,
        loss_scale: None,
    }
}

/// The first parameter of `layout` (an index into its entries) whose elements in `flat`
/// hold inf or NaN, where `flat` holds `range` of the layout's flat buffer (a rank's shard,
/// or the whole).
pub(crate) fn first_nonfinite_in(
    layout: &FlatLayout,
    range: Range<usize>,
    flat: &Tensor,
) -> Result<Option<usize>> {
    for (i, _, within, at) in layout.pieces_in(range) {
        if Squares::of(&flat.narrow(0, at, within.len())?)?.nonfinite {
            return Ok(Some(i));
        }
    }
    // Only padding is left, and padding is zeros.
    Ok(None)
}

/// The step's verdict on its reduced `grads`: `Some(norm)`, their global L2 norm, to step
/// (with `grads` then clipped as `options` ask, [`clip_to`]), or `None` to skip it (inf or
/// NaN somewhere under [`OnNonFinite::Skip`]). Where this rank's first gradient with inf
/// or NaN is `grads[i]`, `locate(grads, i)` says which parameter it is (an index `name_of`
/// names): `i` itself where each gradient is one parameter's, or a piece of a flat buffer.
///
/// The ranks of `shards_over` hold disjoint parts of the gradients: one small all-reduce
/// over them carries both what each found and its sum of squares, so the check and the
/// norm cost one collective. `None` when every rank holds the same gradients, so each
/// decides alone. Under [`OnNonFinite::Error`] every rank returns the same
/// [`Error::NonFinite`], naming the first rank with one and that rank's first parameter.
pub(crate) fn check_and_clip(
    grads: &mut [Tensor],
    locate: impl FnOnce(&[Tensor], usize) -> Result<Option<usize>>,
    shards_over: Option<&dyn Collective>,
    options: &StepOptions,
    name_of: impl Fn(usize) -> String,
) -> Result<Option<f64>> {
    let each = squares_each(grads)?;
    let mut squares: f64 = each.iter().map(|s| s.sum).sum();
    let local = match each.iter().position(|s| s.nonfinite) {
        Some(i) => locate(grads, i)?,
        None => None,
    };
    let mut found = local.is_some();
    if let Some(world) = shards_over {
        let both = Tensor::new(&[f32::from(u8::from(found)), squares as f32], &Device::Cpu)?;
        world.all_reduce_in_place(&both, ReduceOp::Sum)?;
        let both = both.to_vec1::<f32>()?;
        found = both[0] > 0.0;
        squares = both[1] as f64;
    }
    match (found, options.on_nonfinite) {
        (false, _) => {
            let norm = squares.sqrt();
            clip_to(grads, norm, options.clip_grad_norm)?;
            Ok(Some(norm))
        }
        (true, OnNonFinite::Skip) => Ok(None),
        (true, OnNonFinite::Error) => Err(blame(local, shards_over, name_of)?),
    }
}

/// The error of a step with inf or NaN under [`OnNonFinite::Error`]: the first rank that
/// found one (every rank learns which, in one more all-reduce) and its first parameter.
fn blame(
    local: Option<usize>,
    shards_over: Option<&dyn Collective>,
    name_of: impl Fn(usize) -> String,
) -> Result<Error> {
    let Some(world) = shards_over else {
        let index = local.expect("this rank found one");
        return Ok(Error::NonFinite {
            rank: 0,
            parameter: name_of(index),
        });
    };
    // Which ranks found one, and where: one slot per rank, its parameter's index + 1.
    let mut slots = vec![0f32; world.world_size()];
    slots[world.rank()] = local.map_or(0.0, |i| (i + 1) as f32);
    let slots = Tensor::from_vec(slots, world.world_size(), &Device::Cpu)?;
    world.all_reduce_in_place(&slots, ReduceOp::Sum)?;
    let slots = slots.to_vec1::<f32>()?;
    let (rank, index) = slots
        .iter()
        .enumerate()
        .find(|(_, &v)| v > 0.0)
        .map(|(r, &v)| (r, v as usize - 1))
        .expect("some rank reported one");
    Ok(Error::NonFinite {
        rank,
        parameter: name_of(index),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Shape};

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
        let options = |on_nonfinite| StepOptions {
            clip_grad_norm: None,
            on_nonfinite,
            find_unused_parameters: false,
        };
        let name_of = |i: usize| ["a", "b"][i].to_string();
        let each_its_own = |_: &[Tensor], i: usize| Ok(Some(i));
        // The second gradient holds a NaN: its parameter is named.
        let fine = Tensor::new(&[1f32, 2.0, 3.0, 4.0], &Device::Cpu).unwrap();
        let mut grads = [fine, shard];
        let err = check_and_clip(
            &mut grads,
            each_its_own,
            None,
            &options(OnNonFinite::Error),
            name_of,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("'b'"), "{err}");
        let mut grads = [Tensor::new(&[3f32, 4.0], &Device::Cpu).unwrap()];
        let skip = options(OnNonFinite::Skip);
        let mut with_inf = [Tensor::new(&[3f32, f32::INFINITY], &Device::Cpu).unwrap()];
        assert_eq!(
            check_and_clip(&mut with_inf, each_its_own, None, &skip, name_of).unwrap(),
            None
        );
        assert_eq!(
            check_and_clip(&mut grads, each_its_own, None, &skip, name_of).unwrap(),
            Some(5.0)
        );
    }

    #[test]
    fn finite_gradients_whose_sum_overflows_f32_are_finite() {
        // Their f32 sum (and, in bf16 or f32, their squares' sum) is inf; no element is.
        let huge = [3e38f32, 3e38, -1e30];
        for dtype in [DType::F32, DType::BF16] {
            let g = Tensor::new(&huge, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let squares = Squares::of(&g).unwrap();
            assert!(!squares.nonfinite, "{dtype:?}: {squares:?}");
            let mut with_nan = huge;
            with_nan[2] = f32::NAN;
            let g = Tensor::new(&with_nan, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            assert!(Squares::of(&g).unwrap().nonfinite, "{dtype:?}");
        }
        let g = Tensor::new(&huge, &Device::Cpu).unwrap();
        let norm = (2.0 * 9e76f64 + 1e60).sqrt();
        let skip = StepOptions {
            clip_grad_norm: None,
            on_nonfinite: OnNonFinite::Skip,
            find_unused_parameters: false,
        };
        let got = check_and_clip(&mut [g], |_, i| Ok(Some(i)), None, &skip, |_| "a".into())
            .unwrap()
            .expect("a step");
        assert!((got - norm).abs() <= 1e-6 * norm, "{got} against {norm}");
    }
}
