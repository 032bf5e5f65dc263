//! What the fused-op tests share: deterministic inputs, the largest difference, and the
//! check of a fused op against its composite twin.

use candle_core::{Device, Result, Tensor, Var};

/// The most a fused op's output or gradient may differ from its composite twin's (f32):
/// absolutely for the layers, whose kernels approximate (GELU's erf, the exponentials) to an
/// absolute error; relative to the twin's largest magnitude for the losses
/// ([`Bound::Relative`]), whose gradients are 1e-7 and would pass any absolute bound.
pub const TOLERANCE: f32 = 1e-5;

/// How [`check`] holds a result to its twin's.
#[derive(Clone, Copy)]
pub enum Bound {
    /// Within [`TOLERANCE`].
    Absolute,
    /// Within [`TOLERANCE`] of the twin's largest magnitude.
    Relative,
}

/// Deterministic values in [-scale, scale) (a 64-bit LCG keyed by `seed`).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn var(shape: &[usize], seed: u64, scale: f32) -> Var {
    let n = shape.iter().product();
    Var::from_tensor(&Tensor::from_vec(values(n, seed, scale), shape, &Device::Cpu).unwrap())
        .unwrap()
}

/// Asserts `got` is within `bound` of `want`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, bound: Bound) {
    let diff = max_diff(got, want);
    let (limit, of) = match bound {
        Bound::Absolute => (TOLERANCE, String::new()),
        Bound::Relative => {
            let size = max_abs(want);
            (
                TOLERANCE * size,
                format!(" ({TOLERANCE} of its size {size})"),
            )
        }
    };
    assert!(
        diff <= limit,
        "{what}: differs by {diff}, more than {limit}{of}"
    );
}

/// The largest magnitude in `t`.
pub fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// The largest difference between `a` and `b`, elementwise.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    max_abs(&(a - b).unwrap())
}

/// Runs `fused` and `composite` on the same variables, back-propagates sum(out * r) for a
/// random r through both, and compares outputs and gradients.
pub fn check(
    what: &str,
    inputs: &[Var],
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    composite: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    check_within(what, inputs, fused, composite, Bound::Absolute)
}

/// [`check`] with the given bound.
pub fn check_within(
    what: &str,
    inputs: &[Var],
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    composite: impl Fn(&[Tensor]) -> Result<Tensor>,
    bound: Bound,
) {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let (a, b) = (fused(&ts).unwrap(), composite(&ts).unwrap());
    assert_close(&format!("{what}: the output"), &a, &b, bound);
    let r = Tensor::from_vec(values(a.elem_count(), 99, 1.0), a.shape(), &Device::Cpu).unwrap();
    let ga = (a * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let gb = (b * &r).unwrap().sum_all().unwrap().backward().unwrap();
    for (i, v) in inputs.iter().enumerate() {
        let (x, y) = (ga.get(v), gb.get(v));
        let (Some(x), Some(y)) = (x, y) else {
            panic!("{what}: input {i} has a gradient on one side only");
        };
        assert_close(&format!("{what}: the gradient of input {i}"), x, y, bound);
    }
}
