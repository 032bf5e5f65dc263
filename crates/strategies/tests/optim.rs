//! wick's optimizers against the torch update rules computed by hand in f64.

use candle_core::{Device, Tensor, Var};
use wick_core::{Algorithm, OptimizerConfig};
use wick_strategies::optim::Optimizer;

fn var(v: &[f32]) -> Var {
    Var::new(v, &Device::Cpu).unwrap()
}

fn close(got: &[f32], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "got {got:?}, want {want:?}");
    }
}

const P0: [f32; 3] = [1.0, -2.0, 0.5];
const GRADS: [[f32; 3]; 3] = [[0.5, 0.1, -0.3], [-0.2, 0.4, 0.0], [0.3, -0.1, 0.25]];

#[test]
fn adamw_matches_the_torch_rule() {
    let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.05);
    let p = var(&P0);
    let mut opt = Optimizer::new(&OptimizerConfig::from(Algorithm::AdamW {
        lr,
        beta1: b1,
        beta2: b2,
        eps,
        weight_decay: wd,
    }));
    let mut want: Vec<f64> = P0.iter().map(|&x| x as f64).collect();
    let (mut m, mut v) = (vec![0f64; 3], vec![0f64; 3]);
    for (t, g) in GRADS.iter().enumerate() {
        opt.step(
            std::slice::from_ref(&p),
            &[Tensor::new(g, &Device::Cpu).unwrap()],
        )
        .unwrap();
        let t = (t + 1) as i32;
        for i in 0..3 {
            let g = g[i] as f64;
            want[i] *= 1.0 - lr * wd;
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let mhat = m[i] / (1.0 - b1.powi(t));
            let vhat = v[i] / (1.0 - b2.powi(t));
            want[i] -= lr * mhat / (vhat.sqrt() + eps);
        }
        close(&p.to_vec1::<f32>().unwrap(), &want);
    }
    assert_eq!(opt.step_count(), 3);
    assert_eq!(opt.state_bytes(), 2 * 3 * 4);
}

fn sgd_reference(lr: f64, momentum: f64, nesterov: bool, wd: f64) {
    let p = var(&P0);
    let mut opt = Optimizer::new(&OptimizerConfig::from(Algorithm::Sgd {
        lr,
        momentum,
        nesterov,
        weight_decay: wd,
    }));
    let mut want: Vec<f64> = P0.iter().map(|&x| x as f64).collect();
    let mut buf: Option<Vec<f64>> = None;
    for g in GRADS.iter() {
        opt.step(
            std::slice::from_ref(&p),
            &[Tensor::new(g, &Device::Cpu).unwrap()],
        )
        .unwrap();
        let d: Vec<f64> = (0..3).map(|i| g[i] as f64 + wd * want[i]).collect();
        let b: Vec<f64> = match &buf {
            None => d.clone(),
            Some(b) => (0..3).map(|i| momentum * b[i] + d[i]).collect(),
        };
        let step: Vec<f64> = if nesterov {
            (0..3).map(|i| d[i] + momentum * b[i]).collect()
        } else {
            b.clone()
        };
        buf = Some(b);
        for i in 0..3 {
            want[i] -= lr * step[i];
        }
        close(&p.to_vec1::<f32>().unwrap(), &want);
    }
}

#[test]
fn sgd_with_momentum_matches_the_torch_rule() {
    sgd_reference(0.1, 0.9, false, 0.01);
}

#[test]
fn sgd_with_nesterov_matches_the_torch_rule() {
    sgd_reference(0.05, 0.8, true, 0.0);
}

#[test]
fn plain_sgd_keeps_no_state() {
    let p = var(&P0);
    let mut opt = Optimizer::new(&OptimizerConfig::sgd(0.5));
    opt.step(
        std::slice::from_ref(&p),
        &[Tensor::new(&GRADS[0], &Device::Cpu).unwrap()],
    )
    .unwrap();
    close(&p.to_vec1::<f32>().unwrap(), &[0.75, -2.05, 0.65]);
    assert_eq!(opt.state_bytes(), 0);
}

#[test]
fn mismatched_lists_are_an_error() {
    let mut opt = Optimizer::new(&OptimizerConfig::sgd(0.5));
    let e = opt.step(&[var(&P0)], &[]).unwrap_err().to_string();
    assert!(e.contains("1 parameters but 0 gradients"), "{e}");
}
