//! What the fused-op tests share: deterministic inputs, the largest difference, and the
//! check of a fused op against its composite twin.

use candle_core::{Device, Result, Tensor, Var};

/// The most a fused op's output or gradient may differ from its composite twin's (f32).
pub const TOLERANCE: f32 = 1e-5;

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

pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Runs `fused` and `composite` on the same variables, back-propagates sum(out * r) for a
/// random r through both, and compares outputs and gradients.
pub fn check(
    what: &str, inputs: &[Var], fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    composite: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let (a, b) = (fused(&ts).unwrap(), composite(&ts).unwrap());
    let diff = max_diff(&a, &b);
    assert!(diff <= TOLERANCE, "{what}: outputs differ by {diff}");
    let r = Tensor::from_vec(values(a.elem_count(), 99, 1.0), a.shape(), &Device::Cpu).unwrap();
    let ga = (a * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let gb = (b * &r).unwrap().sum_all().unwrap().backward().unwrap();
    for (i, v) in inputs.iter().enumerate() {
        let (x, y) = (ga.get(v), gb.get(v));
        let (Some(x), Some(y)) = (x, y) else {
            panic!("{what}: input {i} has a gradient on one side only");
        };
        let diff = max_diff(x, y);
        assert!(
            diff <= TOLERANCE,
            "{what}: gradient of input {i} differs by {diff}"
        );
    }
}
