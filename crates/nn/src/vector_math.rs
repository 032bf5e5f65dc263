//! Element-wise math over f32 slices in the widest SIMD the CPU has.
//!
//! A default x86-64 build targets SSE2 only, and `f32::exp` is a libm call the compiler
//! cannot vectorise. The fused softmax and cross-entropy spend most of their time in
//! exponentials, so this module computes them with Cephes' single-precision polynomial
//! (about one unit in the last place, inputs clamped to f32's range), written so that the
//! compiler vectorises it, and compiled three times: for AVX-512, for AVX2 with FMA, and for
//! the baseline, picked at run time. Every version computes the same operations in the same
//! order, element by element, so the result does not depend on which one runs (FMA is not
//! used: each multiply and add rounds on its own).

/// `ln 2`, split so that `n * LN2_HI` is exact for the exponents `exp` meets.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;
/// The bits of `ROUND`.
const ROUND_BITS: i32 = 0x4B40_0000;
/// Inputs are clamped to this range: above it e^x overflows to infinity, below it e^x
/// rounds to zero (the smallest subnormal f32 is e^-103.28), so no input, infinities
/// included, reaches the polynomial out of its range, and NaN stays NaN.
const MAX_ARG: f32 = 89.0;
const MIN_ARG: f32 = -110.0;

/// e^x, for one element: e^r by the polynomial, times 2^n in two normal factors, so that
/// results below the smallest normal f32 come out subnormal (or zero) and those above the
/// largest overflow to infinity, as libm's do. Where the result is normal the two
/// multiplications by powers of two are exact: the same bits as one by 2^n.
#[inline(always)]
fn exp1(x: f32) -> f32 {
    let x = x.clamp(MIN_ARG, MAX_ARG);
    // x = n ln 2 + r, |r| <= ln 2 / 2; n in the low bits of `t`.
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let rr = r * r;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * rr + r + 1.0;
    // n in [-159, 129]: each half in [-80, 65], a normal power of two.
    let n = t.to_bits() as i32 - ROUND_BITS;
    let (n1, n2) = (n >> 1, n - (n >> 1));
    let pow2 = |k: i32| f32::from_bits(((k + 127) << 23) as u32);
    (e_r * pow2(n1)) * pow2(n2)
}

/// Compiles `$body` once per instruction set and picks one at run time.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has the instructions this version was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// Eight running sums of `term(x)` over `xs`, added in a fixed order at the end (one
/// sequential chain of adds could not use SIMD lanes).
#[inline(always)]
fn sum8(xs: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&x| term(x)).sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += term(c[l]);
        }
    }
    fold8(acc) + tail
}

/// Eight running sums added in the fixed order every lane-summing kernel here uses.
#[inline(always)]
fn fold8(acc: [f32; 8]) -> f32 {
    let pairs = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (pairs[0] + pairs[2]) + (pairs[1] + pairs[3])
}

multiversion! {
    /// `xs[i] = e^(xs[i] - shift)`.
    fn exp_shifted(xs: &mut [f32], shift: f32) -> () {
        for x in xs.iter_mut() {
            *x = exp1(*x - shift);
        }
    }
}

multiversion! {
    /// The sum of `e^(x - shift)` over `xs` (eight running sums, added in a fixed order).
    fn sum_exp_shifted(xs: &[f32], shift: f32) -> f32 {
        sum8(xs, |x| exp1(x - shift))
    }
}

/// `xs[i] = e^(xs[i] - shift)`, and their sum (added in a fixed order: eight running sums).
pub(crate) fn exp_shifted_sum(xs: &mut [f32], shift: f32) -> f32 {
    exp_shifted(xs, shift);
    sum(xs)
}

/// `sqrt(2 / pi)` and the cubic coefficient of GELU's tanh approximation.
const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
const CUBIC: f32 = 0.044_715;

/// tanh through one exponential: 1 - 2 / (e^(2u) + 1); it saturates to ±1 without special
/// cases (e^(2u) is clamped to f32's range).
#[inline(always)]
fn tanh1(u: f32) -> f32 {
    1.0 - 2.0 / (exp1(2.0 * u) + 1.0)
}

multiversion! {
    /// GELU (tanh approximation) of each `x` into `y`.
    fn gelu(y: &mut [f32], x: &[f32]) -> () {
        for (y, &v) in y.iter_mut().zip(x) {
            let inner = SQRT_TWO_OVER_PI * v * (1.0 + CUBIC * v * v);
            *y = 0.5 * v * (1.0 + tanh1(inner));
        }
    }
}

multiversion! {
    /// GELU's gradient: `dx = g * gelu'(x)`.
    fn gelu_backward(dx: &mut [f32], x: &[f32], g: &[f32]) -> () {
        for ((d, &v), &g) in dx.iter_mut().zip(x).zip(g) {
            let t = tanh1(SQRT_TWO_OVER_PI * v * (1.0 + CUBIC * v * v));
            let d_inner = SQRT_TWO_OVER_PI * (1.0 + 3.0 * CUBIC * v * v);
            *d = g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * d_inner);
        }
    }
}

multiversion! {
    /// `y = silu(g) * u`, with `silu(x) = x / (1 + e^-x)`.
    fn swiglu(y: &mut [f32], g: &[f32], u: &[f32]) -> () {
        for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
            *y = g / (1.0 + exp1(-g)) * u;
        }
    }
}

multiversion! {
    /// `swiglu`'s gradients: `du = dy silu(g)`, `dg = dy u silu'(g)`, where
    /// `silu'(g) = s (1 + g (1 - s))` for `s = sigmoid(g)`.
    fn swiglu_backward(dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32], dy: &[f32]) -> () {
        for ((((dg, du), &g), &u), &dy) in dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(dy) {
            let s = 1.0 / (1.0 + exp1(-g));
            *du = dy * (g * s);
            *dg = dy * u * (s * (1.0 + g * (1.0 - s)));
        }
    }
}

multiversion! {
    /// `a . b` (eight running sums, added in a fixed order).
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        const LANES: usize = 8;
        let mut acc = [0f32; LANES];
        let (a8, b8) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
        for (x, y) in a8.zip(b8) {
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
        fold8(acc) + tail
    }
}

multiversion! {
    /// The sum of `(x - shift)²` over `xs` (eight running sums, added in a fixed order).
    fn centered_square_sum(xs: &[f32], shift: f32) -> f32 {
        sum8(xs, |x| (x - shift) * (x - shift))
    }
}

multiversion! {
    /// The sum of `a b (x - shift)` over the three slices (eight running sums, added in a
    /// fixed order): a norm's backward's row sum.
    fn centered_dot3(a: &[f32], b: &[f32], x: &[f32], shift: f32) -> f32 {
        const LANES: usize = 8;
        let mut acc = [0f32; LANES];
        let (a8, b8, x8) = (a.chunks_exact(LANES), b.chunks_exact(LANES), x.chunks_exact(LANES));
        let tail: f32 = a8
            .remainder()
            .iter()
            .zip(b8.remainder())
            .zip(x8.remainder())
            .map(|((a, b), x)| a * b * (x - shift))
            .sum();
        for ((a, b), x) in a8.zip(b8).zip(x8) {
            for l in 0..LANES {
                acc[l] += a[l] * b[l] * (x[l] - shift);
            }
        }
        fold8(acc) + tail
    }
}

multiversion! {
    /// A layer norm's row: `out = (x - mean) rstd w + b`.
    fn layer_norm_row(out: &mut [f32], x: &[f32], w: &[f32], b: &[f32], mean: f32, rstd: f32) -> () {
        for (((out, &x), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
            *out = (x - mean) * rstd * w + b;
        }
    }
}

multiversion! {
    /// A layer norm's row gradient, given the row's statistics: `dx` written, the weight's
    /// and the bias's gradients (`dw`, `db`) added to.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_row_grad(
        dx: &mut [f32],
        dw: &mut [f32],
        db: &mut [f32],
        x: &[f32],
        g: &[f32],
        w: &[f32],
        mean: f32,
        rstd: f32,
        mean_dxhat: f32,
        mean_dxhat_xhat: f32
    ) -> () {
        let rows = dx.iter_mut().zip(dw.iter_mut()).zip(db.iter_mut());
        for ((((dx, dw), db), &x), (&g, &w)) in rows.zip(x).zip(g.iter().zip(w)) {
            let xhat = (x - mean) * rstd;
            *dw += g * xhat;
            *db += g;
            *dx = rstd * (g * w - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
}

multiversion! {
    /// An RMS norm's row: `out = w (x r)`, normalised first, then scaled (Hugging Face's
    /// order of roundings).
    fn rms_norm_row(out: &mut [f32], x: &[f32], w: &[f32], r: f32) -> () {
        for ((out, &x), &w) in out.iter_mut().zip(x).zip(w) {
            *out = w * (x * r);
        }
    }
}

multiversion! {
    /// An RMS norm's row gradient, given `r` and `mean(g w x)`: `dx` written, the weight's
    /// gradient `dw` added to.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_row_grad(dx: &mut [f32], dw: &mut [f32], x: &[f32], g: &[f32], w: &[f32], r: f32, mean_gwx: f32) -> () {
        for (((dx, dw), &x), (&g, &w)) in dx.iter_mut().zip(dw.iter_mut()).zip(x).zip(g.iter().zip(w)) {
            *dw += g * x * r;
            *dx = r * (g * w - x * r * r * mean_gwx);
        }
    }
}

multiversion! {
    /// `sums[i] += row[i]`.
    fn add_into(sums: &mut [f32], row: &[f32]) -> () {
        for (s, &v) in sums.iter_mut().zip(row) {
            *s += v;
        }
    }
}

/// The sum of `xs` (eight running sums, added in a fixed order).
pub(crate) fn sum(xs: &[f32]) -> f32 {
    sum8(xs, |x| x)
}

/// The largest of `xs` (negative infinity for none).
pub(crate) fn max(xs: &[f32]) -> f32 {
    xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e^x rounded to f32 from f64's.
    fn libm_exp(x: f32) -> f32 {
        (x as f64).exp() as f32
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm_over_softmax_inputs() {
        let xs: Vec<f32> = (0..200_000)
            .map(|i| -87.0 + i as f32 * 87.0 / 200_000.0)
            .collect();
        let mut ys = xs.clone();
        exp_shifted(&mut ys, 0.0);
        for (x, y) in xs.iter().zip(&ys) {
            let exact = (*x as f64).exp();
            let rel = ((*y as f64 - exact) / exact).abs();
            assert!(
                rel < 2.5e-7,
                "exp({x}) = {y}, libm {exact}: relative error {rel}"
            );
        }
    }

    #[test]
    fn exp_is_right_over_the_whole_f32_range_with_nan_and_infinities() {
        let mut special = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -0.0,
            f32::MAX,
            f32::MIN,
        ];
        exp_shifted(&mut special, 0.0);
        assert_eq!(special[0], 0.0, "e^-inf");
        assert_eq!(special[1], f32::INFINITY, "e^inf");
        assert!(special[2].is_nan(), "NaN stays NaN");
        assert_eq!(special[3], 1.0);
        assert_eq!(special[4], f32::INFINITY, "e^MAX overflows");
        assert_eq!(special[5], 0.0, "e^MIN underflows");
        // Every 251st bit pattern: both signs, every exponent, subnormals, NaNs.
        let xs: Vec<f32> = (0..=u32::MAX).step_by(251).map(f32::from_bits).collect();
        let mut ys = xs.clone();
        exp_shifted(&mut ys, 0.0);
        let smallest = f32::from_bits(1);
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = libm_exp(x);
            if x.is_nan() {
                assert!(y.is_nan(), "exp({x}) = {y}");
            } else if want.is_infinite() || want == 0.0 {
                // At the edges of the range: at most one step from libm's rounding.
                let next = if want == 0.0 { smallest } else { f32::MAX };
                assert!(y == want || y == next, "exp({x}) = {y}, libm {want}");
            } else {
                // Two units in the last place of a normal result, or of the smallest
                // subnormal where the result is one.
                let err = (y as f64 - (x as f64).exp()).abs();
                let ulp = (want.abs() as f64 * f32::EPSILON as f64).max(smallest as f64);
                assert!(err <= 2.0 * ulp, "exp({x}) = {y}, libm {want}");
            }
        }
    }

    #[test]
    fn the_norm_rows_give_the_bits_of_their_element_formulas() {
        // The widest version this CPU runs, against each element's formula on the baseline.
        let row =
            |seed: f32| -> Vec<f32> { (0..203).map(|i| (i as f32 * 0.61 + seed).sin()).collect() };
        let (x, g, w, b) = (row(0.1), row(0.2), row(0.3), row(0.4));
        let (mean, rstd, m1, m2, r) = (0.03, 1.7, -0.2, 0.4, 0.9);
        let mut out = vec![0f32; x.len()];
        layer_norm_row(&mut out, &x, &w, &b, mean, rstd);
        for i in 0..x.len() {
            assert_eq!(out[i], (x[i] - mean) * rstd * w[i] + b[i]);
        }
        rms_norm_row(&mut out, &x, &w, r);
        for i in 0..x.len() {
            assert_eq!(out[i], w[i] * (x[i] * r));
        }
        let (mut dw, mut db) = (b.clone(), w.clone());
        layer_norm_row_grad(&mut out, &mut dw, &mut db, &x, &g, &w, mean, rstd, m1, m2);
        for i in 0..x.len() {
            let xhat = (x[i] - mean) * rstd;
            assert_eq!(dw[i], b[i] + g[i] * xhat);
            assert_eq!(db[i], w[i] + g[i]);
            assert_eq!(out[i], rstd * (g[i] * w[i] - m1 - xhat * m2));
        }
        let mut dw = b.clone();
        rms_norm_row_grad(&mut out, &mut dw, &x, &g, &w, r, m1);
        for i in 0..x.len() {
            assert_eq!(dw[i], b[i] + g[i] * x[i] * r);
            assert_eq!(out[i], r * (g[i] * w[i] - x[i] * r * r * m1));
        }
        let mut sums = b.clone();
        add_into(&mut sums, &x);
        for i in 0..x.len() {
            assert_eq!(sums[i], b[i] + x[i]);
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 30.0).collect();
        let mut fast = xs.clone();
        exp_shifted(&mut fast, 1.5);
        let plain: Vec<f32> = xs.iter().map(|&x| exp1(x - 1.5)).collect();
        assert_eq!(fast, plain);
        assert_eq!(sum_exp_shifted(&xs, 1.5), sum8(&xs, |x| exp1(x - 1.5)));
    }
}
